package message

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// compact reports whether b is JSON with no whitespace outside strings.
func compact(b []byte) bool {
	var out bytes.Buffer
	return json.Compact(&out, b) == nil && bytes.Equal(out.Bytes(), b)
}

func TestValidValue(t *testing.T) {
	for _, s := range []string{
		`null`, `true`, `false`, `0`, `-0`, `12.5e-3`, `1E+9`, `""`, `"a\"b\\c\/\b\f\n\r\t\u00e9\uD83D"`, `"你好"`,
		`{}`, `[]`, `{"a":1}`, `{"a":[1,2,{"b":null}],"c":"]}"}`, `[[[]]]`, `[1,"x",{},[]]`, "\"\xff\"",
	} {
		if n := validValue([]byte(s)); n != len(s) {
			t.Errorf("%s: %d, want %d", s, n, len(s))
		}
		if n := validValue([]byte(s + `,"next":1}`)); n != len(s) {
			t.Errorf("%s followed by more: %d, want %d", s, n, len(s))
		}
	}
	for _, s := range []string{
		``, `nul`, `tru`, `01`, `-`, `1.`, `.5`, `1e`, `+1`, `"abc`, "\"a\nb\"", `"\x"`, `"\u12"`, `"\u12g4"`,
		`{`, `[`, `{"a"}`, `{"a":}`, `{a:1}`, `{"a":1,}`, `[1,]`, `[1 2]`, `{"a":1]`, `[1}`, `{ "a":1}`, `[1, 2]`,
		strings.Repeat("[", maxDepth+1) + strings.Repeat("]", maxDepth+1),
	} {
		if n := validValue([]byte(s)); n == len(s) && n > 0 {
			t.Errorf("%q accepted", s)
		}
	}
	deep := strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth)
	if validValue([]byte(deep)) != len(deep) || !json.Valid([]byte(deep)) {
		t.Error("nesting at encoding/json's limit")
	}
}

// FuzzValidValue: of compact JSON, validValue accepts exactly what
// json.Valid accepts; nothing it accepts is invalid.
func FuzzValidValue(f *testing.F) {
	for _, s := range []string{`{"text":"hi"}`, `[1,{"a":null}]`, `"x"`, `-1.5e3`, `{"a":[}`, `tru`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		n := validValue(b)
		if n > len(b) || n == 0 {
			t.Fatalf("%q: length %d", b, n)
		}
		if n == len(b) && !json.Valid(b) {
			t.Fatalf("%q accepted, json.Valid refuses it", b)
		}
		if n > 0 && !json.Valid(b[:n]) {
			t.Fatalf("%q: prefix %q accepted, json.Valid refuses it", b, b[:n])
		}
		if json.Valid(b) && compact(b) && n != len(b) {
			t.Fatalf("%q: json.Valid accepts it, validValue gives %d", b, n)
		}
	})
}

// FuzzAppendRaw: a raw value is written exactly as json.Marshal writes a
// json.RawMessage, or refused as it refuses it.
func FuzzAppendRaw(f *testing.F) {
	for _, s := range []string{`{"text":"see you at 8"}`, `{"t":"你好"}`, "{\"t\":\"\u2028\"}", `{ "a" : 1 }`, `"<&>"`, `[1,2`, "\"\xff\""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		want, werr := json.Marshal(json.RawMessage(b))
		got, gerr := appendRaw([]byte("x"), b)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("%q: error %v, json.Marshal's %v", b, gerr, werr)
		}
		if werr == nil && string(got) != "x"+string(want) {
			t.Fatalf("%q: wrote %q, json.Marshal %q", b, got[1:], want)
		}
	})
}
