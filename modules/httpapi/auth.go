package httpapi

import (
	"crypto/hmac"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/imshard/imshard/modules/message"
)

// Roles a credential may carry besides a plain user.
const (
	RoleUser    = ""
	RoleService = "service" // manages groups and members; may send for a member
	RoleAdmin   = "admin"   // global delete, admin routes
)

// Principal is who a request acts as. The tenant comes only from here —
// from the verified credential — never from a parameter (invariant 10, docs/invariants.md).
type Principal struct {
	Tenant string
	UserID int64
	Role   string
	// Expires is the credential's exp: a long-lived connection (the
	// realtime stream) ends there.
	Expires time.Time
}

// Secrets looks up a tenant's JWT secret; ok is false for unknown tenants.
type Secrets func(tenant string) (secret []byte, ok bool)

// Claims of an imshard token. Times are RFC 7519 NumericDates: JSON
// numbers of seconds since the epoch (a string is refused).
type Claims struct {
	Tenant    string       `json:"tid"`
	Subject   string       `json:"sub"`
	Role      string       `json:"role,omitempty"`
	ExpiresAt *NumericDate `json:"exp,omitempty"`
	IssuedAt  *NumericDate `json:"iat,omitempty"`
	NotBefore *NumericDate `json:"nbf,omitempty"`
}

// NumericDate is a JWT time claim that must be a JSON number.
type NumericDate struct{ jwt.NumericDate }

// NewNumericDate is t as a claim, truncated to the second.
func NewNumericDate(t time.Time) *NumericDate { return &NumericDate{*jwt.NewNumericDate(t)} }

// UnmarshalJSON accepts a JSON number only: RFC 7519 defines NumericDate
// as one, and a quoted "1700000000" is a client bug better told than
// guessed at.
func (d *NumericDate) UnmarshalJSON(b []byte) error {
	if len(b) == 0 || b[0] != '-' && (b[0] < '0' || b[0] > '9') {
		return errors.New("a NumericDate claim must be a JSON number")
	}
	return d.NumericDate.UnmarshalJSON(b)
}

func (d *NumericDate) jwt() *jwt.NumericDate {
	if d == nil {
		return nil
	}
	return &d.NumericDate
}

// The jwt.Claims methods: the library validates exp, nbf and iat.

func (c *Claims) GetExpirationTime() (*jwt.NumericDate, error) { return c.ExpiresAt.jwt(), nil }
func (c *Claims) GetIssuedAt() (*jwt.NumericDate, error)       { return c.IssuedAt.jwt(), nil }
func (c *Claims) GetNotBefore() (*jwt.NumericDate, error)      { return c.NotBefore.jwt(), nil }
func (c *Claims) GetIssuer() (string, error)                   { return "", nil }
func (c *Claims) GetSubject() (string, error)                  { return c.Subject, nil }
func (c *Claims) GetAudience() (jwt.ClaimStrings, error)       { return nil, nil }

// Authenticator verifies HS256 tokens with the secret of the tenant they
// name, so a token signed for one tenant can never act in another.
type Authenticator struct {
	secrets Secrets
	maxTTL  time.Duration
	leeway  time.Duration
	now     func() time.Time
	cache   tokenCache
}

// Leeway is the clock skew tolerated on exp, nbf, iat and the lifetime.
const Leeway = 30 * time.Second

// NewAuthenticator verifies with secrets; maxTTL (auth.max_token_ttl) is
// the longest lifetime a token may have.
func NewAuthenticator(secrets Secrets, maxTTL time.Duration) *Authenticator {
	return &Authenticator{secrets: secrets, maxTTL: maxTTL, leeway: Leeway, now: time.Now,
		cache: tokenCache{m: map[string]verified{}}}
}

var errUnauth = Errorf(CodeUnauthenticated, "missing or invalid credentials")

// subPattern is a user id as sub must write it: a positive decimal
// without sign, leading zeros or spaces, at most 19 digits.
var subPattern = regexp.MustCompile(`^[1-9][0-9]{0,18}$`)

// Verify parses and checks a token: HS256 only, signed with the secret of its
// own tid; exp required, a number, not past (within the leeway); iat, when
// present, a number not in the future; a lifetime — exp − iat, or exp − now
// without iat — of at most maxTTL (plus the leeway); sub a user id matching
// ^[1-9][0-9]{0,18}$ that fits in 63 bits; role known.
//
// A token it accepted is remembered (tokenCache): the same token again skips
// the parse and the HMAC while it has not expired and its tenant's secret is
// still the one that verified it.
func (a *Authenticator) Verify(token string) (Principal, error) {
	now := a.now()
	if p, ok := a.cache.get(token, now, a.secrets); ok {
		return p, nil
	}
	p, secret, err := a.verify(token, now)
	if err != nil {
		return Principal{}, err
	}
	a.cache.put(token, verified{p: p, secret: secret, until: p.Expires.Add(a.leeway)})
	return p, nil
}

// verify is Verify without the cache; secret is the one the token was
// verified with.
func (a *Authenticator) verify(token string, now time.Time) (Principal, []byte, error) {
	if err := checkTokenJSON(token); err != nil {
		return Principal{}, nil, Wrap(CodeUnauthenticated, err.Error(), err)
	}
	var claims Claims
	var secret []byte
	parser := jwt.NewParser(jwt.WithValidMethods([]string{"HS256"}), jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(), jwt.WithLeeway(a.leeway), jwt.WithTimeFunc(func() time.Time { return now }))
	_, err := parser.ParseWithClaims(token, &claims, func(t *jwt.Token) (any, error) {
		c, ok := t.Claims.(*Claims)
		if !ok || c.Tenant == "" {
			return nil, errors.New("no tid claim")
		}
		if secret, ok = a.secrets(c.Tenant); !ok {
			return nil, errors.New("unknown tenant")
		}
		return secret, nil
	})
	if err != nil {
		return Principal{}, nil, Wrap(CodeUnauthenticated, "missing or invalid credentials", err)
	}
	from := now
	if claims.IssuedAt != nil {
		from = claims.IssuedAt.Time
	}
	if claims.ExpiresAt.Sub(from) > a.maxTTL+a.leeway {
		return Principal{}, nil, Errorf(CodeUnauthenticated, "token lifetime exceeds "+a.maxTTL.String())
	}
	uid, err := strconv.ParseInt(claims.Subject, 10, 64)
	if err != nil || !subPattern.MatchString(claims.Subject) {
		return Principal{}, nil, Wrap(CodeUnauthenticated, "sub must be a positive decimal user id", err)
	}
	switch claims.Role {
	case RoleUser, RoleService, RoleAdmin:
	default:
		return Principal{}, nil, Errorf(CodeUnauthenticated, "unknown role claim")
	}
	return Principal{Tenant: claims.Tenant, UserID: uid, Role: claims.Role, Expires: claims.ExpiresAt.Time}, secret, nil
}

// checkTokenJSON refuses a token whose header or claims, once decoded, are
// JSON the request bodies would be refused for (message.CheckJSON): above all
// a repeated key, since parsers disagree on which "tid" or "sub" of two
// wins, and whoever issued the token may have checked the other one. A
// segment that is not base64url is left to the parser to refuse.
func checkTokenJSON(token string) error {
	segs := strings.Split(token, ".")
	if len(segs) != 3 {
		return nil
	}
	for i, what := range []string{"token header", "token payload"} {
		b, err := base64.RawURLEncoding.DecodeString(segs[i])
		if err != nil {
			return nil
		}
		if err := message.CheckJSON(b, 0); err != nil {
			return fmt.Errorf("%s %w", what, err)
		}
	}
	return nil
}

// maxCachedTokens bounds the verified tokens kept (a few MiB at most); past
// it an arbitrary entry makes room, so a burst of distinct tokens costs
// only their own parses.
const maxCachedTokens = 16384

// tokenCache remembers tokens Verify accepted, keyed by the token's exact
// text. Of Verify's checks only exp can turn a passing token into a failing
// one as time goes on (nbf, iat and the lifetime only ever get easier to
// meet, and maxTTL is fixed), so an entry holds until exp plus the leeway;
// the tenant's secret is looked up again on every hit, so a reload that
// changes or removes it refuses the token at once, as a fresh parse would.
// Refusals are never kept.
type tokenCache struct {
	mu sync.RWMutex
	m  map[string]verified
}

type verified struct {
	p      Principal
	secret []byte    // the secret that verified the token
	until  time.Time // exp + leeway: from then on the token is expired
}

func (c *tokenCache) get(token string, now time.Time, secrets Secrets) (Principal, bool) {
	c.mu.RLock()
	v, ok := c.m[token]
	c.mu.RUnlock()
	if !ok || !now.Before(v.until) {
		return Principal{}, false
	}
	if secret, ok := secrets(v.p.Tenant); !ok || !hmac.Equal(secret, v.secret) {
		return Principal{}, false
	}
	return v.p, true
}

func (c *tokenCache) put(token string, v verified) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[token]; !ok && len(c.m) >= maxCachedTokens {
		for k := range c.m { // a map's iteration starts anywhere: an arbitrary victim
			delete(c.m, k)
			break
		}
	}
	c.m[token] = v
}

// Token extracts the bearer token of r: the Authorization header, or
// ?access_token= where allowQuery (WebSocket upgrades cannot set headers).
func Token(r *http.Request, allowQuery bool) string {
	if h := r.Header.Get("Authorization"); h != "" {
		// the scheme is case-insensitive (RFC 9110 §11.1): Bearer, bearer, BEARER
		scheme, tok, ok := strings.Cut(h, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			return ""
		}
		return strings.TrimSpace(tok)
	}
	if allowQuery {
		return r.URL.Query().Get("access_token")
	}
	return ""
}

// Authenticate verifies r's credential.
func (a *Authenticator) Authenticate(r *http.Request, allowQuery bool) (Principal, error) {
	tok := Token(r, allowQuery)
	if tok == "" {
		return Principal{}, errUnauth
	}
	return a.Verify(tok)
}

// Sign makes a token (tests, `imshard bench`, operator tooling).
func Sign(secret []byte, tenant string, userID int64, role string, ttl time.Duration) (string, error) {
	now := time.Now()
	claims := &Claims{Tenant: tenant, Role: role, Subject: strconv.FormatInt(userID, 10),
		ExpiresAt: NewNumericDate(now.Add(ttl)), IssuedAt: NewNumericDate(now)}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(secret)
}
