package httpapi

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Roles a credential may carry besides a plain user.
const (
	RoleUser    = ""
	RoleService = "service" // manages groups and members; may send for a member
	RoleAdmin   = "admin"   // global delete, admin routes
)

// Principal is who a request acts as. The tenant comes only from here —
// from the verified credential — never from a parameter (DESIGN invariant 10).
type Principal struct {
	Tenant string
	UserID int64
	Role   string
}

// Secrets looks up a tenant's JWT secret; ok is false for unknown tenants.
type Secrets func(tenant string) (secret []byte, ok bool)

// Claims of an imshard token.
type Claims struct {
	Tenant string `json:"tid"`
	Role   string `json:"role,omitempty"`
	jwt.RegisteredClaims
}

// Authenticator verifies HS256 tokens with the secret of the tenant they
// name, so a token signed for one tenant can never act in another.
type Authenticator struct {
	secrets Secrets
	leeway  time.Duration
}

// NewAuthenticator verifies with secrets; leeway tolerates clock skew on exp.
func NewAuthenticator(secrets Secrets) *Authenticator {
	return &Authenticator{secrets: secrets, leeway: 30 * time.Second}
}

var errUnauth = Errorf(CodeUnauthenticated, "missing or invalid credentials")

// Verify parses and checks a token: HS256 only, signed with the secret of its
// own tid, unexpired (exp required), sub a decimal user id, role known.
func (a *Authenticator) Verify(token string) (Principal, error) {
	var claims Claims
	parser := jwt.NewParser(jwt.WithValidMethods([]string{"HS256"}), jwt.WithExpirationRequired(), jwt.WithLeeway(a.leeway))
	_, err := parser.ParseWithClaims(token, &claims, func(t *jwt.Token) (any, error) {
		c, ok := t.Claims.(*Claims)
		if !ok || c.Tenant == "" {
			return nil, errors.New("no tid claim")
		}
		secret, ok := a.secrets(c.Tenant)
		if !ok {
			return nil, errors.New("unknown tenant")
		}
		return secret, nil
	})
	if err != nil {
		return Principal{}, Wrap(CodeUnauthenticated, "missing or invalid credentials", err)
	}
	uid, err := strconv.ParseInt(claims.Subject, 10, 64)
	if err != nil || uid <= 0 {
		return Principal{}, Wrap(CodeUnauthenticated, "sub must be a positive decimal user id", err)
	}
	switch claims.Role {
	case RoleUser, RoleService, RoleAdmin:
	default:
		return Principal{}, Errorf(CodeUnauthenticated, "unknown role claim")
	}
	return Principal{Tenant: claims.Tenant, UserID: uid, Role: claims.Role}, nil
}

// Token extracts the bearer token of r: the Authorization header, or
// ?access_token= where allowQuery (WebSocket upgrades cannot set headers).
func Token(r *http.Request, allowQuery bool) string {
	if h := r.Header.Get("Authorization"); h != "" {
		if tok, ok := strings.CutPrefix(h, "Bearer "); ok {
			return strings.TrimSpace(tok)
		}
		return ""
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

type principalKey struct{}

// WithPrincipal stores p in ctx.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// PrincipalFrom returns the principal stored by the middleware.
func PrincipalFrom(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// Sign makes a token (tests, `imshard bench`, operator tooling).
func Sign(secret []byte, tenant string, userID int64, role string, ttl time.Duration) (string, error) {
	claims := Claims{Tenant: tenant, Role: role, RegisteredClaims: jwt.RegisteredClaims{
		Subject:   strconv.FormatInt(userID, 10),
		ExpiresAt: jwt.NewNumericDate(time.Now().Add(ttl)),
		IssuedAt:  jwt.NewNumericDate(time.Now()),
	}}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(secret)
}
