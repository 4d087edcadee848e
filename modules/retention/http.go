package retention

import (
	"net/http"
	"strconv"

	"github.com/rs/zerolog"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/routing"
)

// maxHoldBody bounds a hold's body: no cap on the topics or users of a
// hold, but one request carries at most this many bytes of them (about
// 100,000 targets); a bigger hold is split over several ids.
const maxHoldBody = 4 << 20

// Register adds the routes of retention — holds, group purge, jobs
// (docs/api.md, docs/openapi.yaml) — to mux.
func (r *Retention) Register(mux *httpapi.Mux, auth *httpapi.Authenticator, log zerolog.Logger) {
	h := func(fn httpapi.HandlerFunc) http.Handler { return httpapi.Handle(auth, log, false, fn) }
	mux.Handle("PUT /v1/admin/holds/{id}", h(r.handlePutHold))
	mux.Handle("DELETE /v1/admin/holds/{id}", h(r.handleDeleteHold))
	mux.Handle("GET /v1/admin/holds", h(r.handleHolds))
	mux.Handle("DELETE /v1/topics/{topic}", h(r.handlePurge))
	mux.Handle("POST /v1/admin/users/{uid}/erase", h(r.handleErase))
	mux.Handle("GET /v1/admin/jobs/{id}", h(r.handleJob))
	mux.Handle("POST /v1/admin/jobs/{id}/pause", h(r.handlePause(true)))
	mux.Handle("POST /v1/admin/jobs/{id}/resume", h(r.handlePause(false)))
}

// requireService lets the service and admin roles through (group purge
// and its job).
func requireService(p httpapi.Principal) error {
	if p.Role != httpapi.RoleService && p.Role != httpapi.RoleAdmin {
		return httpapi.Errorf(httpapi.CodePermissionDenied, "service or admin role required")
	}
	return nil
}

func (r *Retention) handlePurge(w http.ResponseWriter, req *http.Request, p httpapi.Principal) error {
	if err := requireService(p); err != nil {
		return err
	}
	topic := req.PathValue("topic")
	if err := routing.ValidTopic(topic); err != nil {
		return err
	}
	if q := req.URL.Query(); q.Get("purge") != "true" || len(q) != 1 || len(q["purge"]) != 1 {
		return invalid("purge", "a topic is deleted only with purge=true (its whole history, as a job)")
	}
	j, err := r.StartPurge(req.Context(), p.Tenant, topic)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusAccepted, j)
	return nil
}

func (r *Retention) handleErase(w http.ResponseWriter, req *http.Request, p httpapi.Principal) error {
	if err := requireService(p); err != nil {
		return err
	}
	user, err := positiveID(req.PathValue("uid"), "uid")
	if err != nil {
		return err
	}
	j, err := r.StartErase(req.Context(), p.Tenant, user)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusAccepted, j)
	return nil
}

// positiveID parses a path id: a positive decimal integer.
func positiveID(s, field string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 || strconv.FormatInt(id, 10) != s {
		return 0, invalid(field, field+" must be a positive decimal integer")
	}
	return id, nil
}

// pathJob is the job id of a job request, after its role check.
func pathJob(req *http.Request, p httpapi.Principal) (int64, error) {
	if err := requireService(p); err != nil {
		return 0, err
	}
	return positiveID(req.PathValue("id"), "id")
}

func (r *Retention) handleJob(w http.ResponseWriter, req *http.Request, p httpapi.Principal) error {
	id, err := pathJob(req, p)
	if err != nil {
		return err
	}
	j, err := r.Job(req.Context(), p.Tenant, id)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, j)
	return nil
}

func (r *Retention) handlePause(pause bool) httpapi.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request, p httpapi.Principal) error {
		id, err := pathJob(req, p)
		if err != nil {
			return err
		}
		j, err := r.SetPaused(req.Context(), p.Tenant, id, pause)
		if err != nil {
			return err
		}
		httpapi.WriteJSON(w, http.StatusOK, j)
		return nil
	}
}

func requireAdmin(p httpapi.Principal) error {
	if p.Role != httpapi.RoleAdmin {
		return httpapi.Errorf(httpapi.CodePermissionDenied, "admin role required")
	}
	return nil
}

// pathHold is the hold id of an admin request, after its role check.
func pathHold(req *http.Request, p httpapi.Principal) (string, error) {
	if err := requireAdmin(p); err != nil {
		return "", err
	}
	id := req.PathValue("id")
	return id, ValidHoldID(id)
}

func (r *Retention) handlePutHold(w http.ResponseWriter, req *http.Request, p httpapi.Principal) error {
	id, err := pathHold(req, p)
	if err != nil {
		return err
	}
	var q HoldRequest
	if err := httpapi.DecodeStrict(http.MaxBytesReader(w, req.Body, maxHoldBody), &q); err != nil {
		return err
	}
	if err := q.Check(p.Tenant); err != nil {
		return err
	}
	h, err := r.PutHold(req.Context(), p.Tenant, id, q)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, h)
	return nil
}

func (r *Retention) handleDeleteHold(w http.ResponseWriter, req *http.Request, p httpapi.Principal) error {
	id, err := pathHold(req, p)
	if err != nil {
		return err
	}
	if err := r.DeleteHold(req.Context(), p.Tenant, id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (r *Retention) handleHolds(w http.ResponseWriter, req *http.Request, p httpapi.Principal) error {
	if err := requireAdmin(p); err != nil {
		return err
	}
	holds, err := r.Holds(req.Context(), p.Tenant)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, struct {
		Holds []Hold `json:"holds"`
	}{holds})
	return nil
}
