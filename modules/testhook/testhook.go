// Package testhook holds the switches the robustness and fault tests flip in
// a binary built with the build tag imshard_testhooks (the test suite builds
// its binary so). A shipped binary is built without the tag: every function
// here is then a constant (testhook_nohook.go), the environment is never
// read and no breakage can be armed.
package testhook

// BreakEnv names the deliberate breakages a test binary runs with, comma
// separated (IMSHARD_TEST_BREAK=drop-seq): each one breaks one invariant on
// purpose so the robustness suite can show that its checker notices.
const BreakEnv = "IMSHARD_TEST_BREAK"

// The breakages, each named after what it breaks.
const (
	// DropSeq: one since page, once per query process, leaves out its
	// first message — an acknowledged message a reader walks past.
	DropSeq = "drop-seq"
	// CASIgnore: an edit ignores expected_version, so two edits based on
	// one version both succeed.
	CASIgnore = "cas-ignore"
	// CursorEcho: a cursor move answers the seq it was asked for, even
	// below the cursor it kept.
	CursorEcho = "cursor-echo"
	// DupFrame: a stream socket sends every message frame twice.
	DupFrame = "dup-frame"
)

// AckDelayFileEnv names a file the send role reads on every Kafka ack: while
// it holds a duration ("1500ms"), each ack reaches the send handler that
// much later — acks slower than send.produce_timeout without a slow broker.
// The file is read each time so a test can start and lift the fault while
// the process runs.
const AckDelayFileEnv = "IMSHARD_TEST_ACK_DELAY_FILE"

// Break returns broken when the breakage name is armed, else right: the
// one-line call site of a breakage.
func Break[T any](name string, broken, right T) T {
	if Broken(name) {
		return broken
	}
	return right
}
