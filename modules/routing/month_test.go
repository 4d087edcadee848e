package routing

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestParseMonth(t *testing.T) {
	tests := []struct {
		in   string
		want string
		ok   bool
	}{
		{"202609", "202609", true},
		{"200001", "200001", true},
		{"219912", "219912", true},
		{"202612", "202612", true},
		{"202313", "", false},
		{"202300", "", false},
		{"000000", "", false},
		{"199912", "", false},
		{"220001", "", false},
		{"20261", "", false},
		{"2026-1", "", false},
		{"2026011", "", false},
		{"", "", false},
		{"'20260", "", false},
		{"202601'", "", false},
		{"2026;1", "", false},
		{"1 OR 1", "", false},
		{"２０２６０１", "", false},
		{"+20261", "", false},
		{"-20261", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			m, err := ParseMonth(tt.in)
			if tt.ok {
				if err != nil || m.String() != tt.want {
					t.Fatalf("ParseMonth(%q) = %v, %v; want %s", tt.in, m, err, tt.want)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrInvalidMonth) {
				t.Fatalf("ParseMonth(%q) = %v, %v; want ErrInvalidMonth", tt.in, m, err)
			}
		})
	}
}

func TestMonthArithmetic(t *testing.T) {
	tests := []struct {
		from string
		n    int
		want string
	}{
		{"202612", 1, "202701"},
		{"202701", -1, "202612"},
		{"202601", 12, "202701"},
		{"202601", -13, "202412"},
		{"202611", 0, "202611"},
		{"209912", 1, "210001"},
	}
	for _, tt := range tests {
		got := MustMonth(tt.from).Add(tt.n)
		if got.String() != tt.want {
			t.Errorf("%s%+d = %s, want %s", tt.from, tt.n, got, tt.want)
		}
	}
	if MustMonth("202612").Next() != MustMonth("202701") || MustMonth("202701").Prev() != MustMonth("202612") {
		t.Error("Next/Prev across the year edge")
	}
	if d := MustMonth("202703").Sub(MustMonth("202611")); d != 4 {
		t.Errorf("Sub = %d, want 4", d)
	}
	if MustMonth("200001").Prev().Valid() || MustMonth("219912").Next().Valid() {
		t.Error("months outside the sane range must not be Valid")
	}
}

func TestMonthBounds(t *testing.T) {
	tests := []struct {
		month      string
		start, end string
	}{
		{"202402", "2024-02-01T00:00:00Z", "2024-03-01T00:00:00Z"}, // leap year
		{"202302", "2023-02-01T00:00:00Z", "2023-03-01T00:00:00Z"},
		{"202612", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"},
	}
	for _, tt := range tests {
		m := MustMonth(tt.month)
		if got := m.Start().Format(time.RFC3339); got != tt.start {
			t.Errorf("%s start %s want %s", tt.month, got, tt.start)
		}
		if got := m.End().Format(time.RFC3339); got != tt.end {
			t.Errorf("%s end %s want %s", tt.month, got, tt.end)
		}
	}
	if d := MustMonth("202402").End().Sub(MustMonth("202402").Start()); d != 29*24*time.Hour {
		t.Errorf("Feb 2024 lasts %v, want 29 days", d)
	}
}

func TestMonthOf(t *testing.T) {
	tests := []struct {
		at   string
		want string
	}{
		{"2026-09-30T23:59:59.999Z", "202609"},
		{"2026-10-01T00:00:00Z", "202610"},
		{"2026-12-31T23:59:59Z", "202612"},
		{"2027-01-01T00:00:00Z", "202701"},
		{"2024-02-29T12:00:00Z", "202402"},
		// a node in UTC+8 at local 08:00 on the 1st is still the previous UTC month
		{"2026-10-01T07:59:59+08:00", "202609"},
	}
	for _, tt := range tests {
		at, err := time.Parse(time.RFC3339Nano, tt.at)
		if err != nil {
			t.Fatal(err)
		}
		if got := MonthOf(at).String(); got != tt.want {
			t.Errorf("MonthOf(%s) = %s, want %s", tt.at, got, tt.want)
		}
	}
	if !MonthOf(time.Date(1999, 12, 31, 0, 0, 0, 0, time.UTC)).IsZero() {
		t.Error("a time before the sane range must give the zero month")
	}
}

func TestRange(t *testing.T) {
	got := Range(MustMonth("202611"), MustMonth("202702"))
	want := []string{"202611", "202612", "202701", "202702"}
	if len(got) != len(want) {
		t.Fatalf("Range = %v", got)
	}
	for i := range want {
		if got[i].String() != want[i] {
			t.Fatalf("Range = %v, want %v", got, want)
		}
	}
	if len(Range(MustMonth("202702"), MustMonth("202611"))) != 0 {
		t.Error("Range(b, a) must be empty")
	}
}

func FuzzParseMonth(f *testing.F) {
	for _, s := range []string{"202609", "202313", "000000", "20261", "2026-1", "'; DROP"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseMonth(s)
		if err != nil {
			return
		}
		if m.String() != s || !m.Valid() {
			t.Fatalf("ParseMonth(%q) accepted as %q", s, m.String())
		}
		if _, err := TableFor(m); err != nil {
			t.Fatalf("valid month %s gives no table: %v", m, err)
		}
	})
}

// String writes what "%04d%02d" writes, inside the sane range and out of it.
func TestMonthString(t *testing.T) {
	base := MustMonth("202612")
	for n := -30000; n <= 100000; n += 7 {
		m := base.Add(n)
		want := fmt.Sprintf("%04d%02d", m.Year(), m.Num())
		if m.IsZero() {
			want = ""
		}
		if got := m.String(); got != want {
			t.Fatalf("%d: String = %q, want %q", n, got, want)
		}
	}
}
