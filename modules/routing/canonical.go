package routing

import (
	"bytes"
	"slices"
	"unicode/utf8"
)

// canonicalFast writes raw's canonical form (what reencodeJSON writes:
// no white space, object members sorted by key) to buf without decoding
// the document into Go values, and reports whether it could: it takes
// only a subset whose output it can prove equal to the decoding path's
// (FuzzCanonicalFast) — one value with nothing but white space after it;
// strings with no escapes, no control characters, none of the characters
// encoding/json escapes (<, >, &, U+2028, U+2029) and valid UTF-8, so a
// key's bytes are the key; no key twice in an object; numbers as the JSON
// grammar spells them (json.Number keeps their text); nesting below a
// bound. On false, what it wrote is the caller's to discard.
func canonicalFast(buf *bytes.Buffer, raw []byte) bool {
	s := canonScan{b: raw, out: buf}
	if !s.value(0) {
		return false
	}
	s.space()
	return s.i == len(raw)
}

// canonDepth bounds the nesting canonicalFast follows (encoding/json
// refuses documents nested 10,000 deep: the decoding path decides those).
const canonDepth = 100

type canonScan struct {
	b   []byte
	i   int
	out *bytes.Buffer
}

func (s *canonScan) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// value writes the value at i (after white space), leaving i after it.
func (s *canonScan) value(depth int) bool {
	s.space()
	if s.i >= len(s.b) || depth > canonDepth {
		return false
	}
	start := s.i
	var ok bool
	switch c := s.b[s.i]; {
	case c == '{':
		return s.object(depth)
	case c == '[':
		return s.array(depth)
	case c == '"':
		_, ok = s.str()
	case c == '-' || (c >= '0' && c <= '9'):
		ok = s.number()
	default:
		ok = s.literal("true") || s.literal("false") || s.literal("null")
	}
	if ok {
		s.out.Write(s.b[start:s.i])
	}
	return ok
}

// member is one object member as written: its key and where its
// `"key":value` sits in the output.
type member struct {
	key        []byte
	start, end int
}

// open writes the container opening at i ('{' or '['); empty reports
// that it closed right after (close), written too.
func (s *canonScan) open(close byte) (empty bool) {
	s.out.WriteByte(s.b[s.i])
	s.i++
	s.space()
	if s.i < len(s.b) && s.b[s.i] == close {
		s.i++
		s.out.WriteByte(close)
		return true
	}
	return false
}

func (s *canonScan) object(depth int) bool {
	if s.open('}') {
		return true
	}
	var small [8]member // most objects' members, without an allocation
	members, sorted := small[:0], true
	for {
		s.space()
		start := s.out.Len()
		key, ok := s.str()
		if !ok {
			return false
		}
		if n := len(members); n > 0 {
			switch c := bytes.Compare(members[n-1].key, key); {
			case c == 0:
				return false
			case c > 0:
				sorted = false
			}
		}
		s.out.WriteByte('"')
		s.out.Write(key)
		s.out.WriteString(`":`)
		s.space()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return false
		}
		s.i++
		if !s.value(depth + 1) {
			return false
		}
		members = append(members, member{key: key, start: start, end: s.out.Len()})
		s.space()
		if s.i >= len(s.b) {
			return false
		}
		if s.b[s.i] == '}' {
			s.i++
			break
		}
		if s.b[s.i] != ',' {
			return false
		}
		s.i++
		s.out.WriteByte(',')
	}
	if !sorted {
		return s.reorder(members)
	}
	s.out.WriteByte('}')
	return true
}

// reorder rewrites the members just written in key order (a key that
// appears twice in an unsorted object is found here).
func (s *canonScan) reorder(members []member) bool {
	base := members[0].start
	written := slices.Clone(s.out.Bytes()[base:])
	slices.SortFunc(members, func(a, b member) int { return bytes.Compare(a.key, b.key) })
	s.out.Truncate(base)
	for k, m := range members {
		if k > 0 {
			if bytes.Equal(members[k-1].key, m.key) {
				return false
			}
			s.out.WriteByte(',')
		}
		s.out.Write(written[m.start-base : m.end-base])
	}
	s.out.WriteByte('}')
	return true
}

func (s *canonScan) array(depth int) bool {
	if s.open(']') {
		return true
	}
	for {
		if !s.value(depth + 1) {
			return false
		}
		s.space()
		if s.i >= len(s.b) {
			return false
		}
		switch s.b[s.i] {
		case ',':
			s.i++
			s.out.WriteByte(',')
		case ']':
			s.i++
			s.out.WriteByte(']')
			return true
		default:
			return false
		}
	}
}

// str scans a string that encoding/json writes back as it is, returning
// its bytes between the quotes.
func (s *canonScan) str() ([]byte, bool) {
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return nil, false
	}
	start := s.i + 1
	for i := start; i < len(s.b); {
		c := s.b[i]
		switch {
		case c == '"':
			s.i = i + 1
			return s.b[start:i], true
		case c < 0x20 || c == '\\' || c == '<' || c == '>' || c == '&':
			return nil, false
		case c < utf8.RuneSelf:
			i++
		default:
			r, n := utf8.DecodeRune(s.b[i:])
			if r == utf8.RuneError || r == '\u2028' || r == '\u2029' {
				return nil, false
			}
			i += n
		}
	}
	return nil, false
}

// number scans -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *canonScan) number() bool {
	if s.b[s.i] == '-' {
		s.i++
	}
	if s.i >= len(s.b) {
		return false
	}
	if s.b[s.i] == '0' {
		s.i++
	} else if !s.digits() {
		return false
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if !s.digits() {
			return false
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if !s.digits() {
			return false
		}
	}
	return true
}

// digits scans one or more decimal digits.
func (s *canonScan) digits() bool {
	start := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i > start
}

func (s *canonScan) literal(word string) bool {
	if !bytes.HasPrefix(s.b[s.i:], []byte(word)) {
		return false
	}
	s.i += len(word)
	return true
}
