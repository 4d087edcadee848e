package httpapi

import (
	"testing"
	"time"
)

// testNow is the server's clock in the tests of client times.
var testNow = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)

func TestParseTimeKeepsTimesWithinTheBounds(t *testing.T) {
	for v, ok := range map[string]bool{
		"2000-01-01T00:00:00Z":           true,
		"2000-01-01T01:00:00+01:00":      true, // the earliest instant, written in another zone
		"1999-12-31T23:59:59.999Z":       false,
		"2000-01-01T00:00:00+00:01":      false,
		"0001-01-01T00:00:00Z":           false,
		"1970-01-01T00:00:00Z":           false,
		"2126-06-01T12:00:00Z":           true, // now + 100 years
		"2126-06-01T12:00:00.001Z":       false,
		"9999-12-31T23:59:59Z":           false,
		"2030-01-01T00:00:00.123456789Z": true,
		"2030-01-01":                     false,
		"tomorrow":                       false,
		"":                               false,
	} {
		got, err := ParseTime("until", v, testNow)
		if (err == nil) != ok {
			t.Errorf("%q: %v %v, want accepted %v", v, got, err, ok)
		}
		if err != nil {
			if e, _ := err.(*Error); e == nil || e.Code != CodeInvalidArgument || e.Details["field"] != "until" {
				t.Errorf("%q: %#v, want invalid_argument naming until", v, err)
			}
		}
	}
}

// FuzzParseTime: a value is refused with a 400 naming its field, or is a
// UTC time within the bounds that reads back from its RFC 3339 form; nothing
// panics.
func FuzzParseTime(f *testing.F) {
	for _, s := range []string{"0001-01-01T00:00:00Z", "1969-12-31T23:59:59Z", "1999-12-31T23:59:59.999Z",
		"2000-01-01T00:00:00Z", "2026-06-01T12:00:00+14:00", "2126-06-01T12:00:00Z", "2126-06-01T12:00:00.001Z",
		"9999-12-31T23:59:59.999999999Z", "2026-02-30T00:00:00Z", "2026-06-01T24:00:00Z", "", "x", "2026-06-01"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseTime("until", s, testNow)
		if err != nil {
			if e, _ := err.(*Error); e == nil || e.Code != CodeInvalidArgument || e.Details["field"] != "until" {
				t.Fatalf("%q: %#v, want invalid_argument naming until", s, err)
			}
			return
		}
		if got.Location() != time.UTC || got.Before(EarliestTime) || got.After(Horizon(testNow)) {
			t.Fatalf("%q accepted as %v", s, got)
		}
		back, err := ParseTime("until", got.Format(time.RFC3339Nano), testNow)
		if err != nil || !back.Equal(got) {
			t.Fatalf("%q: %v reads back as %v %v", s, got, back, err)
		}
	})
}
