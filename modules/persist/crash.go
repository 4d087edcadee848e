package persist

import (
	"os"
	"strconv"
	"sync/atomic"
)

// CrashAfterCommitEnv is a test-only hook for the fault tests: with
// IMSHARD_TEST_CRASH_AFTER_COMMIT=N the persist process kills itself with
// SIGKILL right after its Nth batch transaction committed — after the DB
// commit, before the Redis follow-ups and the offset commit, the window a
// crash must not turn into a loss or a duplicate. Unset (or not a positive
// number) it does nothing; production never sets it.
const CrashAfterCommitEnv = "IMSHARD_TEST_CRASH_AFTER_COMMIT"

func crashAfterFromEnv() int64 {
	n, err := strconv.ParseInt(os.Getenv(CrashAfterCommitEnv), 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return n
}

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
