package readpath

import (
	"context"
	"database/sql"
	"math"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/imshard/imshard/modules/acl"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
)

// HotSlack is how many cached rows beyond the page's own a first cache
// read takes, for seqs a page skips (hidden, deleted, gaps); a page that
// needs more reads hotFurther times as many once more (hotReread) before
// MySQL answers instead.
const (
	HotSlack   = 4
	hotFurther = 4
)

// hotCmds read the topic's message version (first: whatever the cache
// read after it shows is at least as new as that version), the last issued
// seq and the cached messages and recorded gaps next to bound, in order o
// (exclusive of bound), at most n of each; newest first they stop above
// floor when it is positive (a read of what lies above a process's copy).
// hotResolve reads their results.
func (s *Reader) hotCmds(keys routing.Keys, topic string, o Order, bound, floor int64, n int) []rueidis.Completed {
	rdb := s.p.Redis
	b := "(" + strconv.FormatInt(bound, 10)
	var hot, gaps rueidis.Completed
	if o == Desc {
		f := "-inf"
		if floor > 0 {
			f = "(" + strconv.FormatInt(floor, 10)
		}
		hot = rdb.B().Zrevrangebyscore().Key(keys.HotMessages(topic)).Max(b).Min(f).Withscores().Limit(0, int64(n)).Build()
		gaps = rdb.B().Zrevrangebyscore().Key(keys.Gaps(topic)).Max(b).Min(f).Withscores().Limit(0, int64(n)).Build()
	} else {
		hot = rdb.B().Zrangebyscore().Key(keys.HotMessages(topic)).Min(b).Max("+inf").Withscores().Limit(0, int64(n)).Build()
		gaps = rdb.B().Zrangebyscore().Key(keys.Gaps(topic)).Min(b).Max("+inf").Withscores().Limit(0, int64(n)).Build()
	}
	return []rueidis.Completed{rdb.B().Get().Key(keys.MessagesVersion(topic)).Build(), rdb.B().Get().Key(keys.Seq(topic)).Build(), hot, gaps}
}

// hotResolve is the cache read of hotCmds' results and the topic's last
// issued seq. The returned bounds are where the read was complete: a ZSET
// that returned n entries may hold more beyond the last.
func hotResolve(res []rueidis.RedisResult, o Order, bound, floor int64, n int) (Cached, int64, error) {
	version, err := res[0].AsInt64()
	if rueidis.IsRedisNil(err) {
		// no version: none was set within its lifetime, or Redis lost it
		// (a flush, a restart) together with what it protected
		version, err = unversioned, nil
	}
	if err != nil {
		return Cached{}, 0, err
	}
	last, err := res[1].AsInt64()
	if rueidis.IsRedisNil(err) {
		last, err = 0, nil // counter lost: nothing can be proven from the cache
	}
	if err != nil {
		return Cached{}, 0, err
	}
	hz, err := res[2].AsZScores()
	if err != nil {
		return Cached{}, 0, err
	}
	gz, err := res[3].AsZScores()
	if err != nil {
		return Cached{}, 0, err
	}
	c := Cached{Members: hz, Lo: 1, Hi: math.MaxInt64, Version: version}
	if len(gz) > 0 {
		c.Gaps = make(map[int64]bool, len(gz))
	}
	if o == Desc {
		c.Lo, c.Hi = max(1, floor+1), bound-1
	} else {
		c.Lo = bound + 1
	}
	narrow := func(zs []rueidis.ZScore) {
		if len(zs) < n {
			return
		}
		c.Full = true
		edge := int64(zs[len(zs)-1].Score)
		if o == Desc && edge > c.Lo {
			c.Lo = edge
		}
		if o == Asc && edge < c.Hi {
			c.Hi = edge
		}
	}
	narrow(hz)
	narrow(gz)
	for _, z := range gz {
		c.Gaps[int64(z.Score)] = true
	}
	return c, last, nil
}

// hotReread reads the cache next to bound again, n members this time.
func (s *Reader) hotReread(ctx context.Context, keys routing.Keys, topic string, o Order, bound int64, n int) (Cached, error) {
	c, _, err := hotResolve(s.p.Redis.DoMulti(ctx, s.hotCmds(keys, topic, o, bound, 0, n)...), o, bound, 0, n)
	return c, err
}

// readPage makes the Redis reads of a list page as one pipeline and fails
// unless the caller may read the topic; nothing read is used before that.
// A page with a cursor into history also reads the route (it likely needs
// MySQL), a forward page the bound. When this process holds a copy of the
// topic's newest stretch that can serve the page, only what lies above the
// copy is read.
func (s *Reader) readPage(ctx context.Context, p httpapi.Principal, keys routing.Keys, db *sql.DB, req pageRequest) (pageReads, error) {
	rdb := s.p.Redis
	topic, o, bound, n := req.Topic, req.Order, req.Cursor, req.slack()
	withBound, withRoute := o == Asc, o == Desc && !req.latest()
	at := time.Now()
	base := s.recent.get(topicKey{p.Tenant, topic}, at)
	if base != nil && !base.usable(o, bound, n) {
		base = nil
	}
	hb, floor := bound, int64(0)
	if base != nil {
		if o == Desc {
			floor = base.hi
		} else {
			hb = base.hi
		}
	}
	var cmds []rueidis.Completed
	if withBound {
		// before the hot cache's gaps: a gap recorded after this read is
		// of a seq still pending here, above the watermark
		cmds = s.p.Flight.BoundCmds(keys, topic)
	}
	ns := len(cmds)
	cmds = append(cmds, s.hotCmds(keys, topic, o, hb, floor, n)...)
	nh := len(cmds)
	cmds = append(cmds, s.HiddenCmds(keys, topic, p.UserID)...)
	nd := len(cmds)
	if withRoute {
		cmds = append(cmds, s.p.Router.RouteCmds(keys, topic)...)
	}
	nf := len(cmds)
	cmds = append(cmds, s.floors().CopyCmd(keys, topic))
	na := len(cmds)
	member := p.Role != httpapi.RoleAdmin
	if member {
		cmds = append(cmds, acl.Cmds(rdb, keys, topic, p.UserID)...)
	}
	res := rdb.DoMulti(ctx, cmds...)
	if member {
		if err := acl.Allowed(s.p.ACL.Resolve(ctx, p.Tenant, topic, p.UserID, res[na:])); err != nil {
			return pageReads{}, err
		}
	}
	r := pageReads{At: at}
	var err error
	if r.Floor, err = s.floors().Resolve(ctx, db, keys, topic, res[nf]); err != nil {
		return pageReads{}, err
	}
	if withBound {
		if r.Bound, err = s.p.Flight.BoundResolve(ctx, p.Tenant, topic, res[:ns]); err != nil {
			return pageReads{}, httpapi.Wrap(httpapi.CodeUnavailable, "settled watermark unavailable", err)
		}
	}
	if withRoute {
		r.Route = res[nd:nf]
	}
	r.View.Top, r.Last, r.Err = hotResolve(res[ns:nh], o, hb, floor, n)
	if base != nil && r.Err == nil && base.ver != r.View.Top.Version {
		// a message of the topic changed since the copy was read, or the
		// version is gone: the copy may hold an old version of a message.
		// The page reads the cache afresh from its cursor: the read above
		// the copy holds nothing below it, and a page sent to MySQL adds
		// from this read what MySQL does not have yet (withHeld) — the
		// acknowledged messages persist has not stored, which the copy
		// held and the cut read does not.
		s.recent.drop(topicKey{p.Tenant, topic})
		s.m.local.WithLabelValues(localChanged).Inc()
		base = nil
		r.View.Top, r.Last, r.Err = hotResolve(rdb.DoMulti(ctx, s.hotCmds(keys, topic, o, bound, 0, n)...), o, bound, 0, n)
	}
	r.View.base = base
	r.Hidden, err = s.hiddenResolve(ctx, db, keys, topic, p.UserID, res[nh:nd])
	return r, err
}

// HotOne reads seq from the cache, if cached.
func (s *Reader) HotOne(ctx context.Context, keys routing.Keys, topic string, seq int64) (message.Message, bool, error) {
	v := strconv.FormatInt(seq, 10)
	zs, err := s.p.Redis.Do(ctx, s.p.Redis.B().Zrangebyscore().Key(keys.HotMessages(topic)).Min(v).Max(v).Withscores().Build()).AsZScores()
	if err != nil {
		return message.Message{}, false, err
	}
	found, ok := Cached{Members: zs}.msg(seq)
	return found.Normalized(), ok, nil
}
