package app

import (
	"context"

	"github.com/imshard/imshard/modules/httpapi"
)

// Keys is the live key set of every tenant, which the HTTP roles verify
// tokens with: built from the configuration in New, replaced by each
// reload (so a key added or removed takes effect at once), and completed
// by the tenants' JWKS once module keys has started.
func (a *App) Keys() httpapi.KeySets { return a.keys }

// initKeys fetches the JWKS of every tenant that has a jwks_url, then
// keeps them fresh in the background until the process stops; a JWKS
// fetch that drops a key ends the sockets it verified, as a reload does.
func initKeys(ctx context.Context, a *App) (Service, error) {
	a.keys.Start(a.reload.live.Tenants)
	return holder{close: func() error { a.keys.Close(); return nil }}, nil
}
