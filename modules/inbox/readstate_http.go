package inbox

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/rs/zerolog"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/ratelimit"
	"github.com/imshard/imshard/modules/readpath"
)

// MaxReadStateBody bounds a PUT …/read or …/me body (a few small fields).
const MaxReadStateBody = 1 << 10

// DecodeRead reads the body of PUT …/read: {"seq": n}, n >= 0.
func DecodeRead(r io.Reader) (int64, error) {
	var req struct {
		Seq *int64 `json:"seq"`
	}
	if err := httpapi.DecodeStrict(r, &req); err != nil {
		return 0, err
	}
	if req.Seq == nil {
		return 0, readpath.Invalid("seq is required")
	}
	if *req.Seq < 0 {
		return 0, readpath.Invalid("seq must be at least 0")
	}
	return *req.Seq, nil
}

// DecodePrefs reads the body of PUT …/me at now: {"pinned"?: bool,
// "notify_muted_until"?: RFC 3339 time within httpapi.CheckTime's bounds,
// or null}; at least one of them.
func DecodePrefs(r io.Reader, now time.Time) (Prefs, error) {
	var req struct {
		Pinned *bool           `json:"pinned"`
		Mute   json.RawMessage `json:"notify_muted_until"`
	}
	if err := httpapi.DecodeStrict(r, &req); err != nil {
		return Prefs{}, err
	}
	p := Prefs{Pinned: req.Pinned}
	switch {
	case req.Mute == nil:
	case bytes.Equal(req.Mute, []byte("null")):
		p.ClearNotifyMut = true
	default:
		const field = "notify_muted_until"
		var s string
		if json.Unmarshal(req.Mute, &s) != nil {
			return Prefs{}, httpapi.InvalidField(field, field+" must be an RFC 3339 time or null")
		}
		t, err := httpapi.ParseTime(field, s, now)
		if err != nil {
			return Prefs{}, err
		}
		p.NotifyMute = &t
	}
	if p.Pinned == nil && p.NotifyMute == nil && !p.ClearNotifyMut {
		return Prefs{}, readpath.Invalid("give pinned or notify_muted_until")
	}
	return p, nil
}

// ParsePaged reads ?limit= and the opaque ?{name}= of the topic list and sync.
func ParsePaged(q url.Values, name string) (limit int, opaque string, err error) {
	for k := range q {
		if k != "limit" && k != name {
			return 0, "", readpath.Invalid("unknown parameter " + k)
		}
	}
	lim, hasLim, err := readpath.Single(q, "limit")
	if err != nil {
		return 0, "", err
	}
	if limit, err = readpath.ParseLimit("limit", lim, hasLim, DefaultTopicsLimit, MaxTopicsLimit); err != nil {
		return 0, "", err
	}
	opaque, _, err = readpath.Single(q, name)
	if len(opaque) > maxOpaque {
		return 0, "", badOpaque(name)
	}
	return limit, opaque, err
}

// Register adds the read-state routes (docs/api.md, docs/openapi.yaml) to
// mux: the cursor and preference moves take one of their caller's changes
// from limits, the lists one of their reads.
func (s *Service) Register(mux *httpapi.Mux, auth *httpapi.Authenticator, log zerolog.Logger, limits *ratelimit.Limiter) {
	h := func(fn httpapi.HandlerFunc) http.Handler { return httpapi.Handle(auth, log, false, fn) }
	mux.Handle("PUT /v1/topics/{topic}/read", h(limits.Changes(s.handleRead)))
	mux.Handle("PUT /v1/topics/{topic}/me", h(limits.Changes(s.handlePrefs)))
	mux.Handle("GET /v1/me/unread", h(limits.Reads(s.handleUnread)))
	mux.Handle("GET /v1/me/topics", h(limits.Reads(s.handleTopics)))
	mux.Handle("GET /v1/me/sync", h(limits.Reads(s.handleSync)))
}

func (s *Service) handleRead(w http.ResponseWriter, r *http.Request, p httpapi.Principal) error {
	seq, err := DecodeRead(http.MaxBytesReader(w, r.Body, MaxReadStateBody))
	if err != nil {
		return err
	}
	out, err := s.MarkRead(r.Context(), p, r.PathValue("topic"), seq)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Service) handlePrefs(w http.ResponseWriter, r *http.Request, p httpapi.Principal) error {
	pr, err := DecodePrefs(http.MaxBytesReader(w, r.Body, MaxReadStateBody), time.Now())
	if err != nil {
		return err
	}
	out, err := s.SetPrefs(r.Context(), p, r.PathValue("topic"), pr)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Service) handleUnread(w http.ResponseWriter, r *http.Request, p httpapi.Principal) error {
	if len(r.URL.Query()) > 0 {
		return readpath.Invalid("GET /v1/me/unread takes no parameters")
	}
	out, err := s.Unread(r.Context(), p)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Service) handleTopics(w http.ResponseWriter, r *http.Request, p httpapi.Principal) error {
	limit, cursor, err := ParsePaged(r.URL.Query(), "cursor")
	if err != nil {
		return err
	}
	out, err := s.Topics(r.Context(), p, limit, cursor)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Service) handleSync(w http.ResponseWriter, r *http.Request, p httpapi.Principal) error {
	limit, token, err := ParsePaged(r.URL.Query(), "token")
	if err != nil {
		return err
	}
	out, err := s.Sync(r.Context(), p, token, limit)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}
