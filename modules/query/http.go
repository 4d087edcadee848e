package query

import (
	"net/http"

	"github.com/rs/zerolog"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/readpath"
)

// Register adds the read routes (docs/api.md, docs/openapi.yaml) to mux.
func (s *Service) Register(mux *httpapi.Mux, auth *httpapi.Authenticator, log zerolog.Logger) {
	h := func(fn httpapi.HandlerFunc) http.Handler { return httpapi.Handle(auth, log, false, fn) }
	mux.Handle("GET /v1/topics/{topic}/messages", h(s.handleList))
	mux.Handle("GET /v1/topics/{topic}/messages/{seq}", h(s.handleGet))
	mux.Handle("GET /v1/topics/{topic}/messages/{seq}/context", h(s.handleContext))
	mux.Handle("GET /v1/topics/{topic}/search", h(s.handleSearch))
	mux.Handle("POST /v1/topics/{topic}/deletions", h(s.handleDeletions))
	mux.Handle("DELETE /v1/topics/{topic}/messages/{seq}", h(s.handleDelete))
	mux.Handle("PATCH /v1/topics/{topic}/messages/{seq}", h(s.handleEdit))
	mux.Handle("POST /v1/topics/{topic}/messages/{seq}/recall", h(s.handleRecall))
	mux.Handle("GET /v1/messages/{message_id}", h(s.handleMessageByID))
	mux.Handle("GET /v1/admin/messages/{message_id}", h(s.handleAdminMessage))
	mux.Handle("GET /v1/admin/shards", h(s.handleShards))
	mux.Handle("GET /v1/admin/migrations", h(s.handleMigrations))
	mux.Handle("GET /v1/admin/topics/{topic}/route", h(s.handleRoute))
	s.registerReadState(mux, h)
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
	req, err := ParseSearch(r.URL.Query())
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

type hideResponse struct {
	Topic string `json:"topic"`
	Low   int64  `json:"low"`
	Hi    int64  `json:"hi"`
}

func (s *Service) handleDeletions(w http.ResponseWriter, r *http.Request, p httpapi.Principal) error {
	req, err := DecodeDeletion(http.MaxBytesReader(w, r.Body, MaxDeletionBody))
	if err != nil {
		return err
	}
	topic := r.PathValue("topic")
	if err := s.Hide(r.Context(), p, topic, req.Low, req.Hi); err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, hideResponse{Topic: topic, Low: req.Low, Hi: req.Hi})
	return nil
}

// handleDelete hides one message for the caller (scope=me) or deletes it
// for everyone (scope=all, role admin).
func (s *Service) handleDelete(w http.ResponseWriter, r *http.Request, p httpapi.Principal) error {
	seq, err := readpath.PathSeq(r)
	if err != nil {
		return err
	}
	scope, err := ParseScope(r.URL.Query())
	if err != nil {
		return err
	}
	topic := r.PathValue("topic")
	if scope == ScopeAll {
		return s.answerChange(w, message.ActionDelete, func() (ChangeResult, error) {
			reason, err := ParseReason(r.URL.Query())
			if err != nil {
				return ChangeResult{}, err
			}
			return s.DeleteAll(r.Context(), p, topic, seq, reason)
		})
	}
	if err := s.Hide(r.Context(), p, topic, seq, seq+1); err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, hideResponse{Topic: topic, Low: seq, Hi: seq + 1})
	return nil
}

func (s *Service) handleRecall(w http.ResponseWriter, r *http.Request, p httpapi.Principal) error {
	return s.answerChange(w, message.ActionRecall, func() (ChangeResult, error) {
		seq, err := readpath.PathSeq(r)
		if err != nil {
			return ChangeResult{}, err
		}
		reason, err := DecodeRecall(http.MaxBytesReader(w, r.Body, MaxChangeBody))
		if err != nil {
			return ChangeResult{}, err
		}
		return s.Recall(r.Context(), p, r.PathValue("topic"), seq, reason)
	})
}

func (s *Service) handleEdit(w http.ResponseWriter, r *http.Request, p httpapi.Principal) error {
	return s.answerChange(w, message.ActionEdit, func() (ChangeResult, error) {
		seq, err := readpath.PathSeq(r)
		if err != nil {
			return ChangeResult{}, err
		}
		req, err := DecodeEdit(http.MaxBytesReader(w, r.Body, s.maxEditBody()))
		if err != nil {
			return ChangeResult{}, err
		}
		return s.Edit(r.Context(), p, r.PathValue("topic"), seq, req)
	})
}

// answerChange runs one change request, counts it and answers it.
func (s *Service) answerChange(w http.ResponseWriter, action string, fn func() (ChangeResult, error)) error {
	res, err := s.counted(action, fn)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, res)
	return nil
}
