package query

import (
	"net/http"
	"time"

	"github.com/rs/zerolog"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/ratelimit"
	"github.com/imshard/imshard/modules/readpath"
)

// Register adds the read routes (docs/api.md, docs/openapi.yaml) to mux;
// each request takes one of its caller's reads from limits.
func (s *Service) Register(mux *httpapi.Mux, auth *httpapi.Authenticator, log zerolog.Logger, limits *ratelimit.Limiter) {
	h := func(fn httpapi.HandlerFunc) http.Handler { return httpapi.Handle(auth, log, false, limits.Reads(fn)) }
	mux.Handle("GET /v1/topics/{topic}/messages", h(s.handleList))
	mux.Handle("GET /v1/topics/{topic}/messages/{seq}", h(s.handleGet))
	mux.Handle("GET /v1/topics/{topic}/messages/{seq}/context", h(s.handleContext))
	mux.Handle("GET /v1/topics/{topic}/search", h(s.handleSearch))
	mux.Handle("GET /v1/messages/{message_id}", h(s.handleMessageByID))
	mux.Handle("GET /v1/admin/messages/{message_id}", h(s.handleAdminMessage))
	mux.Handle("GET /v1/admin/shards", h(s.handleShards))
	mux.Handle("GET /v1/admin/migrations", h(s.handleMigrations))
	mux.Handle("GET /v1/admin/topics/{topic}/route", h(s.handleRoute))
}

func (s *Service) handleList(w http.ResponseWriter, r *http.Request, p httpapi.Principal) error {
	req, err := ParseList(r.URL.Query())
	if err != nil {
		return err
	}
	topic := r.PathValue("topic")
	if req.HasSince {
		page, err := s.Since(r.Context(), p, topic, req.Since, req.Limit)
		if err != nil {
			return err
		}
		return readpath.WritePage(w, page.AppendJSON)
	}
	page, err := s.Before(r.Context(), p, topic, req.Before, req.Limit)
	if err != nil {
		return err
	}
	return readpath.WritePage(w, page.AppendJSON)
}

func (s *Service) handleGet(w http.ResponseWriter, r *http.Request, p httpapi.Principal) error {
	seq, err := readpath.PathSeq(r)
	if err != nil {
		return err
	}
	m, err := s.Get(r.Context(), p, r.PathValue("topic"), seq)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, m)
	return nil
}

func (s *Service) handleContext(w http.ResponseWriter, r *http.Request, p httpapi.Principal) error {
	seq, err := readpath.PathSeq(r)
	if err != nil {
		return err
	}
	nb, na, err := ParseContext(r.URL.Query())
	if err != nil {
		return err
	}
	ms, err := s.Context(r.Context(), p, r.PathValue("topic"), seq, nb, na)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, struct {
		Messages any `json:"messages"`
	}{ms})
	return nil
}

func (s *Service) handleSearch(w http.ResponseWriter, r *http.Request, p httpapi.Principal) error {
	req, err := ParseSearch(r.URL.Query(), time.Now())
	if err != nil {
		return err
	}
	page, err := s.Search(r.Context(), p, r.PathValue("topic"), req)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, page)
	return nil
}

func (s *Service) handleAdminMessage(w http.ResponseWriter, r *http.Request, p httpapi.Principal) error {
	id, err := readpath.ParseCursor("message_id", r.PathValue("message_id"), 1)
	if err != nil {
		return err
	}
	loc, err := s.AdminMessage(r.Context(), p, id)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, loc)
	return nil
}

func (s *Service) handleMessageByID(w http.ResponseWriter, r *http.Request, p httpapi.Principal) error {
	id, err := readpath.ParseCursor("message_id", r.PathValue("message_id"), 1)
	if err != nil {
		return err
	}
	m, err := s.MessageByID(r.Context(), p, id)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, m)
	return nil
}

func (s *Service) handleMigrations(w http.ResponseWriter, r *http.Request, p httpapi.Principal) error {
	out, err := s.Migrations(r.Context(), p)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Service) handleShards(w http.ResponseWriter, r *http.Request, p httpapi.Principal) error {
	out, err := s.Shards(r.Context(), p)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Service) handleRoute(w http.ResponseWriter, r *http.Request, p httpapi.Principal) error {
	out, err := s.TopicRoute(r.Context(), p, r.PathValue("topic"))
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}
