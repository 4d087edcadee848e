package query

import (
	"net/url"
	"strconv"
	"time"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/readpath"
	"github.com/imshard/imshard/modules/routing"
)

// Limits of the read API (docs/api.md).
const (
	DefaultLimit   = 50
	MaxLimit       = 200
	DefaultContext = 20
	MaxContext     = 100
	// MaxSearchDays and MaxSearchMonths bound a search window: at most 92
	// days, touching at most 3 calendar months.
	MaxSearchDays   = 92
	MaxSearchMonths = 3
)

// ListRequest is a validated list query: either Before (newest first; zero
// HasBefore means the latest page) or Since (oldest first).
type ListRequest struct {
	Before    int64
	HasBefore bool
	Since     int64
	HasSince  bool
	Limit     int
}

// ParseList validates ?before=&since=&limit=.
func ParseList(q url.Values) (ListRequest, error) {
	var r ListRequest
	before, hasBefore, err := readpath.Single(q, "before")
	if err != nil {
		return r, err
	}
	since, hasSince, err := readpath.Single(q, "since")
	if err != nil {
		return r, err
	}
	if hasBefore && hasSince {
		return r, readpath.Invalid("before and since are exclusive")
	}
	if hasBefore {
		if r.Before, err = readpath.ParseCursor("before", before, 1); err != nil {
			return r, err
		}
		r.HasBefore = true
	}
	if hasSince {
		if r.Since, err = readpath.ParseCursor("since", since, 0); err != nil {
			return r, err
		}
		r.HasSince = true
	}
	lim, hasLim, err := readpath.Single(q, "limit")
	if err != nil {
		return r, err
	}
	r.Limit, err = readpath.ParseLimit("limit", lim, hasLim, DefaultLimit, MaxLimit)
	return r, err
}

// ParseContext validates ?before=&after= of a context request (counts).
func ParseContext(q url.Values) (before, after int, err error) {
	b, hasB, err := readpath.Single(q, "before")
	if err != nil {
		return 0, 0, err
	}
	a, hasA, err := readpath.Single(q, "after")
	if err != nil {
		return 0, 0, err
	}
	if before, err = parseCount("before", b, hasB); err != nil {
		return 0, 0, err
	}
	after, err = parseCount("after", a, hasA)
	return before, after, err
}

func parseCount(name, v string, present bool) (int, error) {
	if !present {
		return DefaultContext, nil
	}
	n, err := readpath.ParseCursor(name, v, 0)
	if err != nil || n > MaxContext {
		return 0, httpapi.InvalidField(name, name+" must be 0.."+strconv.Itoa(MaxContext))
	}
	return int(n), nil
}

// SearchRequest is a validated search: text q within [From, To), newest
// first, below Before when paging.
type SearchRequest struct {
	Q         string
	From, To  time.Time
	Before    int64
	HasBefore bool
	Limit     int
}

// maxQueryLen bounds the search text; longer needles are abuse, not search.
const maxQueryLen = 256

// ParseSearch validates ?q=&from=&to=&limit=&before= at now.
func ParseSearch(q url.Values, now time.Time) (SearchRequest, error) {
	var r SearchRequest
	text, ok, err := readpath.Single(q, "q")
	if err != nil {
		return r, err
	}
	if !ok || len(text) > maxQueryLen {
		return r, readpath.Invalid("q is required (at most " + strconv.Itoa(maxQueryLen) + " bytes)")
	}
	r.Q = text
	for _, f := range []struct {
		name string
		dst  *time.Time
	}{{"from", &r.From}, {"to", &r.To}} {
		v, ok, err := readpath.Single(q, f.name)
		if err != nil {
			return r, err
		}
		if !ok {
			return r, httpapi.InvalidField(f.name, f.name+" is required (RFC 3339)")
		}
		if *f.dst, err = httpapi.ParseTime(f.name, v, now); err != nil {
			return r, err
		}
	}
	if !r.To.After(r.From) {
		return r, readpath.Invalid("to must be after from")
	}
	if r.To.Sub(r.From) > MaxSearchDays*24*time.Hour {
		return r, readpath.Invalid("the search window is at most " + strconv.Itoa(MaxSearchDays) + " days")
	}
	months := monthSpan(r.From, r.To)
	if months == 0 {
		return r, readpath.Invalid("from and to must lie in the years " + strconv.Itoa(routing.MinYear) + ".." + strconv.Itoa(routing.MaxYear))
	}
	if months > MaxSearchMonths {
		return r, readpath.Invalid("the search window may touch at most " + strconv.Itoa(MaxSearchMonths) + " months")
	}
	if v, ok, err := readpath.Single(q, "before"); err != nil {
		return r, err
	} else if ok {
		if r.Before, err = readpath.ParseCursor("before", v, 1); err != nil {
			return r, err
		}
		r.HasBefore = true
	}
	lim, hasLim, err := readpath.Single(q, "limit")
	if err != nil {
		return r, err
	}
	r.Limit, err = readpath.ParseLimit("limit", lim, hasLim, DefaultLimit, MaxLimit)
	return r, err
}
