package message

// maxDepth is encoding/json's nesting limit: deeper values are invalid.
const maxDepth = 10000

// validValue is the length of the compact JSON value b starts with (no
// whitespace outside strings), or -1 if it does not start with one. Of
// compact JSON it accepts exactly what json.Valid accepts (FuzzValidValue),
// in one pass and without allocating: a page reads two such values (content,
// head) for each of its messages.
func validValue(b []byte) int {
	var small [32]byte
	open := small[:0] // the containers open around i: '{' or '['
	i := 0
	for {
		// a value starts at i
		if i >= len(b) {
			return -1
		}
		switch c := b[i]; {
		case c == '{' || c == '[':
			if len(open) == maxDepth {
				return -1
			}
			open = append(open, c)
			i++
			if i < len(b) && b[i] == c+2 { // '{'+2 == '}', '['+2 == ']'
				open = open[:len(open)-1]
				i++
			} else if c == '{' {
				n := member(b[i:])
				if n < 0 {
					return -1
				}
				i += n
				continue
			} else {
				continue
			}
		case c == '"':
			n := validString(b[i:])
			if n < 0 {
				return -1
			}
			i += n
		case c == '-' || (c >= '0' && c <= '9'):
			n := validNumber(b[i:])
			if n < 0 {
				return -1
			}
			i += n
		case hasWord(b[i:], "true"):
			i += 4
		case hasWord(b[i:], "false"):
			i += 5
		case hasWord(b[i:], "null"):
			i += 4
		default:
			return -1
		}
		// a value ended at i: close what it ends, or go on to the next one
		for {
			if len(open) == 0 {
				return i
			}
			if i >= len(b) {
				return -1
			}
			top := open[len(open)-1]
			if b[i] == top+2 {
				open = open[:len(open)-1]
				i++
				continue
			}
			if b[i] != ',' {
				return -1
			}
			i++
			if top == '{' {
				n := member(b[i:])
				if n < 0 {
					return -1
				}
				i += n
			}
			break
		}
	}
}

// member is the length of an object member's `"key":` prefix, or -1.
func member(b []byte) int {
	n := validString(b)
	if n < 0 || n >= len(b) || b[n] != ':' {
		return -1
	}
	return n + 1
}

func hasWord(b []byte, w string) bool { return len(b) >= len(w) && string(b[:len(w)]) == w }

// validString is the length of the JSON string b starts with, or -1.
func validString(b []byte) int {
	if len(b) == 0 || b[0] != '"' {
		return -1
	}
	for i := 1; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return i + 1
		case c < 0x20:
			return -1
		case c == '\\':
			i++
			if i >= len(b) {
				return -1
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= len(b) {
					return -1
				}
				for _, h := range b[i+1 : i+5] {
					if !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
						return -1
					}
				}
				i += 4
			default:
				return -1
			}
		}
	}
	return -1
}

// validNumber is the length of the JSON number b starts with, or -1:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func validNumber(b []byte) int {
	i := 0
	if i < len(b) && b[i] == '-' {
		i++
	}
	digits := func() int {
		n := 0
		for i+n < len(b) && b[i+n] >= '0' && b[i+n] <= '9' {
			n++
		}
		return n
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	default:
		n := digits()
		if n == 0 {
			return -1
		}
		i += n
	}
	if i < len(b) && b[i] == '.' {
		i++
		n := digits()
		if n == 0 {
			return -1
		}
		i += n
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		n := digits()
		if n == 0 {
			return -1
		}
		i += n
	}
	return i
}
