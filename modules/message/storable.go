package message

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// What the month table's JSON columns accept. Send refuses anything else
// with 400 before a seq exists, edit does the same, and persist checks it
// once more before an insert: a value that storage would refuse must never
// be acknowledged. The limits are those of the strictest server we run on.
const (
	// MaxNesting is the deepest nesting of objects and arrays a stored
	// value may have. The value itself is level 1 and each object or array
	// inside it one more; scalars add nothing: {"a":1} is 1, {"a":[1]} is 2,
	// {"a":[{}]} is 3. MariaDB 10.11's json_valid accepts 31 levels and
	// refuses 32 (MySQL 8 allows 100); TestStorableAgainstMariaDB checks
	// the boundary on the real server.
	MaxNesting = 31

	// MaxStoredBytes bounds content and head together, as the request
	// carries them, so that one event always fits in a Kafka record
	// (1 MB by default) and a batch of them in MySQL's max_allowed_packet.
	MaxStoredBytes = 512 << 10

	// MaxClientMsgID is the longest client_msg_id in bytes (the column is
	// VARCHAR(64) utf8mb4_bin; 64 bytes never exceed 64 characters).
	MaxClientMsgID = 64
)

// CheckClientMsgID reports why id cannot be a client_msg_id, or nil: it
// must hold 1–MaxClientMsgID bytes of UTF-8 with no white space at either
// end. The column's collation (utf8mb4_bin) is PAD SPACE in MariaDB:
// "pad-1" and "pad-1 " are one key there but two in Redis and Go, so a
// trailing space would let a retry pass for a new message that the
// database then refuses as a duplicate. Without white space at the ends
// every store compares ids the same way.
func CheckClientMsgID(id string) error {
	switch n := len(id); {
	case n == 0:
		return errors.New("client_msg_id is required")
	case n > MaxClientMsgID:
		return fmt.Errorf("client_msg_id exceeds %d bytes", MaxClientMsgID)
	case !utf8.ValidString(id):
		return errors.New("client_msg_id is not UTF-8")
	}
	first, _ := utf8.DecodeRuneInString(id)
	last, _ := utf8.DecodeLastRuneInString(id)
	if unicode.IsSpace(first) || unicode.IsSpace(last) {
		return errors.New("client_msg_id must not begin or end with white space")
	}
	return nil
}

// CheckStored reports why content and head (as a send or edit request
// carries them) cannot be stored, or nil: content must be a JSON object,
// head an object or absent (nil or null), both as CheckJSON demands with
// MaxNesting, together at most MaxStoredBytes. The error's text names the
// field and the rule, for the client.
func CheckStored(content, head []byte) error {
	if n := len(content) + len(head); n > MaxStoredBytes {
		return fmt.Errorf("content and head together hold %d bytes, at most %d are stored", n, MaxStoredBytes)
	}
	if !isObject(content) {
		return errors.New("content must be a JSON object")
	}
	if err := CheckJSON(content, MaxNesting); err != nil {
		return fmt.Errorf("content %w", err)
	}
	if IsNull(head) {
		return nil
	}
	if !isObject(head) {
		return errors.New("head must be a JSON object or null")
	}
	if err := CheckJSON(head, MaxNesting); err != nil {
		return fmt.Errorf("head %w", err)
	}
	return nil
}

// IsNull reports whether raw is absent or the JSON literal null.
func IsNull(raw []byte) bool {
	return raw == nil || string(bytes.TrimSpace(raw)) == "null"
}

// JSONColumn is raw as the value of a JSON column: NULL for an absent
// document or the literal null, so that a column never holds JSON null.
func JSONColumn(raw json.RawMessage) any {
	if raw == nil || string(raw) == "null" {
		return nil
	}
	return string(raw)
}

// isObject reports whether raw, JSON or not, starts as an object.
func isObject(raw []byte) bool {
	t := bytes.TrimLeft(raw, " \t\r\n")
	return len(t) > 0 && t[0] == '{'
}

// CheckJSON reports why b is not exactly one JSON value (RFC 8259, as
// encoding/json reads it) that the database stores unchanged, or nil. Beyond
// the grammar it refuses bytes that are not UTF-8, a \u escape of a UTF-16
// surrogate that is not part of a pair ("\ud800" alone: MariaDB refuses it,
// encoding/json would silently turn it into U+FFFD), an object repeating a
// key (compared after unescaping; parsers disagree on which one wins), and
// nesting deeper than maxNesting (counted as MaxNesting says; 0 = no
// limit). The error's text completes a sentence whose subject is the value
// ("content …", "body …").
func CheckJSON(b []byte, maxNesting int) error {
	// compact JSON (every event's content) is validated in one pass without
	// encoding/json's scanner; validValue accepts only what json.Valid does
	if validValue(b) != len(b) && !json.Valid(b) {
		return errors.New("is not valid JSON")
	}
	if !utf8.Valid(b) {
		return errors.New("holds bytes that are not UTF-8")
	}
	var (
		// the objects and arrays around i (on the stack unless deeper than 8)
		open      = make([]frame, 0, 8)
		expectKey bool // the next string is an object key
	)
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '{', '[':
			if maxNesting > 0 && len(open) == maxNesting {
				return fmt.Errorf("nests objects and arrays deeper than %d levels", maxNesting)
			}
			open = append(open, frame{object: b[i] == '{'})
			expectKey = b[i] == '{'
		case '}', ']':
			open = open[:len(open)-1]
			expectKey = false
		case ',':
			expectKey = open[len(open)-1].object
		case '"':
			n, escaped, err := scanString(b[i:])
			if err != nil {
				return err
			}
			if expectKey {
				key := b[i : i+n]
				if escaped {
					var s string
					_ = json.Unmarshal(key, &s) // valid: json.Valid and scanString passed
					key = []byte(s)
				} else {
					key = key[1 : len(key)-1]
				}
				if !open[len(open)-1].add(key) {
					return fmt.Errorf("repeats the key %q in one object", key)
				}
				expectKey = false
			}
			i += n - 1
		}
	}
	return nil
}

// frame is one open object or array; an object remembers its keys.
type frame struct {
	object bool
	keys   [][]byte
	set    map[string]struct{} // once keys grows past a linear search
}

// add records key; false if the object already holds it.
func (f *frame) add(key []byte) bool {
	if f.set != nil {
		if _, dup := f.set[string(key)]; dup {
			return false
		}
		f.set[string(key)] = struct{}{}
		return true
	}
	for _, k := range f.keys {
		if bytes.Equal(k, key) {
			return false
		}
	}
	if f.keys == nil {
		f.keys = make([][]byte, 0, 8) // most objects: one allocation
	}
	f.keys = append(f.keys, key)
	if len(f.keys) > 16 {
		f.set = make(map[string]struct{}, 2*len(f.keys))
		for _, k := range f.keys {
			f.set[string(k)] = struct{}{}
		}
		f.keys = nil
	}
	return true
}

// scanString is the length of the valid JSON string b starts with and
// whether it holds escapes; an error for a lone surrogate escape.
func scanString(b []byte) (n int, escaped bool, err error) {
	for i := 1; i < len(b); i++ {
		switch b[i] {
		case '"':
			return i + 1, escaped, nil
		case '\\':
			escaped = true
			if b[i+1] != 'u' {
				i++
				continue
			}
			r := hex4(b[i+2 : i+6])
			i += 5
			switch {
			case r >= 0xDC00 && r < 0xE000:
				return 0, false, fmt.Errorf("holds a lone UTF-16 surrogate escape (\\u%04x)", r)
			case r >= 0xD800 && r < 0xDC00:
				if i+6 >= len(b) || b[i+1] != '\\' || b[i+2] != 'u' {
					return 0, false, fmt.Errorf("holds a lone UTF-16 surrogate escape (\\u%04x)", r)
				}
				if lo := hex4(b[i+3 : i+7]); lo < 0xDC00 || lo >= 0xE000 {
					return 0, false, fmt.Errorf("holds a lone UTF-16 surrogate escape (\\u%04x)", r)
				}
				i += 6
			}
		}
	}
	return len(b), escaped, nil // not reached for valid JSON
}

// hex4 is the value of four hex digits (valid: json.Valid checked them).
func hex4(h []byte) rune {
	var r rune
	for _, c := range h {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		default:
			r = r<<4 | rune(c-'A'+10)
		}
	}
	return r
}
