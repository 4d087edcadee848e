package changes

import (
	"net/http"

	"github.com/rs/zerolog"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/ratelimit"
	"github.com/imshard/imshard/modules/readpath"
)

// Register adds the change routes (docs/api.md, docs/openapi.yaml) to mux;
// each request takes one of its caller's changes from limits.
func (s *Service) Register(mux *httpapi.Mux, auth *httpapi.Authenticator, log zerolog.Logger, limits *ratelimit.Limiter) {
	h := func(fn httpapi.HandlerFunc) http.Handler { return httpapi.Handle(auth, log, false, limits.Changes(fn)) }
	mux.Handle("POST /v1/topics/{topic}/deletions", h(s.handleDeletions))
	mux.Handle("DELETE /v1/topics/{topic}/messages/{seq}", h(s.handleDelete))
	mux.Handle("PATCH /v1/topics/{topic}/messages/{seq}", h(s.handleEdit))
	mux.Handle("POST /v1/topics/{topic}/messages/{seq}/recall", h(s.handleRecall))
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
