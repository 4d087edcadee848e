package keyset

import (
	"context"
	"crypto"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/time/rate"

	"github.com/imshard/imshard/config"
)

// FetchTimeout bounds one JWKS fetch. A token with an unknown kid waits for
// the fetch it causes, so this is also the longest such a request waits.
const FetchTimeout = 10 * time.Second

// jwks is one tenant's JWKS: fetched at start, then every refresh interval
// in the background, and again — at most once per interval — when a token
// names a kid it lacks. A failed fetch keeps the keys of the last good one.
type jwks struct {
	tenant, url string
	kf          keyfunc.Keyfunc
	// store holds what the last successful fetch returned; read directly
	// (Holds) it never causes a fetch
	store  *jwkset.MemoryJWKSet
	cancel context.CancelFunc
}

// jwksParams are what a tenant's JWKS reports to: the registry's metrics,
// log and key-removal signal.
type jwksParams struct {
	interval time.Duration
	client   *http.Client
	fetched  func(j *jwks, kids []string, removed bool)
	failed   func(j *jwks, err error)
}

// startJWKS fetches url once (a failure leaves the set empty until a later
// fetch succeeds, and is reported) and starts its background refresh,
// which ends with ctx or close.
func startJWKS(ctx context.Context, tenant, url string, p jwksParams) (*jwks, error) {
	ctx, cancel := context.WithCancel(ctx)
	j := &jwks{tenant: tenant, url: url, store: jwkset.NewMemoryStorage(), cancel: cancel}
	remote, err := jwkset.NewStorageFromHTTP(url, jwkset.HTTPClientStorageOptions{
		Client:                    p.client,
		Ctx:                       ctx,
		HTTPTimeout:               FetchTimeout,
		NoErrorReturnFirstHTTPReq: true,
		RefreshErrorHandler:       func(_ context.Context, err error) { p.failed(j, err) },
		RefreshInterval:           p.interval,
		Storage:                   &observed{MemoryJWKSet: j.store, j: j, fetched: p.fetched},
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("keyset: JWKS of tenant %s: %w", tenant, err)
	}
	client, err := jwkset.NewHTTPClient(jwkset.HTTPClientOptions{
		HTTPURLs: map[string]jwkset.Storage{url: remote},
		// A token of an unknown kid fetches again only if none did within
		// the interval; the others fail at once rather than queue, as the
		// wait for the limiter may not exceed one fetch's timeout (which
		// also bounds that fetch).
		RefreshUnknownKID: rate.NewLimiter(rate.Every(p.interval), 1),
		RateLimitWaitMax:  FetchTimeout,
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("keyset: JWKS of tenant %s: %w", tenant, err)
	}
	// A JWK without "use" is a signing key as much as one with "sig".
	j.kf, err = keyfunc.New(keyfunc.Options{Ctx: ctx, Storage: client, UseWhitelist: []jwkset.USE{jwkset.UseSig, ""}})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("keyset: JWKS of tenant %s: %w", tenant, err)
	}
	return j, nil
}

// close ends the background refresh.
func (j *jwks) close() { j.cancel() }

// key is the JWKS key of kid for t, which must verify alg: the key type
// decides the one algorithm it verifies (config.PublicKeyAlg), whatever
// the JWK or the token says, so an RSA key never checks an HS256 token and
// a symmetric JWK checks nothing.
func (j *jwks) key(t *jwt.Token, kid, alg string) (Key, error) {
	m, err := j.kf.Keyfunc(t)
	if err != nil {
		if _, held := j.store.KeyRead(context.Background(), kid); held == nil {
			return Key{}, fmt.Errorf("%w: %w", ErrAlgorithm, err) // held, refused for its alg or use
		}
		return Key{}, fmt.Errorf("%w: %w", ErrUnknownKey, err)
	}
	if a, err := config.PublicKeyAlg(m); err != nil || a != alg {
		return Key{}, ErrAlgorithm
	}
	return Key{KID: kid, Alg: alg, Material: m}, nil
}

// holds reports whether the last fetch still gives k's kid k's material.
func (j *jwks) holds(k Key) bool {
	jwk, err := j.store.KeyRead(context.Background(), k.KID)
	if err != nil {
		return false
	}
	m := jwk.Key()
	if pk, ok := m.(interface{ Public() crypto.PublicKey }); ok {
		m = pk.Public()
	}
	return k.Equal(Key{KID: k.KID, Alg: k.Alg, Material: m})
}

// observed is the store a fetch replaces whole; it tells the registry of
// each successful fetch, and whether it dropped a kid the set held.
type observed struct {
	*jwkset.MemoryJWKSet
	j       *jwks
	fetched func(j *jwks, kids []string, removed bool)
	// mu makes a background refresh and one for an unknown kid replace the
	// keys one after the other, so neither misses a kid the other dropped
	mu sync.Mutex
}

func (o *observed) KeyReplaceAll(ctx context.Context, given []jwkset.JWK) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	before, err := o.MemoryJWKSet.KeyReadAll(ctx)
	if err != nil {
		return err
	}
	if err := o.MemoryJWKSet.KeyReplaceAll(ctx, given); err != nil {
		return err
	}
	kids := make([]string, 0, len(given))
	for _, k := range given {
		kids = append(kids, k.Marshal().KID)
	}
	removed := slices.ContainsFunc(before, func(k jwkset.JWK) bool { return !slices.Contains(kids, k.Marshal().KID) })
	o.fetched(o.j, kids, removed)
	return nil
}
