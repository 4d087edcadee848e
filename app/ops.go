package app

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/imshard/imshard/modules/httpapi"
)

// readyTimeout bounds one readiness check of the dependencies.
const readyTimeout = 3 * time.Second

// opsHandler serves the operations endpoints on metrics.addr: /metrics,
// /healthz (the process is alive) and /readyz (it should get traffic).
func (a *App) opsHandler() *httpapi.Mux {
	mux := httpapi.NewMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.Registry, promhttp.HandlerOpts{Registry: a.Registry}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
		defer cancel()
		if err := a.Ready(ctx); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	return mux
}

// readyValue is /readyz as a number for the imshard_ready gauge: the same
// check, at scrape time.
func (a *App) readyValue() float64 {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if a.Ready(ctx) != nil {
		return 0
	}
	return 1
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
