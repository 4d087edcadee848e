package persist

import (
	"os"
	"sync/atomic"

	"github.com/imshard/imshard/modules/testhook"
)

// CrashAfterCommitEnv is a hook for the fault tests, honoured only by a
// binary built with the build tag imshard_testhooks (crash_hook.go; the test
// suite builds its binary so): with IMSHARD_TEST_CRASH_AFTER_COMMIT=N the
// persist process kills itself with SIGKILL right after its Nth batch
// transaction committed — after the DB commit, before the Redis follow-ups
// and the offset commit, the window a crash must not turn into a loss or a
// duplicate. A shipped binary (built without the tag) never reads it.
const CrashAfterCommitEnv = "IMSHARD_TEST_CRASH_AFTER_COMMIT"

var commitsSeen atomic.Int64

// committed is called after every batch commit; see CrashAfterCommitEnv.
func (s *Service) committed() {
	if s.crashAfter <= 0 || commitsSeen.Add(1) != s.crashAfter {
		return
	}
	if p, err := os.FindProcess(os.Getpid()); err == nil {
		_ = p.Kill()
	}
	select {} // the kill is asynchronous: nothing may run past the commit
}

// loseOne is the testhook.LoseAcked breakage: the batch without its first
// record, once per process and only in a batch of two or more (a batch must
// keep a row to insert); the caller still finishes every record, so the
// lost one's offset is committed as if it were stored, while its seq,
// never settled, stays in flight.
func loseOne(recs []*record) []*record {
	if len(recs) < 2 || !testhook.Broken(testhook.LoseAcked) {
		return recs
	}
	return recs[1:]
}
