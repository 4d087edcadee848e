package query

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
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
		return 0, readpath.Invalid(name + " must be 0.." + strconv.Itoa(MaxContext))
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

// ParseSearch validates ?q=&from=&to=&limit=&before=.
func ParseSearch(q url.Values) (SearchRequest, error) {
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
			return r, readpath.Invalid(f.name + " is required (RFC 3339)")
		}
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return r, readpath.Invalid(f.name + " must be RFC 3339")
		}
		*f.dst = t.UTC()
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

// MaxDeletionBody bounds a POST …/deletions body (two numbers).
const MaxDeletionBody = 1024

// DeletionRange is the body of POST /v1/topics/{topic}/deletions: hide the
// caller's view of seqs [Low, Hi).
type DeletionRange struct {
	Low int64 `json:"low"`
	Hi  int64 `json:"hi"`
}

// DecodeDeletion reads and validates a deletion range: both bounds
// present, 1 <= low < hi.
func DecodeDeletion(r io.Reader) (DeletionRange, error) {
	var req struct {
		Low *int64 `json:"low"`
		Hi  *int64 `json:"hi"`
	}
	if err := httpapi.DecodeStrict(r, &req); err != nil {
		return DeletionRange{}, err
	}
	if req.Low == nil || req.Hi == nil {
		return DeletionRange{}, readpath.Invalid("low and hi are required")
	}
	if *req.Low < 1 || *req.Hi <= *req.Low {
		return DeletionRange{}, readpath.Invalid("a deletion range needs 1 <= low < hi")
	}
	return DeletionRange{Low: *req.Low, Hi: *req.Hi}, nil
}

// Delete scopes of DELETE …/messages/{seq}.
const (
	ScopeMe  = "me"
	ScopeAll = "all"
)

// ParseScope reads the required scope of a delete: me or all.
func ParseScope(q url.Values) (string, error) {
	v, ok, err := readpath.Single(q, "scope")
	if err != nil {
		return "", err
	}
	if !ok || (v != ScopeMe && v != ScopeAll) {
		return "", readpath.Invalid("scope must be me or all")
	}
	return v, nil
}

// MaxChangeBody bounds the body of a recall (a reason).
const MaxChangeBody = 1 << 10

// DecodeRecall reads the optional body of a recall: nothing, or
// {"reason": "…"} of at most MaxReason characters.
func DecodeRecall(r io.Reader) (reason string, err error) {
	body, err := io.ReadAll(r)
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return "", httpapi.Wrap(httpapi.CodeTooLarge, "body exceeds "+strconv.FormatInt(tooLarge.Limit, 10)+" bytes", err)
	case err != nil:
		return "", httpapi.Wrap(httpapi.CodeInvalidArgument, "unreadable body", err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return "", nil
	}
	var req struct {
		Reason string `json:"reason"`
	}
	if err := httpapi.DecodeStrict(bytes.NewReader(body), &req); err != nil {
		return "", err
	}
	return req.Reason, checkReason(req.Reason)
}

// ParseReason reads the optional reason of a delete for everyone.
func ParseReason(q url.Values) (string, error) {
	v, _, err := readpath.Single(q, "reason")
	if err != nil {
		return "", err
	}
	return v, checkReason(v)
}

func checkReason(reason string) error {
	if utf8.RuneCountInString(reason) > MaxReason || !utf8.ValidString(reason) {
		return readpath.Invalid("reason must be UTF-8 of at most " + strconv.Itoa(MaxReason) + " characters")
	}
	return nil
}

// DecodeEdit reads and validates the body of an edit: content required,
// head optional (absent keeps the message's head, null clears it), both
// checked as a send's are (message.CheckStored); expected_version required;
// from_user, when given, a positive id. Nothing else — mentions, msg_type —
// is editable: any other field is refused.
func DecodeEdit(r io.Reader) (EditRequest, error) {
	var req EditRequest
	if err := httpapi.DecodeStrict(r, &req); err != nil {
		return EditRequest{}, err
	}
	if req.ExpectedVersion == nil || *req.ExpectedVersion < 1 {
		return EditRequest{}, readpath.Invalid("expected_version is required: the version of the message the edit is based on (>= 1)")
	}
	if req.Content == nil {
		return EditRequest{}, readpath.Invalid("content is required")
	}
	if err := message.CheckStored(req.Content, req.Head); err != nil {
		return EditRequest{}, readpath.Invalid(err.Error())
	}
	if req.FromUser != nil && *req.FromUser <= 0 {
		return EditRequest{}, readpath.Invalid("from_user must be a positive user id")
	}
	return req, nil
}
