package changes

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"unicode/utf8"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/readpath"
)

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

// Delete scopes of DELETE …/messages/{seq}.
const (
	ScopeMe  = "me"
	ScopeAll = "all"
)
