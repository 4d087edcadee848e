package retention

import (
	"net/http"

	"github.com/rs/zerolog"

	"github.com/imshard/imshard/modules/httpapi"
)

// maxHoldBody bounds a hold's body: no cap on the topics or users of a
// hold, but one request carries at most this many bytes of them (about
// 100,000 targets); a bigger hold is split over several ids.
const maxHoldBody = 4 << 20

// Register adds the admin routes of retention (docs/api.md,
// docs/openapi.yaml) to mux.
func (r *Retention) Register(mux *httpapi.Mux, auth *httpapi.Authenticator, log zerolog.Logger) {
	h := func(fn httpapi.HandlerFunc) http.Handler { return httpapi.Handle(auth, log, false, fn) }
	mux.Handle("PUT /v1/admin/holds/{id}", h(r.handlePutHold))
	mux.Handle("DELETE /v1/admin/holds/{id}", h(r.handleDeleteHold))
	mux.Handle("GET /v1/admin/holds", h(r.handleHolds))
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
