package message

import (
	"encoding/json"
	"strconv"
	"time"
)

// AppendJSON appends m exactly as encoding/json renders the struct by
// reflection (the API contract), without reflection: every page encodes 50 messages, and the
// reflective encoder calls five MarshalJSON methods per message and
// re-scans each result, which cost more CPU than the page's SQL.
func (m Message) AppendJSON(dst []byte) ([]byte, error) {
	if m.Encoded != nil {
		return append(dst, m.Encoded...), nil
	}
	dst = append(dst, `{"topic":`...)
	dst = appendString(dst, m.Topic)
	dst = append(dst, `,"seq":`...)
	dst = strconv.AppendInt(dst, m.Seq, 10)
	dst = appendID(append(dst, `,"message_id":`...), m.MessageID)
	dst = appendID(append(dst, `,"group_id":`...), m.GroupID)
	dst = appendID(append(dst, `,"from_user":`...), m.FromUser)
	dst = appendString(append(dst, `,"client_msg_id":`...), m.ClientMsgID)
	dst = appendString(append(dst, `,"msg_type":`...), m.MsgType)
	dst = appendString(append(dst, `,"status":`...), m.Status)
	var err error
	if dst, err = appendRaw(append(dst, `,"content":`...), m.Content); err != nil {
		return dst, err
	}
	if dst, err = appendRaw(append(dst, `,"head":`...), m.Head); err != nil {
		return dst, err
	}
	dst = appendIDs(append(dst, `,"mentioned_user_ids":`...), m.MentionedUserIDs)
	dst = strconv.AppendBool(append(dst, `,"mention_all":`...), m.MentionAll)
	dst = appendSeq(append(dst, `,"reply_seqid":`...), m.ReplySeqID)
	dst = appendSeq(append(dst, `,"root_seqid":`...), m.RootSeqID)
	dst = strconv.AppendInt(append(dst, `,"version":`...), int64(m.Version), 10)
	dst = appendTime(append(dst, `,"created_at":`...), m.CreatedAt)
	dst = appendTime(append(dst, `,"updated_at":`...), m.UpdatedAt)
	return append(dst, '}'), nil
}

// AppendJSON appends e exactly as json.Marshal renders the struct (the
// event contract), without reflection: the send path renders one event per
// send.
func (e *Event) AppendJSON(dst []byte) ([]byte, error) {
	dst = strconv.AppendInt(append(dst, `{"v":`...), int64(e.V), 10)
	dst = appendString(append(dst, `,"event_id":`...), e.EventID)
	dst = appendString(append(dst, `,"tenant":`...), e.Tenant)
	dst = appendString(append(dst, `,"topic":`...), e.Topic)
	dst = appendID(append(dst, `,"group_id":`...), e.GroupID)
	dst = strconv.AppendInt(append(dst, `,"seq_id":`...), e.SeqID, 10)
	dst = appendString(append(dst, `,"shard_month":`...), e.ShardMonth)
	dst = appendID(append(dst, `,"message_id":`...), e.MessageID)
	dst = appendID(append(dst, `,"from_user":`...), e.FromUser)
	dst = appendString(append(dst, `,"client_msg_id":`...), e.ClientMsgID)
	dst = appendString(append(dst, `,"msg_type":`...), e.MsgType)
	var err error
	if dst, err = appendRaw(append(dst, `,"content":`...), e.Content); err != nil {
		return dst, err
	}
	// omitempty: an empty head or mention list and a nil seq are left out
	if len(e.Head) > 0 {
		if dst, err = appendRaw(append(dst, `,"head":`...), e.Head); err != nil {
			return dst, err
		}
	}
	if len(e.MentionedUserIDs) > 0 {
		dst = appendIDs(append(dst, `,"mentioned_user_ids":`...), e.MentionedUserIDs)
	}
	dst = strconv.AppendBool(append(dst, `,"mention_all":`...), e.MentionAll)
	if e.ReplySeqID != nil {
		dst = appendSeq(append(dst, `,"reply_seqid":`...), e.ReplySeqID)
	}
	if e.RootSeqID != nil {
		dst = appendSeq(append(dst, `,"root_seqid":`...), e.RootSeqID)
	}
	dst = appendTime(append(dst, `,"created_at":`...), e.CreatedAt)
	return append(dst, '}'), nil
}

func appendIDs(dst []byte, ids IDs) []byte {
	if ids == nil {
		return append(dst, "null"...)
	}
	dst = append(dst, '[')
	for i, id := range ids {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendID(dst, id)
	}
	return append(dst, ']')
}

func appendID(dst []byte, id ID) []byte {
	return append(strconv.AppendInt(append(dst, '"'), int64(id), 10), '"')
}

func appendSeq(dst []byte, seq *int64) []byte {
	if seq == nil {
		return append(dst, "null"...)
	}
	return strconv.AppendInt(dst, *seq, 10)
}

// appendTime writes TimeFormat; years outside 0000–9999 go through
// AppendFormat.
func appendTime(dst []byte, t Time) []byte {
	u := t.UTC()
	y, mo, d := u.Date()
	if y < 0 || y > 9999 {
		return append(u.AppendFormat(append(dst, '"'), TimeFormat), '"')
	}
	h, mi, s := u.Clock()
	dst = append(dst, '"')
	dst = appendDigits(dst, y, 4)
	dst = appendDigits(append(dst, '-'), int(mo), 2)
	dst = appendDigits(append(dst, '-'), d, 2)
	dst = appendDigits(append(dst, 'T'), h, 2)
	dst = appendDigits(append(dst, ':'), mi, 2)
	dst = appendDigits(append(dst, ':'), s, 2)
	dst = appendDigits(append(dst, '.'), u.Nanosecond()/int(time.Millisecond), 3)
	return append(dst, 'Z', '"')
}

func appendDigits(dst []byte, n, width int) []byte {
	var b [4]byte
	for i := width - 1; i >= 0; i-- {
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return append(dst, b[:width]...)
}

// appendString writes plain ASCII strings (ids, topics, types: nearly
// all) directly and leaves everything needing an escape to encoding/json.
func appendString(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x80 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			b, _ := json.Marshal(s) // a string always encodes
			return append(dst, b...)
		}
	}
	return append(append(append(dst, '"'), s...), '"')
}

// appendRaw writes a JSON value as json.Marshal does a json.RawMessage:
// validated, compacted, with <, >, & and U+2028/9 escaped. A compact value
// without those (spaces inside strings and UTF-8 text are fine) is written
// as it is once validated.
func appendRaw(dst []byte, raw json.RawMessage) ([]byte, error) {
	if raw == nil {
		return append(dst, "null"...), nil
	}
	plain := true
	for _, c := range raw {
		// 0xE2 leads U+2028/9 (and other characters, which then take the slow path)
		if c == '<' || c == '>' || c == '&' || c == 0xE2 {
			plain = false
			break
		}
	}
	if plain && validValue(raw) == len(raw) {
		return append(dst, raw...), nil
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return dst, err
	}
	return append(dst, b...), nil
}
