package retention

import (
	"fmt"

	"github.com/imshard/imshard/modules/routing"
)

// Expired reports whether month m is past a retention of months at now:
// 0 keeps forever; with N, a month older than now minus N expires (N = 1
// in December keeps November and December).
func Expired(m, now routing.Month, months int) bool {
	return months > 0 && m.Before(now.Add(-months))
}

// MonthState is what a plan is decided from for one registered month: its
// catalog row, the route mirror's rows of every topic in it, and why each
// held topic is held (a hold naming it, or a held user who wrote in it).
type MonthState struct {
	Shard  routing.Shard
	Topics []routing.MirrorRow
	Held   map[string]string
}

// Plan is exactly what one retention run removes, decided before anything
// is removed.
type Plan struct {
	Tenant          string `json:"tenant"`
	Now             string `json:"now"`
	RetentionMonths int    `json:"retention_months"`
	Drops           []Drop `json:"drops"`
	Trims           []Trim `json:"trims"`
	Skipped         []Skip `json:"skipped"`
	Held            []Held `json:"held"`
}

// Drop is a month removed whole: every topic in it is past retention.
type Drop struct {
	Month  string `json:"month"`
	Rows   int64  `json:"rows"`
	Topics int    `json:"topics"`
	// Resumed: a run stopped while removing it; this one finishes it.
	Resumed bool `json:"resumed,omitempty"`
	// Archived: the month is archived; its archive objects go with it.
	Archived bool `json:"archived,omitempty"`

	month routing.Month
}

// Trim is one topic's rows removed from a month that stays: the topic's
// own retention is shorter than what keeps the month.
type Trim struct {
	Month           string `json:"month"`
	Topic           string `json:"topic"`
	RetentionMonths int    `json:"retention_months"`
	Rows            int64  `json:"rows"`
	MinSeq          int64  `json:"min_seq"`
	MaxSeq          int64  `json:"max_seq"`

	month routing.Month
}

// Skip is something past retention that this run leaves, with why.
type Skip struct {
	Month  string `json:"month"`
	Topics int    `json:"topics"`
	Rows   int64  `json:"rows"`
	Reason string `json:"reason"`
}

// Held is one topic's rows past retention that a legal hold keeps.
type Held struct {
	Month  string `json:"month"`
	Topic  string `json:"topic"`
	Rows   int64  `json:"rows"`
	Reason string `json:"reason"`
}

// Rows is the total the plan removes.
func (p Plan) Rows() int64 {
	var n int64
	for _, d := range p.Drops {
		n += d.Rows
	}
	for _, t := range p.Trims {
		n += t.Rows
	}
	return n
}

// Decide makes the plan for one tenant at now from its months (oldest
// first), its retention and the groups' own retentions (override: topic →
// months). Pure, for table tests.
//
// A month whose every topic is past retention goes whole; one that keeps
// some topic loses only the expired topics' rows. Only a sealed month is
// touched, and an archived one when it goes whole (its archive objects
// with it): one still taking rows may yet get some, and an archive is
// never rewritten to trim a topic out of it. A held topic (held in any month of
// the plan) keeps its rows in every month: a month holding one is never
// dropped whole, its other expired topics are trimmed instead. A month already being dropped (expiring: its floors were raised
// before the hold came) is finished.
func Decide(tenant string, now routing.Month, tenantMonths int, override map[string]int, months []MonthState) Plan {
	p := Plan{Tenant: tenant, Now: now.String(), RetentionMonths: tenantMonths, Drops: []Drop{}, Trims: []Trim{}, Skipped: []Skip{}, Held: []Held{}}
	retentionOf := func(topic string) int {
		if r, ok := override[topic]; ok {
			return r
		}
		return tenantMonths
	}
	// a topic held in one month is held in all: a floor raised by trimming
	// or dropping a newer month would hide the held rows of an older one
	heldAny := map[string]string{}
	for _, ms := range months {
		for t, why := range ms.Held {
			if _, ok := heldAny[t]; !ok {
				heldAny[t] = why
			}
		}
	}
	for _, ms := range months {
		m, st := ms.Shard.Month, ms.Shard.Status
		var rows int64
		var expired []routing.MirrorRow
		var held []Held
		for _, r := range ms.Topics {
			rows += r.Count
			if !Expired(m, now, retentionOf(r.Topic)) {
				continue
			}
			why, ok := ms.Held[r.Topic]
			if !ok {
				why, ok = heldAny[r.Topic]
			}
			if ok {
				held = append(held, Held{Month: m.String(), Topic: r.Topic, Rows: r.Count, Reason: why})
				continue
			}
			expired = append(expired, r)
		}
		if ms.Shard.StatsAt.Valid {
			rows = ms.Shard.RowCount
		}
		if st == routing.StatusExpiring {
			p.Drops = append(p.Drops, Drop{Month: m.String(), Rows: rows, Topics: len(ms.Topics), Resumed: true, month: m})
			continue
		}
		p.Held = append(p.Held, held...)
		whole := len(held) == 0 && len(expired) == len(ms.Topics) && (len(ms.Topics) > 0 || Expired(m, now, tenantMonths))
		if !whole && len(expired) == 0 {
			continue
		}
		if st != routing.StatusSealed && (st != routing.StatusArchived || !whole) {
			var n int64
			for _, r := range expired {
				n += r.Count
			}
			if whole {
				n = rows
			}
			p.Skipped = append(p.Skipped, Skip{Month: m.String(), Topics: len(expired), Rows: n, Reason: skipReason(st)})
			continue
		}
		if whole {
			p.Drops = append(p.Drops, Drop{Month: m.String(), Rows: rows, Topics: len(ms.Topics), Archived: st == routing.StatusArchived, month: m})
			continue
		}
		for _, r := range expired {
			p.Trims = append(p.Trims, Trim{Month: m.String(), Topic: r.Topic, RetentionMonths: retentionOf(r.Topic),
				Rows: r.Count, MinSeq: r.MinSeq, MaxSeq: r.MaxSeq, month: m})
		}
	}
	return p
}

func skipReason(st routing.Status) string {
	if st == routing.StatusArchived {
		return "archived, with topics that stay: an archive is never rewritten to trim a topic out of it (restore the month to trim it)"
	}
	return fmt.Sprintf("month is %s, not sealed: it may still take rows", st)
}
