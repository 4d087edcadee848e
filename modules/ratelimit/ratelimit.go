// Package ratelimit holds each tenant's traffic to its limits
// (config.Limits, docs/operations.md "Limits"): what the HTTP roles share
// to refuse a request with 429 rate_limited, its Retry-After and its
// RateLimit-Policy / RateLimit header fields, the per-user buckets of reads
// and changes kept in the process, and the refusal counter.
//
// Sends are not decided here: their three buckets (tenant, user, topic)
// are decided inside the send's one Redis call (lua/fenced.lua, send), so
// that the limit holds exactly across every process and costs no round
// trip; this package renders that decision.
package ratelimit

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/httpapi"
)

// Scopes: what a refusal is counted under (imshard_rate_limited_total) and,
// but for connections, the name of its policy in the header fields.
const (
	ScopeTenant      = "tenant"      // a tenant's sends
	ScopeUser        = "user"        // one user's sends
	ScopeTopic       = "topic"       // one topic's sends
	ScopeReads       = "reads"       // one user's reads, per process
	ScopeChanges     = "changes"     // one user's changes, per process
	ScopeConnections = "connections" // one user's sockets, per process
)

// Scopes lists every scope, in the order the send's buckets are decided.
var Scopes = []string{ScopeTenant, ScopeUser, ScopeTopic, ScopeReads, ScopeChanges, ScopeConnections}

// Header field names (draft-ietf-httpapi-ratelimit-headers).
const (
	HeaderPolicy     = "RateLimit-Policy"
	HeaderState      = "RateLimit"
	HeaderRetryAfter = "Retry-After"
)

// Limiter is the process's view of the limits: each tenant's, as the live
// configuration says (a reload changes them at once), the in-process
// buckets, and the refusal counter.
type Limiter struct {
	of      func(tenant string) config.Limits
	refused *prometheus.CounterVec
	reads   *Local
	changes *Local
}

// LocalUsers bounds how many (tenant, user) buckets of reads and of
// changes a process keeps; past it the bucket unused the longest goes,
// which only ever hands its user a full bucket again.
const LocalUsers = 100_000

// New builds the limiter over of, the live limits of a tenant.
func New(of func(tenant string) config.Limits, reg prometheus.Registerer) *Limiter {
	l := &Limiter{
		of: of,
		refused: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{Name: "imshard_rate_limited_total",
			Help: "Requests refused 429 rate_limited, by tenant and scope: tenant, user, topic (sends, exact across processes), reads, changes (per process), connections (sockets per user, per process)."},
			[]string{"tenant", "scope"}),
		reads:   NewLocal(LocalUsers),
		changes: NewLocal(LocalUsers),
	}
	return l
}

// ExportTenants creates the refusal series of tenants at 0, so that a
// first refusal is an increase to every rate() over it.
func (l *Limiter) ExportTenants(tenants []string) {
	for _, t := range tenants {
		for _, s := range Scopes {
			l.refused.WithLabelValues(t, s)
		}
	}
}

// Of is the limits of a tenant now.
func (l *Limiter) Of(tenant string) config.Limits { return l.of(tenant) }

// Counted counts a refusal of the tenant's scope.
func (l *Limiter) Counted(tenant, scope string) { l.refused.WithLabelValues(tenant, scope).Inc() }

// Read takes one of the user's reads: nil, or the 429 to answer.
func (l *Limiter) Read(tenant string, user int64) error {
	return l.take(l.reads, ScopeReads, l.of(tenant).Reads, tenant, user)
}

// Change takes one of the user's changes: nil, or the 429 to answer.
func (l *Limiter) Change(tenant string, user int64) error {
	return l.take(l.changes, ScopeChanges, l.of(tenant).Changes, tenant, user)
}

func (l *Limiter) take(b *Local, scope string, r config.Rate, tenant string, user int64) error {
	if r.Off() {
		return nil
	}
	d := b.Take(tenant, user, r, time.Now())
	if d.OK {
		return nil
	}
	l.Counted(tenant, scope)
	return Refusal(scope, Policy(scope, r), d.RetryAfter)
}

// Decision is one GCRA decision of a bucket.
type Decision struct {
	OK bool
	// Remaining is how many more requests the bucket lets through at
	// once; Reset how long until it is full again (both after this one).
	Remaining int64
	Reset     time.Duration
	// RetryAfter is how long a refused request waits until one passes.
	RetryAfter time.Duration
}

// Decide is the GCRA step of a bucket of rate r whose theoretical arrival
// time is tat, for a request at now: the decision and the bucket's next
// tat (tat itself when refused). lua/fenced.lua (limit) decides the send
// buckets by the same arithmetic.
func Decide(r config.Rate, tat, now time.Time) (time.Time, Decision) {
	interval := r.Interval()
	if tat.Before(now) {
		tat = now
	}
	next := tat.Add(interval)
	allowAt := next.Add(-time.Duration(r.Burst) * interval)
	if allowAt.After(now) {
		return tat, Decision{RetryAfter: allowAt.Sub(now)}
	}
	return next, Decision{OK: true, Remaining: int64(now.Sub(allowAt) / interval), Reset: next.Sub(now)}
}

// Policy is one bucket's RateLimit-Policy member: q requests (the burst)
// per w seconds (the time the bucket takes to refill from empty), so that
// q/w is the rate.
func Policy(name string, r config.Rate) string {
	return `"` + name + `";q=` + strconv.Itoa(r.Burst) + ";w=" + strconv.FormatInt(r.Window(), 10)
}

// Policies joins the members of the buckets that are on.
func Policies(members ...string) string { return strings.Join(members, ", ") }

// seconds rounds d up to whole seconds, never below 0: what Retry-After
// and the t of RateLimit carry.
func seconds(d time.Duration) int64 {
	return max(0, int64(math.Ceil(d.Seconds())))
}

// State is the RateLimit field of a bucket: r requests left now, t seconds
// until the bucket is full again.
func State(name string, remaining int64, reset time.Duration) string {
	return `"` + name + `";r=` + strconv.FormatInt(max(0, remaining), 10) + ";t=" + strconv.FormatInt(seconds(reset), 10)
}

// SetHeaders puts the header fields of an accepted request on h.
func SetHeaders(h http.Header, policies, state string) {
	h.Set(HeaderPolicy, policies)
	h.Set(HeaderState, state)
}

// Refusal is the 429 of a request a bucket refused: retry after retry (the
// time until the bucket lets one through), in Retry-After (whole seconds,
// rounded up) and details.retry_after_ms (never negative), with the
// bucket's policy and state (r=0, t the same wait as Retry-After) in the
// RateLimit fields.
func Refusal(scope, policies string, retry time.Duration) *httpapi.Error {
	retry = max(0, retry)
	ms := retry.Milliseconds()
	if retry%time.Millisecond != 0 {
		ms++
	}
	e := httpapi.Errorf(httpapi.CodeRateLimited, refusals[scope]).
		WithDetails(map[string]any{"scope": scope, "retry_after_ms": ms}).
		WithHeader(HeaderRetryAfter, strconv.FormatInt(seconds(retry), 10))
	if policies != "" {
		e.WithHeader(HeaderPolicy, policies).WithHeader(HeaderState, State(scope, 0, retry))
	}
	return e
}

var refusals = map[string]string{
	ScopeTenant:      "the tenant's send rate limit is reached; retry after retry_after_ms",
	ScopeUser:        "your send rate limit is reached; retry after retry_after_ms",
	ScopeTopic:       "the topic's send rate limit is reached; retry after retry_after_ms",
	ScopeReads:       "your read rate limit is reached; retry after retry_after_ms",
	ScopeChanges:     "your change rate limit is reached; retry after retry_after_ms",
	ScopeConnections: "you hold as many stream connections as one user may; close one or retry after retry_after_ms",
}

// SendBuckets are the scopes of the send call's buckets, in the order of
// its keys (routing.Keys.Send) and its bucket numbers (1, 2, 3).
var SendBuckets = []string{ScopeTenant, ScopeUser, ScopeTopic}

func sendRates(l config.SendLimits) []config.Rate { return []config.Rate{l.Tenant, l.User, l.Topic} }

// SendArgs are the send call's limit arguments: each bucket's emission
// interval in µs ("0" when it is off) and burst.
func SendArgs(l config.SendLimits) []string {
	out := make([]string, 0, 6)
	for _, r := range sendRates(l) {
		if r.Off() {
			out = append(out, "0", "0")
			continue
		}
		out = append(out, strconv.FormatInt(max(1, r.Interval().Microseconds()), 10), strconv.Itoa(r.Burst))
	}
	return out
}

// SendPolicies is the RateLimit-Policy of a send: the buckets that are on
// ("" when none is).
func SendPolicies(l config.SendLimits) string {
	var members []string
	for i, r := range sendRates(l) {
		if !r.Off() {
			members = append(members, Policy(SendBuckets[i], r))
		}
	}
	return Policies(members...)
}

// Reads wraps a read route: each request takes one of its caller's reads
// before fn runs. A nil Limiter (a tool's service without limits) wraps
// nothing.
func (l *Limiter) Reads(fn httpapi.HandlerFunc) httpapi.HandlerFunc {
	if l == nil {
		return fn
	}
	return func(w http.ResponseWriter, r *http.Request, p httpapi.Principal) error {
		if err := l.Read(p.Tenant, p.UserID); err != nil {
			return err
		}
		return fn(w, r, p)
	}
}

// Changes wraps a change route as Reads does a read route.
func (l *Limiter) Changes(fn httpapi.HandlerFunc) httpapi.HandlerFunc {
	if l == nil {
		return fn
	}
	return func(w http.ResponseWriter, r *http.Request, p httpapi.Principal) error {
		if err := l.Change(p.Tenant, p.UserID); err != nil {
			return err
		}
		return fn(w, r, p)
	}
}
