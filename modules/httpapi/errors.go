// Package httpapi is what every HTTP role shares: authentication of the
// tenant's JWT, the error envelope and its codes, and JSON helpers. Typed
// errors map to API codes here and nowhere else.
package httpapi

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/rs/zerolog"

	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/tenantdb"
)

// Codes of the error envelope (docs/api.md).
const (
	CodeInvalidArgument  = "invalid_argument"
	CodeUnauthenticated  = "unauthenticated"
	CodePermissionDenied = "permission_denied"
	CodeNotFound         = "not_found"
	CodeConflict         = "conflict"
	CodeTooLarge         = "too_large"
	CodeRateLimited      = "rate_limited"
	CodeUnavailable      = "unavailable"
	CodeInternal         = "internal"
)

var codeStatus = map[string]int{
	CodeInvalidArgument:  http.StatusBadRequest,
	CodeUnauthenticated:  http.StatusUnauthorized,
	CodePermissionDenied: http.StatusForbidden,
	CodeNotFound:         http.StatusNotFound,
	CodeConflict:         http.StatusConflict,
	CodeTooLarge:         http.StatusRequestEntityTooLarge,
	CodeRateLimited:      http.StatusTooManyRequests,
	CodeUnavailable:      http.StatusServiceUnavailable,
	CodeInternal:         http.StatusInternalServerError,
}

// Error is an error with an API code; modules return it for anything the
// client should see as other than internal.
type Error struct {
	Code    string
	Message string
	// Details is the optional machine-readable part of the envelope, for a
	// client that needs more than the code: the current version of a
	// conflicting edit, how long to wait before a retry, a migration state.
	Details map[string]any
	// Header holds response header fields the answer carries besides the
	// envelope (a refusal's Retry-After and RateLimit fields).
	Header http.Header
	Err    error
}

func (e *Error) Error() string {
	if e.Err != nil {
		return e.Code + ": " + e.Message + ": " + e.Err.Error()
	}
	return e.Code + ": " + e.Message
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf builds an *Error with a code and a client-facing message.
func Errorf(code, msg string) *Error { return &Error{Code: code, Message: msg} }

// WithDetails sets the envelope's details object and returns e.
func (e *Error) WithDetails(details map[string]any) *Error {
	e.Details = details
	return e
}

// WithHeader adds a response header field to the answer and returns e.
func (e *Error) WithHeader(name, value string) *Error {
	if e.Header == nil {
		e.Header = http.Header{}
	}
	e.Header.Add(name, value)
	return e
}

// Wrap attaches a code and message to a cause kept for logs.
func Wrap(code, msg string, err error) *Error { return &Error{Code: code, Message: msg, Err: err} }

// Classify maps any error to its API code and client message. Errors of the
// routing core have fixed meanings; everything unknown is internal, and its
// text stays in the log, not in the response.
func Classify(err error) (code, msg string) {
	code, msg, _ = classify(err)
	return code, msg
}

// HasCode reports whether err is answered with code.
func HasCode(err error, code string) bool {
	c, _ := Classify(err)
	return c == code
}

func classify(err error) (code, msg string, details map[string]any) {
	var e *Error
	var mig *routing.ErrMigrationPending
	var unknown *routing.ErrMigrationStateUnknown
	switch {
	case errors.Is(err, routing.ErrPlacementMoved):
		// first, whatever wraps it: a write the placement fence refused
		// wrote nothing, whichever module it came from
		return CodeConflict, "the tenant is switching to another database server; nothing changed, retry after retry_after_ms",
			map[string]any{"reason": "tenant_moving", "retry_after_ms": routing.MovingRetryAfter.Milliseconds()}
	case errors.As(err, &e):
		return e.Code, e.Message, e.Details
	case errors.As(err, &mig):
		return CodeUnavailable, mig.Error(), map[string]any{"migration": "pending", "state": mig.State.String()}
	case errors.Is(err, tenantdb.ErrUnknownTenant):
		// a credential verified before a reload removed its tenant: refused
		// as the same token is from now on
		return CodeUnauthenticated, "tenant not configured", nil
	case errors.As(err, &unknown):
		return CodeUnavailable, unknown.Error(), map[string]any{"migration": "unknown",
			"retry_after_ms": routing.MigrationRefresh.Milliseconds()}
	case errors.Is(err, routing.ErrInvalidTopic):
		return CodeInvalidArgument, "invalid topic: want ^[A-Za-z0-9_-]{1,64}$", nil
	case errors.Is(err, routing.ErrInvalidMonth), errors.Is(err, routing.ErrInvalidTable), errors.Is(err, routing.ErrInvalidTenant):
		return CodeInvalidArgument, err.Error(), nil
	case errors.Is(err, routing.ErrNoActiveMonth):
		return CodeUnavailable, "no active month: the shard manager has not activated one yet", nil
	case errors.Is(err, routing.ErrShardNotRegistered):
		return CodeUnavailable, "month table not ready", nil
	}
	return CodeInternal, "internal error", nil
}

// Status is the HTTP status of a code.
func Status(code string) int {
	if s, ok := codeStatus[code]; ok {
		return s
	}
	return http.StatusInternalServerError
}

type envelope struct {
	Error struct {
		Code    string         `json:"code"`
		Message string         `json:"message"`
		Details map[string]any `json:"details,omitempty"`
	} `json:"error"`
}

// WriteError answers with the error envelope; internal and unavailable
// errors are logged with their cause (once, here, where they are handled).
func WriteError(w http.ResponseWriter, r *http.Request, log zerolog.Logger, err error) {
	code, msg, details := classify(err)
	var mig *routing.ErrMigrationPending
	if (code == CodeInternal || code == CodeUnavailable) && !errors.As(err, &mig) {
		log.Error().Err(err).Str("method", r.Method).Str("path", r.URL.Path).Str("code", code).Msg("request failed")
	}
	var e *Error
	if errors.As(err, &e) {
		for name, values := range e.Header {
			w.Header()[name] = values
		}
	}
	var env envelope
	env.Error.Code, env.Error.Message, env.Error.Details = code, msg, details
	WriteJSON(w, Status(code), env)
}

// WriteJSON answers with v as JSON.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
