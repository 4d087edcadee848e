package readpath

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/routing"
)

// Deletion ranges ("delete for me"). im_dellog is the truth:
// one row per hide, [low, hi) of a topic's seqs for one user. Redis caches
// each caller's ranges of a topic, merged, in a HASH per topic (field user
// id) for HiddenTTL, filled on a miss by lua/cache_fill.lua unless a hide
// bumped the topic's version meanwhile. A page then learns the caller's
// ranges in the same pipelined round trip as the hot cache and the
// membership, and a month table's statement drops the im_dellog anti-join
// for a caller who hid nothing. Every hide goes through Hide, which
// invalidates the entry; a row written into im_dellog by hand is seen once
// the entry expires (docs/operations.md).

// hiddenCap is the most merged ranges a cache entry holds; a caller with
// more is cached as hiddenMany and filtered by MySQL on every page.
const hiddenCap = 32

// hiddenMany is the cache entry of a caller with more than hiddenCap ranges.
const hiddenMany = "*"

// defaultHiddenTTL is how long a cached entry lives without a hide.
const defaultHiddenTTL = 5 * time.Minute

// HiddenView is a caller's deletion ranges of a topic as a page uses them.
type HiddenView struct {
	Ranges Hidden
	Known  bool // ranges are all of them; false: MySQL filters (anti-join)
}

// None reports a caller known to have hidden nothing.
func (v HiddenView) None() bool { return v.Known && len(v.Ranges) == 0 }

// Merged returns the ranges sorted by low, overlapping and adjacent ones
// joined, empty ones dropped.
func (h Hidden) Merged() Hidden {
	var out Hidden
	for _, r := range h {
		if r[1] > r[0] {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b [2]int64) int { return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[1], b[1])) })
	n := 0
	for _, r := range out {
		if n > 0 && r[0] <= out[n-1][1] {
			out[n-1][1] = max(out[n-1][1], r[1])
			continue
		}
		out[n] = r
		n++
	}
	return out[:n]
}

// EncodeHidden is the cache form of merged ranges: "low-hi,low-hi"; the
// empty string is "hid nothing".
func EncodeHidden(h Hidden) string {
	var b strings.Builder
	for i, r := range h {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(r[0], 10))
		b.WriteByte('-')
		b.WriteString(strconv.FormatInt(r[1], 10))
	}
	return b.String()
}

// DecodeHidden parses EncodeHidden's form; anything else is an error (the
// caller then asks MySQL).
func DecodeHidden(s string) (Hidden, error) {
	if s == "" {
		return Hidden{}, nil
	}
	parts := strings.Split(s, ",")
	if len(parts) > hiddenCap {
		return nil, fmt.Errorf("readpath: cached deletion ranges: %d ranges", len(parts))
	}
	out := make(Hidden, 0, len(parts))
	for _, p := range parts {
		lo, hi, ok := strings.Cut(p, "-")
		if !ok {
			return nil, fmt.Errorf("readpath: cached deletion range %q", p)
		}
		l, err1 := strconv.ParseInt(lo, 10, 64)
		h, err2 := strconv.ParseInt(hi, 10, 64)
		if err1 != nil || err2 != nil || l < 1 || h <= l {
			return nil, fmt.Errorf("readpath: cached deletion range %q", p)
		}
		out = append(out, [2]int64{l, h})
	}
	return out, nil
}

// HiddenOf returns the caller's deletion ranges of topic: Redis first, on a
// miss MySQL, filling the cache.
func (s *Reader) HiddenOf(ctx context.Context, db *sql.DB, keys routing.Keys, topic string, user int64) (HiddenView, error) {
	return s.hiddenResolve(ctx, db, keys, topic, user, s.p.Redis.DoMulti(ctx, s.HiddenCmds(keys, topic, user)...))
}

// HiddenCmds read the caller's cache entry.
func (s *Reader) HiddenCmds(keys routing.Keys, topic string, user int64) []rueidis.Completed {
	rdb := s.p.Redis
	return []rueidis.Completed{rdb.B().Hget().Key(keys.Hidden(topic)).Field(strconv.FormatInt(user, 10)).Build()}
}

// hiddenResolve is the view hiddenCmds' results show; on a miss it reads
// MySQL and fills the cache. A Redis failure or a caller with too many
// ranges gives an unknown view (MySQL filters); a MySQL failure is an error.
func (s *Reader) hiddenResolve(ctx context.Context, db *sql.DB, keys routing.Keys, topic string, user int64, res []rueidis.RedisResult) (HiddenView, error) {
	if v, ok := s.hiddenHit(topic, res[0]); ok {
		return v, nil
	}
	version, verr := routing.CacheVersion(ctx, s.p.Redis, keys.HiddenVersion(topic))
	all, err := s.st.HiddenRanges(ctx, db, topic, user, 0, hiddenReadMax)
	if err != nil {
		return HiddenView{}, err
	}
	view, fill := hiddenEntry(all)
	if verr == nil {
		// best effort: a refused or failed fill only costs the next page a read
		_ = s.p.Scripts.CacheFill.Exec(ctx, s.p.Redis, fill.keys(keys, topic), fill.args(version, s.hiddenTTL(), user)).Error()
	}
	return view, nil
}

// hiddenHit is the view a cache read shows; ok is false on a miss (MySQL
// must be read), true on a hit and on a Redis failure (unknown view).
func (s *Reader) hiddenHit(topic string, res rueidis.RedisResult) (HiddenView, bool) {
	cached, err := res.ToString()
	switch {
	case err == nil && cached == hiddenMany:
		s.m.hidden.WithLabelValues("many").Inc()
		return HiddenView{}, true
	case err == nil:
		if h, err := DecodeHidden(cached); err == nil {
			s.m.hidden.WithLabelValues("hit").Inc()
			return HiddenView{Ranges: h, Known: true}, true
		}
		s.p.Log.Warn().Str("topic", topic).Str("entry", cached).Msg("malformed cached deletion ranges; reading MySQL")
	case !rueidis.IsRedisNil(err):
		s.m.hidden.WithLabelValues("error").Inc()
		s.p.Log.Warn().Err(err).Str("topic", topic).Msg("deletion-range cache unavailable; MySQL filters")
		return HiddenView{}, true
	}
	s.m.hidden.WithLabelValues("miss").Inc()
	return HiddenView{}, false
}

// hiddenFill is the cache entry of ranges read from MySQL.
type hiddenFill string

func (f hiddenFill) keys(keys routing.Keys, topic string) []string {
	return []string{keys.HiddenVersion(topic), keys.Hidden(topic)}
}

func (f hiddenFill) args(version string, ttl time.Duration, user int64) []string {
	return []string{version, strconv.FormatInt(ttl.Milliseconds(), 10), strconv.FormatInt(user, 10), string(f)}
}

// hiddenEntry is the view and cache entry of every range read from MySQL
// (at most hiddenReadMax of them).
func hiddenEntry(all Hidden) (HiddenView, hiddenFill) {
	merged := all.Merged()
	if uint64(len(all)) >= hiddenReadMax || len(merged) > hiddenCap {
		return HiddenView{}, hiddenMany
	}
	return HiddenView{Ranges: merged, Known: true}, hiddenFill(EncodeHidden(merged))
}

// HiddenOfMany is hiddenResolve for many topics of one caller (res[i] the
// hiddenCmds result of topics[i]): the misses cost one round trip for the
// versions, one MySQL statement and one round trip of fills in all.
func (s *Reader) HiddenOfMany(ctx context.Context, db *sql.DB, keys routing.Keys, user int64, topics []string, res []rueidis.RedisResult) ([]HiddenView, error) {
	out := make([]HiddenView, len(topics))
	var missed []int
	for i, t := range topics {
		v, ok := s.hiddenHit(t, res[i])
		out[i] = v
		if !ok {
			missed = append(missed, i)
		}
	}
	if len(missed) == 0 {
		return out, nil
	}
	rdb := s.p.Redis
	vcmds := make([]rueidis.Completed, len(missed))
	names := make([]string, len(missed))
	for j, i := range missed {
		vcmds[j] = rdb.B().Get().Key(keys.HiddenVersion(topics[i])).Build()
		names[j] = topics[i]
	}
	versions := rdb.DoMulti(ctx, vcmds...)
	ranges, err := s.st.hiddenOfTopics(ctx, db, names, user)
	if err != nil {
		return nil, err
	}
	var fills []rueidis.LuaExec
	for j, i := range missed {
		view, fill := hiddenEntry(ranges[topics[i]])
		out[i] = view
		version, verr := versions[j].ToString()
		if rueidis.IsRedisNil(verr) {
			version, verr = "", nil
		}
		if verr == nil {
			fills = append(fills, rueidis.LuaExec{Keys: fill.keys(keys, topics[i]), Args: fill.args(version, s.hiddenTTL(), user)})
		}
	}
	if len(fills) > 0 {
		// best effort, as hiddenResolve's
		s.p.Scripts.CacheFill.ExecMulti(ctx, rdb, fills...)
	}
	return out, nil
}

// hiddenReadMax bounds the im_dellog rows a cache fill reads; a caller with
// more is cached as hiddenMany.
const hiddenReadMax uint64 = 4 * hiddenCap

func (s *Reader) hiddenTTL() time.Duration {
	if s.p.HiddenTTL > 0 {
		return s.p.HiddenTTL
	}
	return defaultHiddenTTL
}

// InvalidateHidden moves the topic's version forward (so a fill computed
// before cannot land, and no count remembered under an older version is
// reused) and drops the user's entry.
func (s *Reader) InvalidateHidden(ctx context.Context, keys routing.Keys, topic string, user int64) error {
	rdb := s.p.Redis
	ver := []string{keys.HiddenVersion(topic)}
	res := rdb.DoMulti(ctx, s.p.Scripts.VersionBump.Cmd(rdb, ver, nil),
		rdb.B().Hdel().Key(keys.Hidden(topic)).Field(strconv.FormatInt(user, 10)).Build())
	res[0] = s.p.Scripts.VersionBump.Result(ctx, rdb, res[0], ver, nil)
	for _, r := range res {
		if err := r.Error(); err != nil {
			return httpapi.Wrap(httpapi.CodeUnavailable, "deletion-range cache unavailable; the hide may not show yet, retry it", err)
		}
	}
	return nil
}
