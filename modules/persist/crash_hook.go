//go:build imshard_testhooks

package persist

import (
	"os"
	"strconv"
)

// crashAfterFromEnv reads CrashAfterCommitEnv (test builds only).
func crashAfterFromEnv() int64 {
	n, err := strconv.ParseInt(os.Getenv(CrashAfterCommitEnv), 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return n
}
