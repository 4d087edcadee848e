package migrate

import (
	"bytes"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/routing"
)

func row(content string) []any {
	vals := make([]any, len(routing.LegacyColumns))
	vals[colMessageID], vals[colTopic], vals[colSeq] = int64(1), []byte("t"), int64(7)
	vals[8] = []byte(content)
	vals[colCreatedAt] = time.Date(2026, 1, 2, 3, 4, 5, 6_000_000, time.UTC)
	return vals
}

// TestCanonicalRowNormalisesJSON: the same document spelled as MariaDB
// keeps it (text as written) and as MySQL 8 prints it (keys sorted, a
// space after separators) hashes alike; another value does not.
func TestCanonicalRowNormalisesJSON(t *testing.T) {
	enc := func(vals []any) string {
		var b bytes.Buffer
		if err := CanonicalRow(&b, vals); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	a := enc(row(`{"text":"hi","n":1,"tags":["a","b"]}`))
	b := enc(row(`{"n": 1, "tags": ["a", "b"], "text": "hi"}`))
	if a != b {
		t.Fatalf("same document, different forms:\n%q\n%q", a, b)
	}
	if c := enc(row(`{"n": 2, "tags": ["a", "b"], "text": "hi"}`)); c == a {
		t.Fatal("a different value hashes alike")
	}
	if d := enc(row(`not json`)); d == a || !bytes.Contains([]byte(d), []byte("invalid")) {
		t.Fatalf("invalid JSON: %q", d)
	}
}

func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `[1,2,{"b":null}]`, `"x"`, `{`, `1e400`, `{"a":1,"a":2}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var once, twice bytes.Buffer
		if err := canonicalJSON(&once, raw); err != nil {
			return
		}
		if bytes.HasPrefix(once.Bytes(), []byte("\x00invalid:")) {
			return
		}
		// canonical form is a fixed point
		if err := canonicalJSON(&twice, once.Bytes()); err != nil || !bytes.Equal(once.Bytes(), twice.Bytes()) {
			t.Fatalf("not stable: %q → %q → %q (%v)", raw, once.Bytes(), twice.Bytes(), err)
		}
	})
}
