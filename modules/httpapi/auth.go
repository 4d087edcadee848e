package httpapi

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/keyset"
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
	// KeyID is the kid of the key that verified the credential ("" for the
	// tenant's jwt_secret): a socket ends when that key leaves the set.
	KeyID string
}

// KeySets is where an Authenticator finds the key set of the tenant a
// token names, and counts the tokens it refuses by tenant and reason.
type KeySets interface {
	Set(tenant string) (*keyset.Set, bool)
	Refused(tenant, reason string)
}

// Reasons a token is refused (imshard_auth_refused_total); every refusal
// is 401 unauthenticated.
const (
	RefusedMissing       = "missing"        // no credential
	RefusedMalformed     = "malformed"      // not a JWT, a repeated key, a kid not a string, no tid
	RefusedUnknownTenant = "unknown_tenant" // tid not configured
	RefusedUnknownKey    = "unknown_key"    // no key of the kid (or no jwt_secret for a token without one)
	RefusedAlgorithm     = "algorithm"      // alg not the key's, or not one imshard takes
	RefusedSignature     = "signature"      // the signature does not verify
	RefusedExpired       = "expired"        // exp past, or missing
	RefusedNotYetValid   = "not_yet_valid"  // nbf or iat in the future
	RefusedLifetime      = "lifetime"       // exp − iat over auth.max_token_ttl
	RefusedClaims        = "claims"         // sub or role not valid
	RefusedIssuer        = "issuer"         // iss not the tenant's issuer
	RefusedAudience      = "audience"       // aud lacks the tenant's audience
)

// Claims of an imshard token. Times are RFC 7519 NumericDates: JSON
// numbers of seconds since the epoch (a string is refused).
type Claims struct {
	Tenant    string           `json:"tid"`
	Subject   string           `json:"sub"`
	Role      string           `json:"role,omitempty"`
	Issuer    string           `json:"iss,omitempty"`
	Audience  jwt.ClaimStrings `json:"aud,omitempty"`
	ExpiresAt *NumericDate     `json:"exp,omitempty"`
	IssuedAt  *NumericDate     `json:"iat,omitempty"`
	NotBefore *NumericDate     `json:"nbf,omitempty"`
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

// The jwt.Claims methods: the library validates exp, nbf and iat; iss and
// aud are checked against the tenant's settings once its key set is known.

func (c *Claims) GetExpirationTime() (*jwt.NumericDate, error) { return c.ExpiresAt.jwt(), nil }
func (c *Claims) GetIssuedAt() (*jwt.NumericDate, error)       { return c.IssuedAt.jwt(), nil }
func (c *Claims) GetNotBefore() (*jwt.NumericDate, error)      { return c.NotBefore.jwt(), nil }
func (c *Claims) GetIssuer() (string, error)                   { return c.Issuer, nil }
func (c *Claims) GetSubject() (string, error)                  { return c.Subject, nil }
func (c *Claims) GetAudience() (jwt.ClaimStrings, error)       { return c.Audience, nil }

// Authenticator verifies tokens with the key set of the tenant they name,
// so a token signed for one tenant can never act in another.
type Authenticator struct {
	keys   KeySets
	maxTTL time.Duration
	leeway time.Duration
	now    func() time.Time
	cache  tokenCache
}

// Leeway is the clock skew tolerated on exp, nbf, iat and the lifetime.
const Leeway = 30 * time.Second

// NewAuthenticator verifies with keys; maxTTL (auth.max_token_ttl) is the
// longest lifetime a token may have.
func NewAuthenticator(keys KeySets, maxTTL time.Duration) *Authenticator {
	return &Authenticator{keys: keys, maxTTL: maxTTL, leeway: Leeway, now: time.Now,
		cache: tokenCache{m: map[string]verified{}}}
}

var errUnauth = Errorf(CodeUnauthenticated, "missing or invalid credentials")

// subPattern is a user id as sub must write it: a positive decimal
// without sign, leading zeros or spaces, at most 19 digits.
var subPattern = regexp.MustCompile(`^[1-9][0-9]{0,18}$`)

// Verify parses and checks a token: its alg one of HS256, RS256, ES256 and
// EdDSA, signed with the key its kid header names in the key set of its
// own tid — the tenant's jwt_secret when it names none — and that key
// pinned to the same alg; exp required, a number, not past (within the
// leeway); iat, when present, a number not in the future; a lifetime — exp
// − iat, or exp − now without iat — of at most maxTTL (plus the leeway);
// sub a user id matching ^[1-9][0-9]{0,18}$ that fits in 63 bits; role
// known; iss and aud those the tenant requires, if any. Each refusal is
// counted by reason (KeySets.Refused).
//
// A token it accepted is remembered (tokenCache): the same token again skips
// the parse and the signature check while it has not expired, its tenant
// still holds the key that verified it and requires the same iss and aud.
func (a *Authenticator) Verify(token string) (Principal, error) {
	now := a.now()
	if p, ok := a.cache.get(token, now, a.keys); ok {
		return p, nil
	}
	p, v, reason, err := a.verify(token, now)
	if err != nil {
		a.keys.Refused(p.Tenant, reason)
		return Principal{}, err
	}
	v.p, v.until = p, p.Expires.Add(a.leeway)
	a.cache.put(token, v)
	return p, nil
}

// verify is Verify without the cache: on success the principal and what
// the cache checks on a hit; on refusal the reason, and in the principal
// the tenant the token named when it is one configured.
func (a *Authenticator) verify(token string, now time.Time) (Principal, verified, string, error) {
	if err := checkTokenJSON(token); err != nil {
		return Principal{}, verified{}, RefusedMalformed, Wrap(CodeUnauthenticated, err.Error(), err)
	}
	var claims Claims
	var set *keyset.Set
	var key keyset.Key
	reason := ""
	parser := jwt.NewParser(jwt.WithValidMethods(config.Algorithms), jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(), jwt.WithLeeway(a.leeway), jwt.WithTimeFunc(func() time.Time { return now }))
	_, err := parser.ParseWithClaims(token, &claims, func(t *jwt.Token) (any, error) {
		c, ok := t.Claims.(*Claims)
		if !ok || c.Tenant == "" {
			reason = RefusedMalformed
			return nil, errors.New("no tid claim")
		}
		if set, ok = a.keys.Set(c.Tenant); !ok {
			reason = RefusedUnknownTenant
			return nil, errors.New("unknown tenant")
		}
		var err error
		if key, err = set.Key(t); err != nil {
			switch {
			case errors.Is(err, keyset.ErrUnknownKey):
				reason = RefusedUnknownKey
			case errors.Is(err, keyset.ErrAlgorithm):
				reason = RefusedAlgorithm
			default:
				reason = RefusedMalformed
			}
			return nil, err
		}
		return key.Material, nil
	})
	refused := Principal{}
	if set != nil {
		refused.Tenant = claims.Tenant
	}
	if err != nil {
		if reason == "" {
			reason = parseRefusal(err)
		}
		return refused, verified{}, reason, Wrap(CodeUnauthenticated, "missing or invalid credentials", err)
	}
	from := now
	if claims.IssuedAt != nil {
		from = claims.IssuedAt.Time
	}
	if claims.ExpiresAt.Sub(from) > a.maxTTL+a.leeway {
		return refused, verified{}, RefusedLifetime, Errorf(CodeUnauthenticated, "token lifetime exceeds "+a.maxTTL.String())
	}
	uid, err := strconv.ParseInt(claims.Subject, 10, 64)
	if err != nil || !subPattern.MatchString(claims.Subject) {
		return refused, verified{}, RefusedClaims, Wrap(CodeUnauthenticated, "sub must be a positive decimal user id", err)
	}
	switch claims.Role {
	case RoleUser, RoleService, RoleAdmin:
	default:
		return refused, verified{}, RefusedClaims, Errorf(CodeUnauthenticated, "unknown role claim")
	}
	if set.Issuer != "" && claims.Issuer != set.Issuer {
		return refused, verified{}, RefusedIssuer, Errorf(CodeUnauthenticated, "iss is not the tenant's issuer")
	}
	if set.Audience != "" && !slices.Contains(claims.Audience, set.Audience) {
		return refused, verified{}, RefusedAudience, Errorf(CodeUnauthenticated, "aud does not name the tenant's audience")
	}
	p := Principal{Tenant: claims.Tenant, UserID: uid, Role: claims.Role, Expires: claims.ExpiresAt.Time, KeyID: key.KID}
	return p, verified{key: key, issuer: set.Issuer, audience: set.Audience}, "", nil
}

// parseRefusal is the reason of a refusal the JWT library made.
func parseRefusal(err error) string {
	switch {
	case errors.Is(err, jwt.ErrTokenExpired), errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return RefusedExpired
	case errors.Is(err, jwt.ErrTokenNotValidYet), errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
		return RefusedNotYetValid
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		// an alg outside config.Algorithms is refused as this too
		return RefusedSignature
	}
	return RefusedMalformed
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
// the tenant's key set is looked up again on every hit, so a reload that
// removes or changes the key, or changes the issuer or audience required,
// refuses the token at once, as a fresh parse would. Refusals are never
// kept.
type tokenCache struct {
	mu sync.RWMutex
	m  map[string]verified
}

type verified struct {
	p                Principal
	key              keyset.Key // the key that verified the token
	issuer, audience string     // the tenant's requirements then
	until            time.Time  // exp + leeway: from then on the token is expired
}

func (c *tokenCache) get(token string, now time.Time, keys KeySets) (Principal, bool) {
	c.mu.RLock()
	v, ok := c.m[token]
	c.mu.RUnlock()
	if !ok || !now.Before(v.until) {
		return Principal{}, false
	}
	set, ok := keys.Set(v.p.Tenant)
	if !ok || set.Issuer != v.issuer || set.Audience != v.audience || !set.Holds(v.key) {
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
		a.keys.Refused("", RefusedMissing)
		return Principal{}, errUnauth
	}
	return a.Verify(tok)
}

// Sign makes an HS256 token without kid, verified by the tenant's
// jwt_secret (tests, `imshard bench`, operator tooling).
func Sign(secret []byte, tenant string, userID int64, role string, ttl time.Duration) (string, error) {
	return SignWith(Signer{Alg: config.AlgHS256, Key: secret}, tenant, userID, role, ttl)
}

// Signer is a signing key: the HS256 secret as bytes, or the private key
// of an RS256, ES256 or EdDSA key; KID goes into the header when set, and
// Issuer and Audience into the claims.
type Signer struct {
	KID, Alg         string
	Key              any
	Issuer, Audience string
}

// SignWith makes a token signed by s.
func SignWith(s Signer, tenant string, userID int64, role string, ttl time.Duration) (string, error) {
	now := time.Now()
	claims := &Claims{Tenant: tenant, Role: role, Subject: strconv.FormatInt(userID, 10), Issuer: s.Issuer,
		ExpiresAt: NewNumericDate(now.Add(ttl)), IssuedAt: NewNumericDate(now)}
	if s.Audience != "" {
		claims.Audience = jwt.ClaimStrings{s.Audience}
	}
	method := jwt.GetSigningMethod(s.Alg)
	if method == nil || !slices.Contains(config.Algorithms, s.Alg) {
		return "", fmt.Errorf("unknown algorithm %q", s.Alg)
	}
	tok := jwt.NewWithClaims(method, claims)
	if s.KID != "" {
		tok.Header["kid"] = s.KID
	}
	return tok.SignedString(s.Key)
}
