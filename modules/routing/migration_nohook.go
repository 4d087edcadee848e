//go:build !imshard_testhooks

package routing

// migrationPinnedFromEnv is false in a shipped build: the hook cannot be armed.
func migrationPinnedFromEnv() bool { return false }
