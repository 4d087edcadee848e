package archive

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/imshard/imshard/modules/routing"
)

// A record is a month-table row's driver values in column order
// (routing.LegacyColumns), each a kind byte and its value: no value, an
// integer (varint), text (its length and its bytes), a time (microseconds
// since the epoch, varint). The export encodes each row into a record as
// it is read, hashes the record (canonicalRecord) and sorts records; only
// the merge decodes them into Rows (rowDecoder).
const (
	kindNull byte = iota
	kindInt
	kindText
	kindTime
)

// recKey is where a record's sort key is: the topic's bytes (offsets into
// the record) and the seq.
type recKey struct {
	topicOff, topicLen int
	seq                int64
}

// topic is the record's topic, rec being the record key was made for.
func (k recKey) topic(rec []byte) []byte { return rec[k.topicOff : k.topicOff+k.topicLen] }

// appendRecord appends the record of vals to b; the key's offsets are
// from the record's start.
func appendRecord(b []byte, vals []any) ([]byte, recKey, error) {
	var key recKey
	start := len(b)
	if len(vals) != columns {
		return b, key, fmt.Errorf("archive: a row of %d columns, want %d", len(vals), columns)
	}
	for i, v := range vals {
		switch x := v.(type) {
		case nil:
			b = append(b, kindNull)
		case int64:
			b = binary.AppendVarint(append(b, kindInt), x)
			if i == 3 {
				key.seq = x
			}
		case []byte:
			b = appendText(b, &key, start, i, x)
		case string:
			b = appendText(b, &key, start, i, x)
		case time.Time:
			b = binary.AppendVarint(append(b, kindTime), x.UnixMicro())
		default:
			return b, key, fmt.Errorf("archive: column %d: %T cannot be sorted", i, v)
		}
	}
	return b, key, nil
}

// appendText appends column i's text, noting where it is when it is the
// topic.
func appendText[T []byte | string](b []byte, key *recKey, start, i int, x T) []byte {
	b = binary.AppendUvarint(append(b, kindText), uint64(len(x)))
	if i == 1 {
		key.topicOff, key.topicLen = len(b)-start, len(x)
	}
	return append(b, x...)
}

// fields reads a record's values one after the other, keeping the first
// error (after which every value reads as NULL).
type fields struct {
	rec []byte
	err error
}

// read decodes the next value: its kind, the integer (kindInt, or
// microseconds for kindTime) or the text (slicing the record).
func (f *fields) read() (kind byte, n int64, text []byte) {
	if f.err != nil {
		return kindNull, 0, nil
	}
	if len(f.rec) == 0 {
		f.err = errors.New("archive: record: it ends early")
		return kindNull, 0, nil
	}
	kind, rec := f.rec[0], f.rec[1:]
	switch kind {
	case kindNull:
	case kindInt, kindTime:
		x, k := binary.Varint(rec)
		if k <= 0 {
			f.err = errors.New("archive: record: a bad integer")
			return kindNull, 0, nil
		}
		n, rec = x, rec[k:]
	case kindText:
		l, k := binary.Uvarint(rec)
		if k <= 0 || uint64(len(rec)-k) < l {
			f.err = errors.New("archive: record: a bad text")
			return kindNull, 0, nil
		}
		text, rec = rec[k:k+int(l)], rec[k+int(l):]
	default:
		f.err = fmt.Errorf("archive: record: kind %d", kind)
		return kindNull, 0, nil
	}
	f.rec = rec
	return kind, n, text
}

// next is the next value, which must be of kind want or, optional, NULL
// (null reports which).
func (f *fields) next(want byte, optional bool) (n int64, text []byte, null bool) {
	kind, n, text := f.read()
	if kind != want && f.err == nil && (!optional || kind != kindNull) {
		f.err = fmt.Errorf("archive: record: kind %d where %d belongs", kind, want)
	}
	return n, text, kind != want
}

// end reports the first error, or that the record has more than its row.
func (f *fields) end() error {
	if f.err == nil && len(f.rec) != 0 {
		f.err = errors.New("archive: record: too long")
	}
	return f.err
}

func (f *fields) int() int64 {
	n, _, _ := f.next(kindInt, false)
	return n
}

func (f *fields) time() int64 {
	n, _, _ := f.next(kindTime, false)
	return n
}

func (f *fields) text() []byte {
	_, text, _ := f.next(kindText, false)
	return text
}

// recordKey is a record's sort key, its topic and seq (columns 1 and 3).
func recordKey(rec []byte) (topic []byte, seq int64, err error) {
	f := fields{rec: rec}
	f.int()
	topic = f.text()
	f.int()
	seq = f.int()
	return topic, seq, f.err
}

// canonicalRecord writes the record's row in routing.CanonicalRow's form
// (the same bytes as CanonicalRow of the driver values the record was made
// from, TestCanonicalRecord): the table, its archive and a restore hash
// alike.
func canonicalRecord(buf *bytes.Buffer, rec []byte) error {
	f := fields{rec: rec}
	for i := range columns {
		switch kind, n, text := f.read(); kind {
		case kindNull:
			routing.CanonicalNull(buf, i)
		case kindInt:
			routing.CanonicalInt(buf, i, n)
		case kindText:
			if err := routing.CanonicalText(buf, i, text); err != nil {
				return err
			}
		case kindTime:
			routing.CanonicalTime(buf, i, time.UnixMicro(n))
		}
	}
	return f.end()
}

// rowDecoder decodes records into Rows for the Parquet writer without an
// allocation per value: the texts that repeat (topic, msg_type, status,
// audit_status) come from a table of them (up to internMax), the optional
// texts are slices of one string holding the records given (records), and
// the optional values the Rows point to are kept in two slabs, reused
// (reset) once the Rows are written.
type rowDecoder struct {
	in   map[string]string
	buf  []byte // the records given
	text string // the same, as a string
	strs []string
	ints []int64
}

const internMax = 1 << 16

func newRowDecoder() *rowDecoder { return &rowDecoder{in: map[string]string{}} }

// records gives d the records rows are decoded from: the Rows decoded
// since hold on to the string made of them, not to buf.
func (d *rowDecoder) records(buf []byte) {
	d.buf, d.text = buf, string(buf)
}

// reset lets the slabs be reused: no Row decoded before is read again.
func (d *rowDecoder) reset() {
	clear(d.strs) // the texts are not kept past their Rows
	d.strs, d.ints, d.buf, d.text = d.strs[:0], d.ints[:0], nil, ""
}

// row is the Row of the record at buf[start:end] of the records given.
func (d *rowDecoder) row(start, end int) (Row, error) {
	f := fields{rec: d.buf[start:end]}
	r := Row{MessageID: f.int(), Topic: d.intern(f.text()), GroupID: f.int(), SeqID: f.int(), FromUser: f.int(),
		ClientMsgID: d.optText(&f, end), MsgType: d.intern(f.text()), Status: d.intern(f.text()), Content: d.optText(&f, end),
		Head: d.optText(&f, end), MentionedUserIDs: d.optText(&f, end), MentionAll: f.int(), ReplySeqID: d.optional(&f, kindInt),
		RootSeqID: d.optional(&f, kindInt), FileCount: f.int(), ContentSize: f.int(), HasRisk: f.int(),
		AuditStatus: d.intern(f.text()), Version: f.int(), RecalledAt: d.optional(&f, kindTime),
		RecalledBy: d.optional(&f, kindInt), DeletedAt: d.optional(&f, kindTime), ExpiresAt: d.optional(&f, kindTime),
		CreatedAt: f.time(), UpdatedAt: f.time()}
	return r, f.end()
}

// intern is the one string of b's text.
func (d *rowDecoder) intern(b []byte) string {
	if s, ok := d.in[string(b)]; ok {
		return s
	}
	s := string(b)
	if len(d.in) < internMax {
		d.in[s] = s
	}
	return s
}

// optText is the next value, a text or NULL, of the record f reads,
// which ends at end of the records given: its text is the same bytes of
// d.text.
func (d *rowDecoder) optText(f *fields, end int) *string {
	_, text, null := f.next(kindText, true)
	if null {
		return nil
	}
	at := end - len(f.rec) // where text ends: the record's rest follows it
	d.strs = append(d.strs, d.text[at-len(text):at])
	return &d.strs[len(d.strs)-1] // a slab grown leaves this one to the Rows
}

// optional is the next value, an integer (kind) or NULL, of the record f
// reads.
func (d *rowDecoder) optional(f *fields, kind byte) *int64 {
	n, _, null := f.next(kind, true)
	if null {
		return nil
	}
	d.ints = append(d.ints, n)
	return &d.ints[len(d.ints)-1]
}
