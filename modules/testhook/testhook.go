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
	// LoseAcked: persist leaves one acknowledged message out of a batch,
	// once per process, and commits its offset as if it were stored: its
	// seq stays in flight for ever and the topic's watermark stalls below
	// it — a message no reader ever gets, which only the settled state
	// can tell from a slow persist.
	LoseAcked = "lose-acked"
	// LeaveKeepsCache: a leave keeps the user's cached read-state entry,
	// so the removed member's list and badges go on showing the topic.
	LeaveKeepsCache = "leave-keeps-cache"
	// StaleVersion: a change puts the message back into the hot cache as
	// it was before the change (and publishes its old version), so a page
	// read after the change's answer serves the old version.
	StaleVersion = "stale-version"
	// UnreadPlusOne: a topic's unread count is answered one higher than
	// counted when it is not zero.
	UnreadPlusOne = "unread-plus-one"
	// GapOfStored: one since page, once per query process, also lists its
	// first message's seq in gaps — a stored message reported as a seq
	// that never holds one.
	GapOfStored = "gap-of-stored"
)

// CrashAfterAckEnv arms the send role's failpoint: with
// IMSHARD_TEST_CRASH_AFTER_ACK=N the process kills itself with SIGKILL right
// after its Nth Kafka ack of a send, before the post-ack step (idempotency
// record acked, seq marked acknowledged, hot cache, realtime publish) —
// the event is in Kafka and nothing else knows, the sender gets no answer.
// Read only by a test build, as BreakEnv.
const CrashAfterAckEnv = "IMSHARD_TEST_CRASH_AFTER_ACK"

// CrashAfterRelayEnv arms the relay role's failpoint: with
// IMSHARD_TEST_CRASH_AFTER_RELAY=N the process kills itself with SIGKILL
// right after the broker acknowledged its Nth batch of change events,
// before their outbox rows are deleted — the window in which a crash must
// turn into a re-send, never a loss. Read only by a test build, as BreakEnv.
const CrashAfterRelayEnv = "IMSHARD_TEST_CRASH_AFTER_RELAY"

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

// CrashArchiveEnv arms the archive's failpoints: with
// IMSHARD_TEST_CRASH_ARCHIVE=STEP the process kills itself with SIGKILL
// when a month's archive has done the work of STEP (prechecked, exported,
// verified, marked) and is about to record it — the step done, nothing
// knowing; the marked point is inside the mark's transaction, before its
// commit. Read only by a test build, as BreakEnv.
const CrashArchiveEnv = "IMSHARD_TEST_CRASH_ARCHIVE"

// CrashAfterJobBatchEnv arms the jobs' failpoint: with
// IMSHARD_TEST_CRASH_AFTER_JOB_BATCH=N the process kills itself with
// SIGKILL right after its Nth batch of a purge's or an erase's messages
// committed (with the job's progress) — a purge's before the topic's
// caches are told — and a runner that takes the job over must finish it
// from there. Read only by a test build, as BreakEnv.
const CrashAfterJobBatchEnv = "IMSHARD_TEST_CRASH_AFTER_JOB_BATCH"

// CrashMoveEnv arms the tenant move's failpoints: with
// IMSHARD_TEST_CRASH_MOVE=STEP the mover kills itself with SIGKILL when the
// switch has done STEP — placed: the placement record is on every
// placement server, the move's end not recorded yet (the source's row
// still says switch, the target's says the switch is half done). Read only
// by a test build, as BreakEnv.
const CrashMoveEnv = "IMSHARD_TEST_CRASH_MOVE"

// MovePlaced is the failpoint right after a switch wrote the placement
// record (CrashMoveEnv=placed).
const MovePlaced = "placed"
