// Package routing is the one routing core every imshard module shares: UTC
// month math, the month-table name whitelist, the Redis key builder, the Lua
// scripts, the shard catalog, seq/month allocation and topic→month routes.
// Nothing outside this package builds a table name or a Redis key.
package routing

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Month is a UTC calendar month. The zero value is not a valid month; every
// Month reached through ParseMonth, MonthOf or arithmetic is.
type Month struct {
	idx int32 // year*12 + (month-1); 0 stays free to mean "no month"
}

// The sane range of months: older data predates any IM backend we migrate,
// later years are a typo or an attack on the table namespace.
const (
	MinYear = 2000
	MaxYear = 2199
)

// ErrInvalidMonth is returned for anything that is not YYYYMM in range.
var ErrInvalidMonth = errors.New("invalid month")

// NewMonth returns the month of year y, month m (1–12).
func NewMonth(y, m int) (Month, error) {
	if y < MinYear || y > MaxYear || m < 1 || m > 12 {
		return Month{}, fmt.Errorf("%w: %04d-%02d", ErrInvalidMonth, y, m)
	}
	return Month{idx: int32(y*12 + m - 1)}, nil
}

// ParseMonth accepts exactly six ASCII digits YYYYMM within the sane range.
func ParseMonth(s string) (Month, error) {
	if len(s) != 6 {
		return Month{}, fmt.Errorf("%w: %q: want YYYYMM", ErrInvalidMonth, s)
	}
	n := 0
	for i := 0; i < 6; i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return Month{}, fmt.Errorf("%w: %q: want YYYYMM", ErrInvalidMonth, s)
		}
		n = n*10 + int(c-'0')
	}
	m, err := NewMonth(n/100, n%100)
	if err != nil {
		return Month{}, fmt.Errorf("%w: %q", ErrInvalidMonth, s)
	}
	return m, nil
}

// MustMonth is ParseMonth for constants in tests and tables; it panics.
func MustMonth(s string) Month {
	m, err := ParseMonth(s)
	if err != nil {
		panic(err)
	}
	return m
}

// MonthOf is the UTC month of t. Times outside the sane range give the zero
// Month (IsZero), which every consumer rejects.
func MonthOf(t time.Time) Month {
	t = t.UTC()
	m, err := NewMonth(t.Year(), int(t.Month()))
	if err != nil {
		return Month{}
	}
	return m
}

// IsZero reports whether m is the zero (invalid) month.
func (m Month) IsZero() bool { return m.idx == 0 }

// Year and Num give the calendar year and month number (1–12).
func (m Month) Year() int { return int(m.idx) / 12 }
func (m Month) Num() int  { return int(m.idx)%12 + 1 }

// Int is YYYYMM as an integer, the score months carry in Redis.
func (m Month) Int() int { return m.Year()*100 + m.Num() }

// String is YYYYMM, or "" for the zero month. A send formats one, so a
// four-digit year is written without fmt.
func (m Month) String() string {
	if m.IsZero() {
		return ""
	}
	if y := m.Year(); y >= 1000 && y <= 9999 {
		return strconv.Itoa(m.Int())
	}
	return fmt.Sprintf("%04d%02d", m.Year(), m.Num())
}

// Add moves by n months (negative goes back), across years. The result may
// leave the sane range; check with Valid before using it as a table.
func (m Month) Add(n int) Month { return Month{idx: m.idx + int32(n)} }

// Next and Prev are Add(1) and Add(-1).
func (m Month) Next() Month { return m.Add(1) }
func (m Month) Prev() Month { return m.Add(-1) }

// Valid reports whether m lies in the sane range.
func (m Month) Valid() bool {
	y := m.Year()
	return !m.IsZero() && y >= MinYear && y <= MaxYear
}

// Before, After and Compare order months.
func (m Month) Before(o Month) bool { return m.idx < o.idx }
func (m Month) After(o Month) bool  { return m.idx > o.idx }
func (m Month) Compare(o Month) int {
	switch {
	case m.idx < o.idx:
		return -1
	case m.idx > o.idx:
		return 1
	}
	return 0
}

// Sub is the number of months from o to m.
func (m Month) Sub(o Month) int { return int(m.idx - o.idx) }

// Start is the first instant of the month (UTC); End is the first instant of
// the next month, so a month covers [Start, End).
func (m Month) Start() time.Time {
	return time.Date(m.Year(), time.Month(m.Num()), 1, 0, 0, 0, 0, time.UTC)
}
func (m Month) End() time.Time { return m.Next().Start() }

// Range lists every month from a to b inclusive, in order; empty if b < a.
func Range(a, b Month) []Month {
	var out []Month
	for m := a; !m.After(b); m = m.Next() {
		out = append(out, m)
	}
	return out
}
