package readpath

import "github.com/imshard/imshard/modules/message"

// Fixed tables of message changes: the changes module writes them, the
// reads (admin lookups, a stream's catch-up, a device sync) read them.
const (
	RevisionsTable    = "im_message_revisions"
	TopicChangesTable = "im_topic_changes"
)

// Changes is a topic's changes after a change_seq, oldest first, as the
// realtime channel announces them, and the topic's last change_seq.
type Changes struct {
	Changes []message.Change
	Last    int64
	// More is set when more than the limit asked for follow.
	More bool
}
