package routing

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// Digest sums a set of rows of one topic: their count, seq range and the
// XOR of each row's SHA-256 over its canonical form (CanonicalRow). Order
// does not matter — (topic, seqid) is unique in a table, so no row cancels
// a copy of itself — so a table read in any order and its copy elsewhere
// (the legacy table, an archive) compare equal exactly when they hold the
// same rows with the same content.
type Digest struct {
	N      int64
	Lo, Hi int64
	Sum    [sha256.Size]byte
}

// Add folds in one row: its seq and the SHA-256 of its canonical form.
func (d *Digest) Add(seq int64, sum []byte) {
	if d.N == 0 || seq < d.Lo {
		d.Lo = seq
	}
	d.Hi = max(d.Hi, seq)
	d.N++
	for i := range d.Sum {
		d.Sum[i] ^= sum[i]
	}
}

// Hex is the digest's hash as text.
func (d Digest) Hex() string { return hex.EncodeToString(d.Sum[:]) }

// RowSum is the SHA-256 of the canonical form of one month-table row
// (LegacyColumns' values as the driver returns them), buf reused.
func RowSum(buf *bytes.Buffer, vals []any) ([]byte, error) {
	buf.Reset()
	if err := CanonicalRow(buf, vals); err != nil {
		return nil, err
	}
	sum := sha256.Sum256(buf.Bytes())
	return sum[:], nil
}

// CanonicalRow writes one row (the month table's columns, LegacyColumns'
// order, values as the driver returns them) in a form that does not depend
// on the server: JSON re-encoded with sorted keys and no spaces, times in
// UTC with milliseconds, each value tagged by kind. A row kept in another
// shape (an archive export's records) writes the same bytes column by
// column through CanonicalNull, CanonicalInt, CanonicalText and
// CanonicalTime.
func CanonicalRow(buf *bytes.Buffer, vals []any) error {
	for i, v := range vals {
		switch x := v.(type) {
		case nil:
			CanonicalNull(buf, i)
		case int64:
			CanonicalInt(buf, i, x)
		case []byte:
			if err := CanonicalText(buf, i, x); err != nil {
				return err
			}
		case string:
			if err := CanonicalText(buf, i, []byte(x)); err != nil {
				return err
			}
		case time.Time:
			CanonicalTime(buf, i, x)
		default:
			canonicalSep(buf, i)
			fmt.Fprintf(buf, "%v", x)
		}
	}
	return nil
}

// canonicalSep separates column col (not the first) from the one before.
func canonicalSep(buf *bytes.Buffer, col int) {
	if col > 0 {
		buf.WriteByte(0x1f)
	}
}

// CanonicalNull writes column col of CanonicalRow's form, NULL.
func CanonicalNull(buf *bytes.Buffer, col int) {
	canonicalSep(buf, col)
	buf.WriteString("\x00null")
}

// CanonicalInt writes column col of CanonicalRow's form, an integer.
func CanonicalInt(buf *bytes.Buffer, col int, x int64) {
	canonicalSep(buf, col)
	buf.Write(strconv.AppendInt(buf.AvailableBuffer(), x, 10))
}

// CanonicalText writes column col of CanonicalRow's form, text (a JSON
// column's in canonical JSON).
func CanonicalText(buf *bytes.Buffer, col int, x []byte) error {
	canonicalSep(buf, col)
	if col < len(LegacyColumns) && LegacyColumns[col].Type == "json" {
		if err := CanonicalJSON(buf, x); err != nil {
			return fmt.Errorf("column %s: %w", LegacyColumns[col].Name, err)
		}
		return nil
	}
	buf.Write(x)
	return nil
}

// CanonicalTime writes column col of CanonicalRow's form, a time.
func CanonicalTime(buf *bytes.Buffer, col int, t time.Time) {
	canonicalSep(buf, col)
	buf.Write(appendCanonicalTime(buf.AvailableBuffer(), t))
}

// canonicalTimeLayout is a time in CanonicalRow's form: UTC, milliseconds
// truncated.
const canonicalTimeLayout = "2006-01-02 15:04:05.000"

// appendCanonicalTime appends t.UTC().AppendFormat(canonicalTimeLayout)
// (TestCanonicalTime), spelling the digits itself for the years 0–9999:
// a table hash formats two or more times per row.
func appendCanonicalTime(b []byte, t time.Time) []byte {
	t = t.UTC()
	y, mo, d := t.Date()
	if y < 0 || y > 9999 {
		return t.AppendFormat(b, canonicalTimeLayout)
	}
	h, mi, s := t.Clock()
	ms := t.Nanosecond() / 1e6
	two := func(b []byte, n int) []byte { return append(b, byte('0'+n/10), byte('0'+n%10)) }
	b = two(two(b, y/100), y%100)
	b = two(append(b, '-'), int(mo))
	b = two(append(b, '-'), d)
	b = two(append(b, ' '), h)
	b = two(append(b, ':'), mi)
	b = two(append(b, ':'), s)
	return append(b, '.', byte('0'+ms/100), byte('0'+ms/10%10), byte('0'+ms%10))
}

// CanonicalJSON re-encodes a JSON document with sorted keys and no spaces
// (MariaDB keeps the text as sent, MySQL 8 its own binary form); text that
// is not JSON is kept, marked.
func CanonicalJSON(buf *bytes.Buffer, raw []byte) error {
	if n := buf.Len(); !canonicalFast(buf, raw) {
		buf.Truncate(n)
		return reencodeJSON(buf, raw)
	}
	return nil
}

// reencodeJSON is CanonicalJSON's decoding path.
func reencodeJSON(buf *bytes.Buffer, raw []byte) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		buf.WriteString("\x00invalid:")
		buf.Write(raw)
		return nil
	}
	out, err := json.Marshal(v)
	if err != nil {
		return err
	}
	buf.Write(out)
	return nil
}

// Merge folds in the rows another digest holds, as if each were added
// here (the fold does not depend on the rows' order).
func (d *Digest) Merge(o Digest) {
	if o.N == 0 {
		return
	}
	if d.N == 0 || o.Lo < d.Lo {
		d.Lo = o.Lo
	}
	d.Hi = max(d.Hi, o.Hi)
	d.N += o.N
	for i := range d.Sum {
		d.Sum[i] ^= o.Sum[i]
	}
}
