package httpapi

import (
	"net/http"

	"github.com/rs/zerolog"
)

// HandlerFunc is an authenticated handler; a returned error becomes the
// error envelope (its code from Classify).
type HandlerFunc func(w http.ResponseWriter, r *http.Request, p Principal) error

// Handle authenticates each request before fn runs. allowQuery accepts
// ?access_token= (WebSocket).
func Handle(auth *Authenticator, log zerolog.Logger, allowQuery bool, fn HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := auth.Authenticate(r, allowQuery)
		if err != nil {
			WriteError(w, r, log, err)
			return
		}
		if err := fn(w, r, p); err != nil {
			WriteError(w, r, log, err)
		}
	})
}
