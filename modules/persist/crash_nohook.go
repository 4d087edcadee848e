//go:build !imshard_testhooks

package persist

// crashAfterFromEnv is 0 in a shipped build: the crash hook cannot be armed.
func crashAfterFromEnv() int64 { return 0 }
