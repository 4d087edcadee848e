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
// UTC with milliseconds, each value tagged by kind.
func CanonicalRow(buf *bytes.Buffer, vals []any) error {
	for i, v := range vals {
		if i > 0 {
			buf.WriteByte(0x1f)
		}
		switch x := v.(type) {
		case nil:
			buf.WriteString("\x00null")
		case int64:
			buf.Write(strconv.AppendInt(buf.AvailableBuffer(), x, 10))
		case []byte:
			if LegacyColumns[i].Type == "json" {
				if err := CanonicalJSON(buf, x); err != nil {
					return fmt.Errorf("column %s: %w", LegacyColumns[i].Name, err)
				}
				continue
			}
			buf.Write(x)
		case string:
			if LegacyColumns[i].Type == "json" {
				if err := CanonicalJSON(buf, []byte(x)); err != nil {
					return fmt.Errorf("column %s: %w", LegacyColumns[i].Name, err)
				}
				continue
			}
			buf.WriteString(x)
		case time.Time:
			buf.Write(x.UTC().AppendFormat(buf.AvailableBuffer(), "2006-01-02 15:04:05.000"))
		default:
			fmt.Fprintf(buf, "%v", x)
		}
	}
	return nil
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
