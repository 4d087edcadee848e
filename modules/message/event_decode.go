package message

import (
	"encoding/json"
	"strings"
)

// DecodeEvent reads an event into e as json.Unmarshal does into a zero
// Event: the same fields, the same error or none. Events in the layout
// AppendJSON writes (every send's, and json.Marshal's: its fields in order,
// the empty optional ones left out, no whitespace) whose strings need no
// unescaping are read without reflection — persist decodes one per stored
// message, and encoding/json was most of its CPU beyond the insert; anything
// else — other layouts, escapes, non-ASCII strings, unknown fields — goes
// through encoding/json.
func DecodeEvent(b []byte, e *Event) error {
	if decodeEventCanonical(b, e) {
		return nil
	}
	*e = Event{}
	return json.Unmarshal(b, e)
}

// decodeEventCanonical fills e from an event in AppendJSON's layout; false
// (e half filled) for anything else. Content and head are read only as
// objects: a null or scalar, which the contract refuses anyway, is left to
// encoding/json.
func decodeEventCanonical(b []byte, e *Event) bool {
	c := canonical{b: b}
	e.V = int(c.int("v"))
	eventID := c.view("event_id")
	tenant := c.view("tenant")
	topic := c.view("topic")
	e.GroupID = c.id("group_id")
	e.SeqID = c.int("seq_id")
	month := c.view("shard_month")
	e.MessageID = c.id("message_id")
	e.FromUser = c.id("from_user")
	clientMsgID := c.view("client_msg_id")
	msgType := c.view("msg_type")
	content := c.object("content")
	var head []byte
	if c.next("head") {
		head = c.object("head")
	}
	e.MentionedUserIDs = nil
	if c.next("mentioned_user_ids") {
		if e.MentionedUserIDs = c.ids("mentioned_user_ids"); e.MentionedUserIDs == nil {
			c.bad = true // null: left to encoding/json
		}
	}
	e.MentionAll = c.boolean("mention_all")
	e.ReplySeqID, e.RootSeqID = nil, nil
	if c.next("reply_seqid") {
		e.ReplySeqID = c.seq("reply_seqid")
	}
	if c.next("root_seqid") {
		e.RootSeqID = c.seq("root_seqid")
	}
	e.CreatedAt = c.fastTime("created_at")
	if c.bad || string(c.b) != "}" {
		return false
	}
	// the six strings share one allocation, and content and head another:
	// they live as long as the event
	var sb strings.Builder
	sb.Grow(len(eventID) + len(tenant) + len(topic) + len(month) + len(clientMsgID) + len(msgType))
	for _, v := range [...][]byte{eventID, tenant, topic, month, clientMsgID, msgType} {
		sb.Write(v)
	}
	s := sb.String()
	cut := func(v []byte) string {
		out := s[:len(v)]
		s = s[len(v):]
		return out
	}
	e.EventID, e.Tenant, e.Topic, e.ShardMonth, e.ClientMsgID, e.MsgType =
		cut(eventID), cut(tenant), cut(topic), cut(month), cut(clientMsgID), cut(msgType)
	raw := make([]byte, 0, len(content)+len(head))
	raw = append(raw, content...)
	e.Content = raw[:len(content):len(content)]
	e.Head = nil
	if head != nil {
		e.Head = append(raw, head...)[len(content):]
	}
	return true
}

// next reports whether the next member is k (an optional one, present).
func (c *canonical) next(k string) bool {
	return !c.bad && len(c.b) >= len(k)+4 && c.b[0] == ',' && c.b[1] == '"' &&
		string(c.b[2:2+len(k)]) == k && c.b[2+len(k)] == '"' && c.b[3+len(k)] == ':'
}

// object is rawView for a value that must be a JSON object.
func (c *canonical) object(k string) []byte {
	v := c.rawView(k)
	if len(v) == 0 || v[0] != '{' {
		c.bad = true
		return nil
	}
	return v
}
