//go:build imshard_testhooks

package testhook

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

var (
	armed = sync.OnceValue(func() map[string]bool {
		out := map[string]bool{}
		for _, name := range strings.Split(os.Getenv(BreakEnv), ",") {
			if name = strings.TrimSpace(name); name != "" {
				out[name] = true
			}
		}
		return out
	})
	// DropSeq, LoseAcked and GapOfStored act once per process: dropping
	// from every page (losing every batch, a gap in every page) would make
	// the breakage the whole history instead of one violation
	once = map[string]*atomic.Bool{DropSeq: {}, LoseAcked: {}, GapOfStored: {}}
	// the acks seen, for CrashAfterAckEnv
	acks       atomic.Int64
	crashAtAck = sync.OnceValue(func() int64 {
		n, _ := strconv.ParseInt(os.Getenv(CrashAfterAckEnv), 10, 64)
		return n
	})
	// the purge and erase batches committed, for CrashAfterJobBatchEnv
	jobBatches      atomic.Int64
	crashAtJobBatch = sync.OnceValue(func() int64 {
		n, _ := strconv.ParseInt(os.Getenv(CrashAfterJobBatchEnv), 10, 64)
		return n
	})
	// the relayed batches seen, for CrashAfterRelayEnv
	relayed      atomic.Int64
	crashAtRelay = sync.OnceValue(func() int64 {
		n, _ := strconv.ParseInt(os.Getenv(CrashAfterRelayEnv), 10, 64)
		return n
	})
)

// Broken reports whether the breakage name is armed (BreakEnv).
func Broken(name string) bool {
	if !armed()[name] {
		return false
	}
	if first, ok := once[name]; ok {
		return first.CompareAndSwap(false, true)
	}
	return true
}

// CrashAfterAck is the send role's failpoint after a Kafka ack (CrashAfterAckEnv):
// at the armed ack the process kills itself and never returns.
func CrashAfterAck() { crashAt(&acks, crashAtAck()) }

// CrashAfterRelay is the relay role's failpoint after a batch of change
// events was acknowledged (CrashAfterRelayEnv): at the armed batch the
// process kills itself and never returns.
func CrashAfterRelay() { crashAt(&relayed, crashAtRelay()) }

// CrashAfterJobBatch is the jobs' failpoint after a batch committed
// (CrashAfterJobBatchEnv): at the armed batch the process kills itself
// and never returns.
func CrashAfterJobBatch() { crashAt(&jobBatches, crashAtJobBatch()) }

// CrashArchive is the archive's failpoint before it records step
// (CrashArchiveEnv): at the armed step the process kills itself and never
// returns.
func CrashArchive(step string) {
	if os.Getenv(CrashArchiveEnv) == step {
		var seen atomic.Int64
		crashAt(&seen, 1)
	}
}

// CrashMove is the tenant move's failpoint after step (CrashMoveEnv): at
// the armed step the process kills itself and never returns.
func CrashMove(step string) {
	if os.Getenv(CrashMoveEnv) == step {
		var seen atomic.Int64
		crashAt(&seen, 1)
	}
}

// crashAt counts one pass through a failpoint and, at the nth (n > 0),
// kills the process with SIGKILL.
func crashAt(seen *atomic.Int64, n int64) {
	if n <= 0 || seen.Add(1) != n {
		return
	}
	if p, err := os.FindProcess(os.Getpid()); err == nil {
		_ = p.Kill()
	}
	select {} // the kill is asynchronous: nothing may run past the failpoint
}

// Ack runs deliver, the ack of one send, after the delay AckDelayFileEnv's
// file asks for now, on its own timer so the producer's other promises are
// not held up.
func Ack(deliver func()) {
	if d := ackDelay(); d > 0 {
		time.AfterFunc(d, deliver)
		return
	}
	deliver()
}

func ackDelay() time.Duration {
	path := os.Getenv(AckDelayFileEnv)
	if path == "" {
		return 0
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	d, err := time.ParseDuration(strings.TrimSpace(string(b)))
	if err != nil || d < 0 {
		return 0
	}
	return d
}
