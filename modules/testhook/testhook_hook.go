//go:build imshard_testhooks

package testhook

import (
	"os"
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
	// DropSeq drops once per process: dropping from every page would make
	// the breakage the whole history instead of one violation
	dropped atomic.Bool
)

// Broken reports whether the breakage name is armed (BreakEnv).
func Broken(name string) bool {
	if !armed()[name] {
		return false
	}
	if name == DropSeq {
		return dropped.CompareAndSwap(false, true)
	}
	return true
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
