package inbox

import (
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/httpapi"
)

// testNow is the server's clock in the tests of cursors and tokens.
var testNow = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)

func opaque(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

// refusedNaming reports whether err is a 400 invalid_argument naming field.
func refusedNaming(err error, field string) bool {
	var e *httpapi.Error
	return errors.As(err, &e) && e.Code == httpapi.CodeInvalidArgument && e.Details["field"] == field
}

var nowMs = strconv.FormatInt(testNow.UnixMilli(), 10)

// syncTokenSeeds are tokens the API writes and the forged ones seen or
// feared: a time past what MySQL holds, ahead of the clock, before 2000,
// negative, and JSON or base64 other than the API's own.
var syncTokenSeeds = []string{
	encodeOpaque(syncToken{Since: testNow.UnixMilli()}),
	encodeOpaque(syncToken{Since: testNow.Add(-time.Hour).UnixMilli(), Topic: "room_1-a"}),
	encodeOpaque(syncToken{Since: testNow.Add(TokenSkew).UnixMilli()}),
	encodeOpaque(syncToken{Since: httpapi.EarliestTime.UnixMilli()}),
	opaque(`{"s":9223372036854775807}`),
	opaque(`{"s":-9223372036854775808}`),
	opaque(`{"s":-62135596800000}`),
	opaque(`{"s":1}`),
	opaque(`null`),
	opaque(`{}`),
	opaque(`{"s":` + nowMs + `,"x":1}`),
	opaque(`{"s":` + nowMs + `,"s":` + nowMs + `}`),
	opaque(`{"s":` + nowMs + `.0}`),
	opaque(`{"s":"` + nowMs + `"}`),
	opaque(`{"s":` + nowMs + `,"t":""}`),
	opaque(`{"s":` + nowMs + `,"t":"a b"}`),
	opaque(`{"s":` + nowMs + `}x`),
	opaque(` {"s":` + nowMs + `}`),
	base64.URLEncoding.EncodeToString([]byte(`{"s":` + nowMs + `}`)),
	base64.StdEncoding.EncodeToString([]byte(`{"s":` + nowMs + `,"t":"?>?"}`)),
	"", "!!!", "e30", strings.Repeat("A", 600),
}

func TestParseSyncTokenRefusesWhatTheAPIDidNotWrite(t *testing.T) {
	for _, tok := range []syncToken{
		{Since: testNow.UnixMilli()},
		{Since: httpapi.EarliestTime.UnixMilli(), Topic: "a"},
		{Since: testNow.Add(TokenSkew).UnixMilli(), Topic: strings.Repeat("z", 64)},
	} {
		got, err := parseSyncToken(encodeOpaque(tok), testNow)
		if err != nil || got != tok {
			t.Errorf("%+v: read back as %+v %v", tok, got, err)
		}
	}
	for _, s := range syncTokenSeeds[4:] {
		if _, err := parseSyncToken(s, testNow); !refusedNaming(err, "token") {
			t.Errorf("token %q (%s): %v, want invalid_argument naming token", s, decoded(s), err)
		}
	}
	for _, tok := range []syncToken{
		{Since: testNow.Add(TokenSkew).UnixMilli() + 1},
		{Since: httpapi.EarliestTime.UnixMilli() - 1},
		{Since: testNow.UnixMilli(), Topic: strings.Repeat("z", 65)},
	} {
		if _, err := parseSyncToken(encodeOpaque(tok), testNow); !refusedNaming(err, "token") {
			t.Errorf("%+v: %v, want invalid_argument naming token", tok, err)
		}
	}
}

func decoded(s string) string {
	b, _ := base64.RawURLEncoding.DecodeString(s)
	return string(b)
}

// FuzzParseSyncToken: a token is refused with a 400 naming it, or is one
// the API writes (its encoding is the token) with a moment in bounds and
// a topic when it names one; nothing panics.
func FuzzParseSyncToken(f *testing.F) {
	for _, s := range syncTokenSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := parseSyncToken(s, testNow)
		if err != nil {
			if !refusedNaming(err, "token") {
				t.Fatalf("%q: %v, want invalid_argument naming token", s, err)
			}
			return
		}
		if encodeOpaque(tok) != s {
			t.Fatalf("%q read as %+v, which encodes as %q", s, tok, encodeOpaque(tok))
		}
		if tok.Since < httpapi.EarliestTime.UnixMilli() || tok.Since > testNow.Add(TokenSkew).UnixMilli() {
			t.Fatalf("%q accepted with a moment out of bounds: %+v", s, tok)
		}
	})
}

// listCursorSeeds are cursors the API writes and forged ones.
var listCursorSeeds = []string{
	encodeOpaque(listCursor{Snapshot: testNow.UnixMilli(), Activity: testNow.Add(-time.Hour).UnixMilli(), Topic: "room"}),
	encodeOpaque(listCursor{Snapshot: testNow.UnixMilli(), Pinned: true, Activity: testNow.UnixMilli(), Topic: "a"}),
	encodeOpaque(listCursor{Snapshot: testNow.UnixMilli(), Activity: time.Time{}.UnixMilli(), Topic: "a"}),
	opaque(`{"s":9223372036854775807,"p":false,"a":0,"t":"a"}`),
	opaque(`{"s":` + nowMs + `,"p":false,"a":9223372036854775807,"t":"a"}`),
	opaque(`{"s":1,"p":false,"a":1,"t":"a"}`),
	opaque(`{"s":-1,"p":false,"a":-2,"t":"a"}`),
	opaque(`{"s":` + nowMs + `,"p":false,"a":0,"t":"a/b"}`),
	opaque(`{"s":` + nowMs + `,"p":false,"a":0,"t":""}`),
	opaque(`{"s":` + nowMs + `,"p":false,"a":0}`),
	opaque(`{"s":` + nowMs + `,"p":0,"a":0,"t":"a"}`),
	opaque(`{"p":false,"s":` + nowMs + `,"a":0,"t":"a"}`),
	opaque(`null`),
	"", "$", strings.Repeat("e30", 200),
}

func TestParseListCursorRefusesWhatTheAPIDidNotWrite(t *testing.T) {
	for _, s := range listCursorSeeds[:3] {
		c, err := parseListCursor(s, testNow)
		if err != nil || encodeOpaque(c) != s {
			t.Errorf("%s: read as %+v %v", decoded(s), c, err)
		}
	}
	for _, s := range listCursorSeeds[3:] {
		if _, err := parseListCursor(s, testNow); !refusedNaming(err, "cursor") {
			t.Errorf("cursor %q (%s): %v, want invalid_argument naming cursor", s, decoded(s), err)
		}
	}
}

// FuzzParseListCursor: a cursor is refused with a 400 naming it, or is one
// the API writes with its snapshot in bounds, its activity not after the
// snapshot and a topic; nothing panics.
func FuzzParseListCursor(f *testing.F) {
	for _, s := range listCursorSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := parseListCursor(s, testNow)
		if err != nil {
			if !refusedNaming(err, "cursor") {
				t.Fatalf("%q: %v, want invalid_argument naming cursor", s, err)
			}
			return
		}
		if encodeOpaque(c) != s {
			t.Fatalf("%q read as %+v, which encodes as %q", s, c, encodeOpaque(c))
		}
		if c.Snapshot < httpapi.EarliestTime.UnixMilli() || c.Snapshot > testNow.Add(TokenSkew).UnixMilli() ||
			c.Activity > c.Snapshot || c.Topic == "" {
			t.Fatalf("%q accepted out of bounds: %+v", s, c)
		}
	})
}

// FuzzDecodePrefs: a preferences body is refused with a 4xx code, or sets
// something, with a notification mute within the bounds of a client time;
// nothing panics.
func FuzzDecodePrefs(f *testing.F) {
	for _, s := range []string{`{"pinned":true}`, `{"notify_muted_until":null}`, `{"notify_muted_until":"2030-01-01T00:00:00Z"}`,
		`{"notify_muted_until":"0001-01-01T00:00:00Z"}`, `{"notify_muted_until":"1999-12-31T23:59:59.999Z"}`,
		`{"notify_muted_until":"9999-12-31T23:59:59Z"}`, `{"notify_muted_until":"2126-06-01T12:00:00.001Z"}`,
		`{"notify_muted_until":1}`, `{"notify_muted_until":"soon"}`, `{}`, `{"pinned":null}`, `null`, ``} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := DecodePrefs(strings.NewReader(s), testNow)
		if err != nil {
			if !httpapi.HasCode(err, httpapi.CodeInvalidArgument) && !httpapi.HasCode(err, httpapi.CodeTooLarge) {
				t.Fatalf("%q: %v, want a 4xx API error", s, err)
			}
			return
		}
		if p.Pinned == nil && p.NotifyMute == nil && !p.ClearNotifyMut {
			t.Fatalf("%q accepted as changing nothing", s)
		}
		if m := p.NotifyMute; m != nil && (m.Before(httpapi.EarliestTime) || m.After(httpapi.Horizon(testNow))) {
			t.Fatalf("%q accepted with the mute %v", s, m)
		}
	})
}
