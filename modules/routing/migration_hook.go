//go:build imshard_testhooks

package routing

import "os"

// migrationPinnedFromEnv reads MigrationPinnedEnv (test builds only).
func migrationPinnedFromEnv() bool { return os.Getenv(MigrationPinnedEnv) == "1" }
