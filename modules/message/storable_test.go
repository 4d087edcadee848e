package message

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/testenv"
)

func nest(n int, open, inner, close string) string {
	return strings.Repeat(open, n-1) + inner + strings.Repeat(close, n-1)
}

// storableCases are values CheckJSON accepts (ok) or refuses with a reason
// containing refusal; they seed FuzzCheckJSON and are checked against the
// real MariaDB by TestStorableAgainstMariaDB.
var storableCases = []struct {
	value   string
	refusal string // "" = accepted
	// mariadb: the server refuses it too (for a refusal that is the
	// server's own rule rather than ours)
	mariadb bool
}{
	{`{"text":"hi"}`, "", false},
	{`{"text":"你好 😀","n":-0.5e-3,"b":[true,false,null],"o":{}}`, "", false},
	{`{"t":"\ud83d\ude00 \uDBFF\uDFFF \u00e9 \u0000 \"\\\/\b\f\n\r\t"}`, "", false},
	{"{\"t\":\"\u2028\u2029\ufeff\uffff\"}", "", false},
	{`{"<a>":"&amp;","":1}`, "", false},
	{` { "a" : [ 1 , 2 ] } `, "", false},
	{`{"big":123456789012345678901234567890,"tiny":1e-400,"huge":1e400}`, "", false},
	{`{"a":1,"b":{"a":2},"c":[{"a":3},{"a":4}]}`, "", false},
	{`{"a":"x","a\u0000":"y","A":"z"}`, "", false},
	{nest(MaxNesting, `{"a":`, `{}`, `}`), "", false},
	{nest(MaxNesting, `[`, `[1]`, `]`), "", false},
	{`{"a":` + nest(MaxNesting-1, `[`, `[]`, `]`) + `}`, "", false},

	{nest(MaxNesting+1, `{"a":`, `{}`, `}`), "deeper than 31", true},
	{nest(MaxNesting+1, `[`, `[1]`, `]`), "deeper than 31", true},
	{`{"a":` + nest(MaxNesting, `[`, `[]`, `]`) + `}`, "deeper than 31", true},
	{nest(40, `{"a":`, `{}`, `}`), "deeper than 31", true},
	{`{"t":"\ud800"}`, "lone UTF-16 surrogate", true},
	{`{"t":"\udc00"}`, "lone UTF-16 surrogate", true},
	{`{"t":"\uD800\u0041"}`, "lone UTF-16 surrogate", true},
	{`{"t":"\ud800\ud800"}`, "lone UTF-16 surrogate", true},
	{`{"t":"\udc00\ud800"}`, "lone UTF-16 surrogate", true},
	{`{"t":"\ud83d\ude00\ud83d"}`, "lone UTF-16 surrogate", true},
	{`{"\ud800":1}`, "lone UTF-16 surrogate", true},
	{"{\"t\":\"\xff\xfe\"}", "not UTF-8", true},
	{"{\"t\":\"\xed\xa0\x80\"}", "not UTF-8", false}, // a surrogate encoded as UTF-8: MariaDB keeps it, no JSON reader of ours could
	{"{\"t\":\"\xc3\"}", "not UTF-8", true},
	{"{\"t\":\"a\tb\"}", "not valid JSON", true},
	{`{"a":1,"a":2}`, "repeats the key", false},
	{`{"a":1,"\u0061":2}`, "repeats the key", false},
	{`{"o":{"k":[{"x":1,"y":2,"x":3}]}}`, "repeats the key", false},
	{`{"a":1}{}`, "not valid JSON", true},
	{`{"a":}`, "not valid JSON", true},
	{``, "not valid JSON", true},
}

func TestCheckJSON(t *testing.T) {
	for _, tc := range storableCases {
		err := CheckJSON([]byte(tc.value), MaxNesting)
		if tc.refusal == "" && err != nil || tc.refusal != "" && (err == nil || !strings.Contains(err.Error(), tc.refusal)) {
			t.Errorf("CheckJSON(%.60q) = %v, want %q", tc.value, err, tc.refusal)
		}
	}
	// the key set of a large object switches to a map and still finds repeats
	var big strings.Builder
	big.WriteString(`{`)
	for i := range 40 {
		big.WriteString(`"k` + strings.Repeat("x", i) + `":1,`)
	}
	if err := CheckJSON([]byte(big.String()+`"z":1}`), MaxNesting); err != nil {
		t.Errorf("40 distinct keys: %v", err)
	}
	if err := CheckJSON([]byte(big.String()+`"kxxx":2}`), MaxNesting); err == nil || !strings.Contains(err.Error(), `"kxxx"`) {
		t.Errorf("a repeat among 40 keys: %v", err)
	}
	if err := CheckJSON([]byte(nest(100, `[`, `[]`, `]`)), 0); err != nil {
		t.Errorf("no nesting limit: %v", err)
	}
}

func TestCheckStored(t *testing.T) {
	obj := []byte(`{"text":"hi"}`)
	for _, tc := range []struct {
		name          string
		content, head []byte
		refusal       string
	}{
		{"content only", obj, nil, ""},
		{"null head", obj, []byte(`null`), ""},
		{"object head", obj, []byte(`{"quote":1}`), ""},
		{"content missing", nil, nil, "content must be a JSON object"},
		{"content an array", []byte(`[1]`), nil, "content must be a JSON object"},
		{"head a string", obj, []byte(`"x"`), "head must be a JSON object or null"},
		{"deep content", []byte(nest(32, `{"a":`, `{}`, `}`)), nil, "content nests objects and arrays deeper than 31 levels"},
		{"bad head", obj, []byte(`{"a":"\udfff"}`), "head holds a lone UTF-16 surrogate escape (\\udfff)"},
		{"at the size limit", []byte(`{"t":"` + strings.Repeat("x", MaxStoredBytes-8-6-len(`{"t":""}`)) + `"}`), []byte(`{"a":1}`), ""},
		{"over the size limit", []byte(`{"t":"` + strings.Repeat("x", MaxStoredBytes) + `"}`), nil, "at most 524288 are stored"},
	} {
		err := CheckStored(tc.content, tc.head)
		if tc.refusal == "" && err != nil || tc.refusal != "" && (err == nil || err.Error() != tc.refusal && !strings.Contains(err.Error(), tc.refusal)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.refusal)
		}
	}
}

// refDepth and refDuplicate are CheckJSON's rules computed another way:
// through encoding/json's tokenizer.
func refDepth(b []byte) (depth int, dupKey bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber() // a number beyond float64 (1e700) is valid JSON, not the end of the walk
	type level struct {
		object bool
		keys   map[string]bool
		key    bool // the next token of this object is a key
	}
	var open []*level
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) || err != nil {
			return depth, dupKey
		}
		if len(open) > 0 && open[len(open)-1].object && open[len(open)-1].key {
			if d, ok := tok.(json.Delim); !ok || d != '}' {
				k := tok.(string)
				if open[len(open)-1].keys[k] && !strings.ContainsRune(k, utf8.RuneError) {
					dupKey = true
				}
				open[len(open)-1].keys[k] = true
				open[len(open)-1].key = false
				continue
			}
		}
		if len(open) > 0 && open[len(open)-1].object {
			open[len(open)-1].key = true
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			open = append(open, &level{object: tok == json.Delim('{'), keys: map[string]bool{}, key: tok == json.Delim('{')})
			depth = max(depth, len(open))
		case json.Delim('}'), json.Delim(']'):
			open = open[:len(open)-1]
		}
	}
}

// FuzzCheckJSON: what CheckJSON accepts is valid UTF-8 JSON within the
// nesting limit without a repeated key, and stays acceptable in the form it
// is stored in (json.Marshal's compact, HTML-escaped rendering); what it
// refuses for nesting or a repeated key really is so.
func FuzzCheckJSON(f *testing.F) {
	for _, tc := range storableCases {
		f.Add([]byte(tc.value))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		err := CheckJSON(b, 4)
		if !json.Valid(b) {
			if err == nil {
				t.Fatalf("%q accepted, json.Valid refuses it", b)
			}
			return
		}
		depth, dup := refDepth(b)
		if err == nil {
			if !utf8.Valid(b) || depth > 4 || dup {
				t.Fatalf("%q accepted: utf8 %v, depth %d, repeated key %v", b, utf8.Valid(b), depth, dup)
			}
			stored, merr := json.Marshal(json.RawMessage(b))
			if merr != nil {
				t.Fatalf("%q: json.Marshal: %v", b, merr)
			}
			if err := CheckJSON(stored, 4); err != nil {
				t.Fatalf("%q accepted, its stored form %q refused: %v", b, stored, err)
			}
			return
		}
		switch msg := err.Error(); {
		case strings.Contains(msg, "deeper"):
			if depth <= 4 {
				t.Fatalf("%q refused for depth %d", b, depth)
			}
		case strings.Contains(msg, "repeats"):
			if !dup && !bytes.ContainsRune(b, utf8.RuneError) && !bytes.Contains(b, []byte(`\u`)) {
				t.Fatalf("%q refused for a repeated key: %v", b, err)
			}
		case strings.Contains(msg, "UTF-8"):
			if utf8.Valid(b) {
				t.Fatalf("%q refused as not UTF-8", b)
			}
		case strings.Contains(msg, "surrogate"):
			if !bytes.Contains(b, []byte(`\u`)) {
				t.Fatalf("%q refused for a surrogate escape it does not hold", b)
			}
		default:
			t.Fatalf("%q: unexpected refusal %v", b, err)
		}
	})
}

// TestStorableAgainstMariaDB checks CheckJSON against the real server, in a
// real month table: every accepted value (and its stored form) is taken by
// the JSON columns and read back byte-identical; every value refused for a
// rule of the server's (nesting, surrogates, UTF-8, grammar) is refused by
// the server too, so the limits are the server's, not guesses. Repeated
// keys are our own stricter rule (MariaDB keeps both).
func TestStorableAgainstMariaDB(t *testing.T) {
	tenant := testenv.NewTenant(t)
	admin := testenv.MySQL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE `"+testenv.TenantDBPrefix+tenant+"`"); err != nil {
		t.Fatal(err)
	}
	db := testenv.OpenDB(t, strings.Replace(testenv.DSNTemplate(), "{tenant}", tenant, 1))
	table, err := routing.TableFor(routing.MonthOf(time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, table.CreateDDL()); err != nil {
		t.Fatal(err)
	}
	var version string
	if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
		t.Fatal(err)
	}
	t.Logf("server %s", version)
	id := int64(0)
	// store writes v into the content and head columns of a new row and
	// reads them back; err is the server's refusal
	store := func(v []byte) ([]byte, error) {
		id++
		now := time.Now().UTC()
		_, err := db.ExecContext(ctx, "INSERT INTO "+table.Quoted()+
			" (message_id, topic, group_id, seqid, from_user, client_msg_id, content, head, created_at, updated_at)"+
			" VALUES (?, 't', 1, ?, 1, ?, ?, ?, ?, ?)", id, id, fmt.Sprint("c", id), v, v, now, now)
		if err != nil {
			return nil, err
		}
		var content, head []byte
		var valid bool
		if err := db.QueryRowContext(ctx, "SELECT content, head, JSON_VALID(content) FROM "+table.Quoted()+" WHERE message_id = ?", id).
			Scan(&content, &head, &valid); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(content, head) || !valid {
			t.Fatalf("%.60q: content %q, head %q, valid %v", v, content, head, valid)
		}
		return content, nil
	}
	// generated values: CheckJSON's verdict decides what the server must do
	// (a repeated key is our own rule: the server's answer proves nothing)
	cases := storableCases
	rnd := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		v := randomJSON(rnd, 0)
		if i%10 == 0 {
			// around the nesting limit
			for range rnd.IntN(8) + MaxNesting - 5 {
				v = `{"n":[` + v + `]}`
			}
			v = v[len(`{"n":[`) : len(v)-len(`]}`)]
		}
		refusal := ""
		if err := CheckJSON([]byte(v), MaxNesting); err != nil {
			refusal = err.Error()
		}
		cases = append(cases, struct {
			value   string
			refusal string
			mariadb bool
		}{v, refusal, refusal != "" && !strings.Contains(refusal, "repeats")})
	}
	verdicts := map[string]int{}
	for _, tc := range cases {
		reason, _, _ := strings.Cut(tc.refusal, " (")
		verdicts[reason]++
	}
	t.Logf("verdicts (\"\" = accepted): %v", verdicts)
	for _, tc := range cases {
		v := []byte(tc.value)
		var serverValid sql.NullBool
		if err := db.QueryRowContext(ctx, "SELECT JSON_VALID(?)", v).Scan(&serverValid); err != nil {
			t.Fatal(err)
		}
		if tc.refusal != "" {
			if tc.mariadb && serverValid.Bool {
				t.Errorf("%.60q: refused (%s), MariaDB's JSON_VALID accepts it", v, tc.refusal)
			}
			if _, err := store(v); tc.mariadb && err == nil {
				t.Errorf("%.60q: refused (%s), MariaDB stored it", v, tc.refusal)
			}
			continue
		}
		if !serverValid.Bool {
			t.Errorf("%.60q: accepted, MariaDB's JSON_VALID refuses it", v)
		}
		canonical, err := json.Marshal(json.RawMessage(v))
		if err != nil {
			t.Fatal(err)
		}
		for _, form := range [][]byte{v, canonical} {
			got, err := store(form)
			if err != nil {
				t.Errorf("%.60q: accepted, MariaDB refused it: %v", form, err)
			} else if !bytes.Equal(got, form) {
				t.Errorf("%.60q read back as %.60q", form, got)
			}
		}
	}
}

// randomJSON is a JSON-like object nested up to 34 levels, with strings of
// every kind of character and escape — lone surrogates and bytes that are
// not UTF-8 now and then — numbers of every form and, rarely, a repeated key.
func randomJSON(r *rand.Rand, depth int) string {
	var b strings.Builder
	b.WriteString("{")
	n := r.IntN(4)
	if depth < 34 && r.IntN(3) > 0 {
		n = max(n, 1)
	}
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		key := randomString(r)
		if i > 0 && r.IntN(40) == 0 {
			key = `"k0"`
		} else if i == 0 && r.IntN(2) == 0 {
			key = `"k0"`
		}
		b.WriteString(key + ":" + randomValue(r, depth+1))
	}
	b.WriteString("}")
	return b.String()
}

func randomValue(r *rand.Rand, depth int) string {
	switch k := r.IntN(10); {
	case depth < 34 && k < 3:
		return randomJSON(r, depth)
	case depth < 34 && k < 5:
		var b strings.Builder
		b.WriteString("[")
		for i := range r.IntN(3) + 1 {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(randomValue(r, depth+1))
		}
		b.WriteString("]")
		return b.String()
	case k < 7:
		return randomString(r)
	case k < 9:
		return []string{"0", "-0", "1.5e-7", "123456789012345678901234567890", "-1E+400", "1e-400", "42", "0.000"}[r.IntN(8)]
	}
	return []string{"true", "false", "null"}[r.IntN(3)]
}

func randomString(r *rand.Rand) string {
	var b strings.Builder
	b.WriteString(`"`)
	for range r.IntN(6) {
		switch k := r.IntN(20); {
		case k < 6:
			b.WriteByte(byte('a' + r.IntN(26)))
		case k < 9:
			chars := []rune("é你😀\u2028\ufeff\uffff\U0010ffff<>&")
			b.WriteRune(chars[r.IntN(len(chars))])
		case k < 12:
			b.WriteString([]string{`\"`, `\\`, `\/`, `\b`, `\f`, `\n`, `\r`, `\t`, `\u0000`, `\u001f`, `\u00e9`}[r.IntN(11)])
		case k < 14:
			b.WriteString(fmt.Sprintf(`\u%04x\u%04x`, 0xD800+r.IntN(0x400), 0xDC00+r.IntN(0x400))) // a pair
		case k == 14 && r.IntN(4) == 0:
			b.WriteString(fmt.Sprintf(`\u%04x`, 0xD800+r.IntN(0x800))) // a lone half
		case k == 15 && r.IntN(8) == 0:
			b.WriteString([]string{"\xff", "\xfe", "\xc3"}[r.IntN(3)]) // not UTF-8
		default:
			b.WriteString(" ")
		}
	}
	b.WriteString(`"`)
	return b.String()
}
