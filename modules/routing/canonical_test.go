package routing

import (
	"bytes"
	"strings"
	"testing"
)

// TestCanonicalFast: the documents the fast path takes come out as the
// decoding path writes them; the ones it cannot prove equal are left to it.
func TestCanonicalFast(t *testing.T) {
	for in, want := range map[string]string{
		`{"text":"bench message 1"}`:                         `{"text":"bench message 1"}`,
		`{"text": "bench message 1"}`:                        `{"text":"bench message 1"}`,
		" {\n\t\"b\" : [1, 2] ,\"a\":{\"d\":1,\"c\":2}}\r\n": `{"a":{"c":2,"d":1},"b":[1,2]}`,
		`{}`: `{}`, `[ ]`: `[]`, `"x"`: `"x"`, `0`: `0`, `-1.5e+10`: `-1.5e+10`, `1E400`: `1E400`, `null`: `null`,
		`{"type":"text","text":"中文 ok","at":[true,false,null]}`: `{"at":[true,false,null],"text":"中文 ok","type":"text"}`,
		"\"\x7f\"": "\"\x7f\"",
	} {
		var b bytes.Buffer
		if !canonicalFast(&b, []byte(in)) || b.String() != want {
			t.Errorf("%q: %q, want %q", in, b.String(), want)
		}
	}
	for _, s := range []string{`{"a":1,"a":2}`, `{"b":1,"a":2,"b":3}`, `{"a":1}x`, `"a\"b"`, `"a\u0041"`,
		`"<"`, `"&"`, "\"\u2028\"", "\"\xff\"", "\"\x01\"", `01`, `1.`, `-`, `.5`, `1e`, `tru`, `[1,]`, `{"a"}`, `{"a":1,}`,
		strings.Repeat("[", 200) + strings.Repeat("]", 200), ``, ` `} {
		var b bytes.Buffer
		if canonicalFast(&b, []byte(s)) {
			t.Errorf("%q taken as %q", s, b.String())
		}
	}
}

// FuzzCanonicalFast: whatever the fast path takes, it writes as the
// decoding path does.
func FuzzCanonicalFast(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `{"c": [1, {"b":null,"a":2}], "a":"中"}`, `"x"`, `-0.5e-3`, `{"b":1,"a":2}`, `[true, false]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var fast, slow bytes.Buffer
		if !canonicalFast(&fast, raw) {
			return
		}
		if err := reencodeJSON(&slow, raw); err != nil || !bytes.Equal(fast.Bytes(), slow.Bytes()) {
			t.Fatalf("%q: the fast path writes %q, the decoding path %q (%v)", raw, fast.Bytes(), slow.Bytes(), err)
		}
	})
}
