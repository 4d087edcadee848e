package config

import (
	"fmt"
	"math"
	"time"
)

// Limits are the rates each tenant's traffic is held to (docs/operations.md,
// "Limits"): the top-level section is every tenant's default, and a tenant's
// own limits (Tenant.Limits) replace it bucket by bucket. Sends are counted
// exactly across processes, inside the send's Redis call; reads and changes
// in each process that serves them, where a client that spreads its
// requests over processes gets at most the limit times the process count:
// these limits are there so that no one user monopolises a process.
type Limits struct {
	Send SendLimits `mapstructure:"send" yaml:"send" json:"send"`
	// Reads are one user's history pages, message reads and read-state
	// reads; Changes one user's recalls, edits, deletes, hides and
	// read-cursor moves.
	Reads   Rate `mapstructure:"reads" yaml:"reads" json:"reads"`
	Changes Rate `mapstructure:"changes" yaml:"changes" json:"changes"`
}

// SendLimits are the three send buckets: a send passes only when the
// tenant's, its sender's and its topic's each let it through.
type SendLimits struct {
	Tenant Rate `mapstructure:"tenant" yaml:"tenant" json:"tenant"`
	User   Rate `mapstructure:"user" yaml:"user" json:"user"`
	Topic  Rate `mapstructure:"topic" yaml:"topic" json:"topic"`
}

// Rate is one bucket: PerSecond requests a second on average, Burst of them
// at once after a quiet spell (GCRA). PerSecond 0 means no limit.
type Rate struct {
	PerSecond float64 `mapstructure:"per_second" yaml:"per_second" json:"per_second"`
	Burst     int     `mapstructure:"burst" yaml:"burst" json:"burst"`
}

// Off reports a bucket that limits nothing.
func (r Rate) Off() bool { return r.PerSecond == 0 }

// Interval is the GCRA emission interval: the time one request uses up.
func (r Rate) Interval() time.Duration {
	return time.Duration(math.Round(float64(time.Second) / r.PerSecond))
}

// Window is the time a bucket takes to refill from empty to Burst, in
// whole seconds and at least one: the w of its RateLimit-Policy
// (q = Burst requests per w seconds).
func (r Rate) Window() int64 {
	return max(1, int64(math.Ceil(float64(r.Burst)/r.PerSecond)))
}

// TenantLimits are a tenant's own limits: each bucket given replaces the
// default bucket of the limits section whole; a bucket left out keeps it.
type TenantLimits struct {
	Send    TenantSendLimits `mapstructure:"send" yaml:"send,omitempty" json:"send,omitzero"`
	Reads   *Rate            `mapstructure:"reads" yaml:"reads,omitempty" json:"reads,omitempty"`
	Changes *Rate            `mapstructure:"changes" yaml:"changes,omitempty" json:"changes,omitempty"`
}

// TenantSendLimits are a tenant's own send buckets (see TenantLimits).
type TenantSendLimits struct {
	Tenant *Rate `mapstructure:"tenant" yaml:"tenant,omitempty" json:"tenant,omitempty"`
	User   *Rate `mapstructure:"user" yaml:"user,omitempty" json:"user,omitempty"`
	Topic  *Rate `mapstructure:"topic" yaml:"topic,omitempty" json:"topic,omitempty"`
}

// DefaultLimits are the built-in defaults: no cap on a tenant as a whole
// (its capacity is the deployment's to size), and per user and topic
// rates far above what a person types, so that only a runaway client or
// script meets them.
func DefaultLimits() Limits {
	return Limits{
		Send: SendLimits{
			User:  Rate{PerSecond: 20, Burst: 100},
			Topic: Rate{PerSecond: 100, Burst: 400},
		},
		Reads:   Rate{PerSecond: 100, Burst: 400},
		Changes: Rate{PerSecond: 20, Burst: 100},
	}
}

// Of is the limits of tenant t: the defaults l with t's own buckets over
// them.
func (l Limits) Of(t Tenant) Limits {
	o := t.Limits
	pick := func(def Rate, own *Rate) Rate {
		if own != nil {
			return *own
		}
		return def
	}
	return Limits{
		Send: SendLimits{
			Tenant: pick(l.Send.Tenant, o.Send.Tenant),
			User:   pick(l.Send.User, o.Send.User),
			Topic:  pick(l.Send.Topic, o.Send.Topic),
		},
		Reads:   pick(l.Reads, o.Reads),
		Changes: pick(l.Changes, o.Changes),
	}
}

// maxPerSecond bounds a bucket's rate: a microsecond emission interval,
// the resolution of the send call's clock.
const maxPerSecond = 1_000_000

// maxBurst bounds a bucket's burst, against a typo more than anything.
const maxBurst = 1_000_000

func (p *problems) rate(key string, r Rate) {
	switch {
	case math.IsNaN(r.PerSecond) || r.PerSecond < 0 || r.PerSecond > maxPerSecond:
		p.add(key+".per_second", "must be between 0 (no limit) and %d, got %v", maxPerSecond, r.PerSecond)
	case r.PerSecond > 0 && r.PerSecond < 1.0/86400:
		p.add(key+".per_second", "must be 0 (no limit) or at least one a day (%.8f), got %v", 1.0/86400, r.PerSecond)
	case r.PerSecond > 0:
		p.intRange(key+".burst", int64(r.Burst), 1, maxBurst)
	}
}

func (p *problems) limits(key string, l Limits) {
	p.rate(key+".send.tenant", l.Send.Tenant)
	p.rate(key+".send.user", l.Send.User)
	p.rate(key+".send.topic", l.Send.Topic)
	p.rate(key+".reads", l.Reads)
	p.rate(key+".changes", l.Changes)
}

// tenantLimits checks a tenant's own buckets, under tenants[i].limits.
func (p *problems) tenantLimits(key string, o TenantLimits) {
	for _, b := range []struct {
		name string
		r    *Rate
	}{{"send.tenant", o.Send.Tenant}, {"send.user", o.Send.User}, {"send.topic", o.Send.Topic}, {"reads", o.Reads}, {"changes", o.Changes}} {
		if b.r != nil {
			p.rate(fmt.Sprintf("%s.%s", key, b.name), *b.r)
		}
	}
}
