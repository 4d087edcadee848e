//go:build !imshard_testhooks

package testhook

// Broken is false in a shipped build: no breakage can be armed.
func Broken(string) bool { return false }

// Ack delivers at once in a shipped build: acks are never held back.
func Ack(deliver func()) { deliver() }

// CrashAfterAck does nothing in a shipped build: the failpoint cannot be armed.
func CrashAfterAck() {}

// CrashAfterRelay does nothing in a shipped build: the failpoint cannot be armed.
func CrashAfterRelay() {}

// CrashArchive does nothing in a shipped build: the failpoint cannot be armed.
func CrashArchive(string) {}

// CrashAfterJobBatch does nothing in a shipped build: the failpoint cannot be armed.
func CrashAfterJobBatch() {}

// CrashMove does nothing in a shipped build: the failpoint cannot be armed.
func CrashMove(string) {}
