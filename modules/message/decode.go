package message

import (
	"bytes"
	"encoding/json"
	"strconv"
	"time"
)

// DecodeJSON reads a message as json.Unmarshal does. The hot cache holds
// members written by json.Marshal (AppendJSON's layout: every field, in
// order, no whitespace); those are read without reflection, a tenth of the
// CPU, and anything else — other layouts, escapes, unknown fields — goes
// through encoding/json.
func DecodeJSON(b []byte) (Message, error) {
	if m, ok := decodeCanonical(b); ok {
		return m, nil
	}
	var m Message
	err := json.Unmarshal(b, &m)
	return m, err
}

// canonical is a reader over the layout AppendJSON writes; any surprise
// sets bad and the caller falls back.
type canonical struct {
	b    []byte
	keys int
	bad  bool
}

func (c *canonical) key(k string) {
	sep := byte(',')
	if c.keys == 0 {
		sep = '{'
	}
	c.keys++
	if c.bad || len(c.b) < len(k)+4 || c.b[0] != sep || c.b[1] != '"' ||
		string(c.b[2:2+len(k)]) != k || c.b[2+len(k)] != '"' || c.b[3+len(k)] != ':' {
		c.bad = true
		return
	}
	c.b = c.b[4+len(k):]
}

// number parses a JSON integer strictly (no '+', no leading zeros).
func (c *canonical) number(t []byte) int64 {
	d := t
	if len(d) > 0 && d[0] == '-' {
		d = d[1:]
	}
	if len(d) == 0 || d[0] < '0' || d[0] > '9' || (d[0] == '0' && len(d) > 1) {
		c.bad = true
		return 0
	}
	n, err := strconv.ParseInt(string(t), 10, 64)
	c.bad = c.bad || err != nil
	return n
}

func (c *canonical) str(k string) string { return string(c.view(k)) }

// view is a string value without its quotes, not copied; escapes and
// non-ASCII bytes are encoding/json's business.
func (c *canonical) view(k string) []byte {
	c.key(k)
	if c.bad || len(c.b) == 0 || c.b[0] != '"' {
		c.bad = true
		return nil
	}
	end := bytes.IndexByte(c.b[1:], '"')
	if end < 0 {
		c.bad = true
		return nil
	}
	for _, ch := range c.b[1 : 1+end] {
		if ch < 0x20 || ch >= 0x80 || ch == '\\' {
			c.bad = true
			return nil
		}
	}
	v := c.b[1 : 1+end]
	c.b = c.b[2+end:]
	return v
}

// token is the bytes up to the next ',' or '}' (numbers, literals).
func (c *canonical) token(k string) []byte {
	c.key(k)
	if c.bad {
		return nil
	}
	end := bytes.IndexAny(c.b, ",}")
	if end <= 0 {
		c.bad = true
		return nil
	}
	t := c.b[:end]
	c.b = c.b[end:]
	return t
}

func (c *canonical) int(k string) int64 {
	t := c.token(k)
	if c.bad {
		return 0
	}
	return c.number(t)
}

func (c *canonical) id(k string) ID {
	v := c.view(k)
	if c.bad {
		return 0
	}
	return ID(c.number(v))
}

func (c *canonical) seq(k string) *int64 {
	n, ok := c.optInt(k)
	if !ok {
		return nil
	}
	return &n
}

// optInt is an integer or null (ok false).
func (c *canonical) optInt(k string) (int64, bool) {
	t := c.token(k)
	if c.bad || string(t) == "null" {
		return 0, false
	}
	return c.number(t), true
}

func (c *canonical) time(k string) Time {
	v := c.view(k)
	if t, ok := parseTime(v); ok {
		return t
	}
	t, err := time.Parse(time.RFC3339Nano, string(v))
	c.bad = c.bad || err != nil
	return NewTime(t)
}

// fastTime is a time in AppendJSON's own form only.
func (c *canonical) fastTime(k string) Time {
	t, ok := parseTime(c.view(k))
	c.bad = c.bad || !ok
	return t
}

// parseTime reads TimeFormat in UTC ("2006-01-02T15:04:05.000Z") only;
// ok false leaves the string to time.Parse.
func parseTime(s []byte) (Time, bool) {
	f, ok := timeFields(s)
	if !ok {
		return Time{}, false
	}
	return Time{time.Date(f[0], time.Month(f[1]), f[2], f[3], f[4], f[5], f[6]*int(time.Millisecond), time.UTC)}, true
}

// timeFields checks that s is a time in TimeFormat, UTC, that time.Parse
// accepts (no field out of range: no February 30, no second 60), and
// returns its year, month, day, hour, minute, second and millisecond.
func timeFields(s []byte) ([7]int, bool) {
	var f [7]int
	if len(s) != len("2006-01-02T15:04:05.000Z") || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' ||
		s[16] != ':' || s[19] != '.' || s[23] != 'Z' {
		return f, false
	}
	for i, span := range [7][2]int{{0, 4}, {5, 7}, {8, 10}, {11, 13}, {14, 16}, {17, 19}, {20, 23}} {
		for _, ch := range s[span[0]:span[1]] {
			if ch < '0' || ch > '9' {
				return f, false
			}
			f[i] = f[i]*10 + int(ch-'0')
		}
	}
	y, mo, d := f[0], f[1], f[2]
	if mo < 1 || mo > 12 || d < 1 || d > daysIn(y, mo) || f[3] > 23 || f[4] > 59 || f[5] > 59 {
		return f, false
	}
	return f, true
}

func daysIn(y, mo int) int {
	switch mo {
	case 2:
		if y%4 == 0 && (y%100 != 0 || y%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

// raw is one JSON value, found by tracking strings and nesting; it is
// validated as json.Unmarshal validates a json.RawMessage field.
func (c *canonical) raw(k string) json.RawMessage {
	v := c.rawView(k)
	if c.bad {
		return nil
	}
	return bytes.Clone(v)
}

// rawView is raw's value, not copied. Compact JSON is read by validValue;
// anything else (whitespace between tokens) is encoding/json's business.
func (c *canonical) rawView(k string) []byte {
	c.key(k)
	if c.bad {
		return nil
	}
	n := validValue(c.b)
	if n < 0 {
		c.bad = true
		return nil
	}
	v := c.b[:n]
	c.b = c.b[n:]
	return v
}

func (c *canonical) ids(k string) IDs {
	var out IDs
	if c.eachID(k, func(id ID) { out = append(out, id) }) && out == nil {
		out = IDs{}
	}
	return out
}

// eachID calls fn with each id of a list of quoted ids; false for null.
func (c *canonical) eachID(k string, fn func(ID)) bool {
	c.key(k)
	if c.bad {
		return false
	}
	if bytes.HasPrefix(c.b, []byte("null")) {
		c.b = c.b[4:]
		return false
	}
	if len(c.b) == 0 || c.b[0] != '[' {
		c.bad = true
		return false
	}
	end := bytes.IndexByte(c.b, ']')
	if end < 0 {
		c.bad = true
		return false
	}
	list := c.b[1:end]
	c.b = c.b[end+1:]
	for len(list) > 0 && !c.bad {
		item := list
		if i := bytes.IndexByte(list, ','); i >= 0 {
			item, list = list[:i], list[i+1:]
		} else {
			list = nil
		}
		if len(item) < 3 || item[0] != '"' || item[len(item)-1] != '"' {
			c.bad = true
			break
		}
		if id := ID(c.number(item[1 : len(item)-1])); fn != nil {
			fn(id)
		}
	}
	return true
}

func (c *canonical) boolean(k string) bool {
	switch string(c.token(k)) {
	case "true":
		return true
	case "false":
		return false
	}
	c.bad = true
	return false
}

func decodeCanonical(b []byte) (Message, bool) {
	c := canonical{b: b}
	var m Message
	m.Topic = c.str("topic")
	m.Seq = c.int("seq")
	m.MessageID = c.id("message_id")
	m.GroupID = c.id("group_id")
	m.FromUser = c.id("from_user")
	m.ClientMsgID = c.str("client_msg_id")
	m.MsgType = c.str("msg_type")
	m.Status = c.str("status")
	m.Content = c.raw("content")
	m.Head = c.raw("head")
	m.MentionedUserIDs = c.ids("mentioned_user_ids")
	m.MentionAll = c.boolean("mention_all")
	m.ReplySeqID = c.seq("reply_seqid")
	m.RootSeqID = c.seq("root_seqid")
	m.Version = int(c.int("version"))
	m.CreatedAt = c.time("created_at")
	m.UpdatedAt = c.time("updated_at")
	return m, !c.bad && string(c.b) == "}"
}

// Peeked is what Peek reads of a hot-cache member, a type of its own so
// that nothing reads a field Peek leaves undecoded: what a page needs —
// seq, version, updated_at — and what an unread count needs — from_user
// and the mentions — with the member itself, the message's whole
// rendering.
type Peeked struct {
	Seq              int64
	FromUser         ID
	MentionedUserIDs IDs
	MentionAll       bool
	Version          int
	UpdatedAt        Time
	Encoded          []byte // the member as it stands
}

// Message is p as a page's message: a normal message rendered by Encoded,
// with only the fields p holds set (see Message.Encoded).
func (p Peeked) Message() Message {
	return Message{Seq: p.Seq, FromUser: p.FromUser, MentionedUserIDs: p.MentionedUserIDs, MentionAll: p.MentionAll,
		Version: p.Version, UpdatedAt: p.UpdatedAt, Status: StatusNormal, Encoded: p.Encoded}
}

// Peek reads a hot-cache member's Peeked fields without decoding the rest.
// It succeeds only for a member in AppendJSON's layout of a normalized
// message with status normal, whose rendering is then the member as it
// stands; anything else (tombstones, other layouts, null mentions) is for
// DecodeJSON. Nested values are still validated: a page never carries
// broken JSON.
func Peek(b []byte) (Peeked, bool) {
	c := canonical{b: b}
	var m Peeked
	c.view("topic")
	m.Seq = c.int("seq")
	c.id("message_id")
	c.id("group_id")
	m.FromUser = c.id("from_user")
	c.view("client_msg_id")
	c.view("msg_type")
	if string(c.view("status")) != StatusNormal {
		return Peeked{}, false
	}
	c.rawView("content")
	c.rawView("head")
	if !c.eachID("mentioned_user_ids", func(id ID) { m.MentionedUserIDs = append(m.MentionedUserIDs, id) }) {
		return Peeked{}, false // null renders as [] once normalized
	}
	m.MentionAll = c.boolean("mention_all")
	c.optInt("reply_seqid")
	c.optInt("root_seqid")
	m.Version = int(c.int("version"))
	if _, ok := timeFields(c.view("created_at")); !ok {
		c.bad = true // a page needs created_at valid, not parsed
	}
	m.UpdatedAt = c.fastTime("updated_at")
	if c.bad || string(c.b) != "}" {
		return Peeked{}, false
	}
	m.Encoded = b
	return m, true
}
