package query

import (
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/readpath"
)

func TestParseList(t *testing.T) {
	ok := []struct {
		q    string
		want ListRequest
	}{
		{"", ListRequest{Limit: 50}},
		{"before=1", ListRequest{Before: 1, HasBefore: true, Limit: 50}},
		{"since=0&limit=200", ListRequest{HasSince: true, Limit: 200}},
		{"since=9223372036854775807", ListRequest{Since: 9223372036854775807, HasSince: true, Limit: 50}},
		{"before=&limit=1", ListRequest{Limit: 1}},
	}
	for _, c := range ok {
		q, _ := url.ParseQuery(c.q)
		got, err := ParseList(q)
		if err != nil || got != c.want {
			t.Errorf("%q: got %+v %v, want %+v", c.q, got, err, c.want)
		}
	}
	bad := []string{"limit=0", "limit=201", "limit=-1", "limit=x", "before=1&since=1", "before=abc",
		"before=-5", "before=0", "since=-1", "before=9223372036854775808", "since=99999999999999999999",
		"before=+5", "before=0x10", "before=1&before=2", "since= 1", "limit=1e3"}
	for _, s := range bad {
		q, _ := url.ParseQuery(s)
		if _, err := ParseList(q); !httpapi.HasCode(err, httpapi.CodeInvalidArgument) {
			t.Errorf("%q: want invalid_argument, got %v", s, err)
		}
	}
}

func TestParseContext(t *testing.T) {
	q, _ := url.ParseQuery("")
	if b, a, err := ParseContext(q); err != nil || b != 20 || a != 20 {
		t.Fatalf("defaults: %d %d %v", b, a, err)
	}
	q, _ = url.ParseQuery("before=0&after=100")
	if b, a, err := ParseContext(q); err != nil || b != 0 || a != 100 {
		t.Fatalf("bounds: %d %d %v", b, a, err)
	}
	for _, s := range []string{"before=101", "after=-1", "after=x"} {
		q, _ := url.ParseQuery(s)
		if _, _, err := ParseContext(q); !httpapi.HasCode(err, httpapi.CodeInvalidArgument) {
			t.Errorf("%q: want invalid_argument, got %v", s, err)
		}
	}
}

func TestParseSearch(t *testing.T) {
	q, _ := url.ParseQuery("q=hi&from=2026-08-15T00:00:00Z&to=2026-10-31T00:00:00Z&limit=10")
	r, err := ParseSearch(q, time.Now())
	if err != nil || r.Q != "hi" || r.Limit != 10 {
		t.Fatalf("got %+v %v", r, err)
	}
	bad := []string{
		"from=2026-08-01T00:00:00Z&to=2026-08-02T00:00:00Z",               // no q
		"q=x&to=2026-08-02T00:00:00Z",                                     // no from
		"q=x&from=2026-08-01&to=2026-08-02T00:00:00Z",                     // not RFC 3339
		"q=x&from=2026-08-02T00:00:00Z&to=2026-08-01T00:00:00Z",           // reversed
		"q=x&from=2026-01-01T00:00:00Z&to=2026-04-03T00:00:00Z",           // > 92 days
		"q=x&from=2026-07-31T00:00:00Z&to=2026-10-01T00:00:01Z",           // 4 months
		"q=x&from=1999-12-31T00:00:00Z&to=2000-01-02T00:00:00Z",           // out of years
		"q=x&from=0001-01-01T00:00:00Z&to=0001-01-02T00:00:00Z",           // before 2000
		"q=x&from=9999-12-01T00:00:00Z&to=9999-12-02T00:00:00Z",           // past the horizon
		"q=x&from=2150-01-01T00:00:00Z&to=2150-01-02T00:00:00Z",           // a table's year, past the horizon
		"q=x&from=2026-08-01T00:00:00Z&to=2026-08-02T00:00:00Z&limit=0",   // limit
		"q=x&from=2026-08-01T00:00:00Z&to=2026-08-02T00:00:00Z&before=-1", // cursor
	}
	for _, s := range bad {
		q, _ := url.ParseQuery(s)
		if _, err := ParseSearch(q, time.Now()); !httpapi.HasCode(err, httpapi.CodeInvalidArgument) {
			t.Errorf("%q: want invalid_argument, got %v", s, err)
		}
	}
}

func TestLikePattern(t *testing.T) {
	if got := likePattern(`50%_off!`); got != `%50!%!_off!!%` {
		t.Fatalf("got %q", got)
	}
}

func TestFindMonth(t *testing.T) {
	// months 0..5: ids 100-199, empty, 300-399, 400-499, empty, empty
	b := []idBounds{{lo: 100, hi: 199}, {empty: true}, {lo: 300, hi: 399}, {lo: 400, hi: 499}, {empty: true}, {empty: true}}
	calls := 0
	bounds := func(i int) (idBounds, error) { calls++; return b[i], nil }
	for id, want := range map[int64]int{150: 0, 350: 2, 499: 3, 250: 2, 50: 0} {
		got, err := FindMonth(len(b), bounds, id)
		if err != nil || len(got) == 0 || got[0] != want {
			t.Errorf("id %d: got %v, want first %d", id, got, want)
		}
	}
	if got, _ := FindMonth(0, bounds, 1); got != nil {
		t.Fatalf("no months: %v", got)
	}
}

// FuzzParseCursor: anything that parses is a canonical decimal in range
// that formats back to itself, and nothing panics.
func FuzzParseCursor(f *testing.F) {
	for _, s := range []string{"0", "1", "50", "-1", "9223372036854775807", "9223372036854775808", "", "1e3", "+1", " 1", "٣"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := readpath.ParseCursor("before", s, 1)
		if err != nil {
			if !httpapi.HasCode(err, httpapi.CodeInvalidArgument) {
				t.Fatalf("%q: non-API error %v", s, err)
			}
			return
		}
		if n < 1 {
			t.Fatalf("%q: parsed %d below the minimum", s, n)
		}
		if back := strconv.FormatInt(n, 10); strings.TrimLeft(s, "0") != back {
			t.Fatalf("%q parsed to %d", s, n)
		}
		q := url.Values{"limit": {s}}
		if r, err := ParseList(q); err == nil && (r.Limit < 1 || r.Limit > MaxLimit) {
			t.Fatalf("limit %q accepted as %d", s, r.Limit)
		}
	})
}

// FuzzParseSearch: a search window is refused with invalid_argument, or
// lies within the bounds of a client time, at most 92 days and 3 months,
// in UTC; nothing panics.
func FuzzParseSearch(f *testing.F) {
	for _, c := range [][2]string{{"2026-05-01T00:00:00Z", "2026-06-01T00:00:00Z"}, {"0001-01-01T00:00:00Z", "0001-01-02T00:00:00Z"},
		{"1999-12-31T00:00:00Z", "2000-01-02T00:00:00Z"}, {"2126-05-30T00:00:00Z", "2126-06-01T12:00:00.001Z"},
		{"9999-12-01T00:00:00Z", "9999-12-02T00:00:00Z"}, {"2026-05-01T00:00:00+14:00", "2026-05-01T00:00:00-12:00"}, {"", "x"}} {
		f.Add(c[0], c[1])
	}
	now := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, from, to string) {
		r, err := ParseSearch(url.Values{"q": {"x"}, "from": {from}, "to": {to}}, now)
		if err != nil {
			if !httpapi.HasCode(err, httpapi.CodeInvalidArgument) {
				t.Fatalf("%q..%q: %v, want invalid_argument", from, to, err)
			}
			return
		}
		if r.From.Before(httpapi.EarliestTime) || r.To.After(httpapi.Horizon(now)) || !r.To.After(r.From) ||
			r.To.Sub(r.From) > MaxSearchDays*24*time.Hour || r.From.Location() != time.UTC || r.To.Location() != time.UTC {
			t.Fatalf("%q..%q accepted as %v..%v", from, to, r.From, r.To)
		}
	})
}
