package bench

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/imshard/imshard/modules/acl"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/readpath"
	"github.com/imshard/imshard/modules/routing"
)

// InboxParams shape one `imshard bench inbox` run: a fixture of Users
// users, each a member of MinPer..MaxPer of Topics topics (the first
// HeavyUsers in exactly MaxPer), Messages stored messages per topic in the
// current month's table, and cursors leaving a fifth of the memberships
// with something unread. The tenant must be the benchmark's own.
type InboxParams struct {
	// Unread is the query role's GET /v1/me/unread, List its first
	// topic-list page of 50, MarkRead a read-cursor move
	Unread   func(ctx context.Context, p httpapi.Principal) error
	List     func(ctx context.Context, p httpapi.Principal) error
	MarkRead func(ctx context.Context, p httpapi.Principal, topic string, seq int64) error
	// NotHidden is the query role's condition on a message row (alias m,
	// one ? for the user) that drops what the user hid
	NotHidden string
	// Reader is the query role's read path (the hot cache is filled from
	// its pages); Redis is the service's. Cold leaves the hot caches and
	// seq counters empty: every count reads MySQL.
	Reader      *readpath.Reader
	Redis       rueidis.Client
	KeySpace    routing.KeySpace
	Cold        bool
	DB          *sql.DB
	Tenant      string
	Table       routing.Table // the current month's
	Users       int
	Topics      int
	MinPer      int
	MaxPer      int
	HeavyUsers  int
	Messages    int
	Concurrency int
	Duration    time.Duration
	Warmup      time.Duration
	Progress    io.Writer
}

// InboxReport holds the runs of the read-state benchmark.
type InboxReport struct {
	Unread    QueryResult // service: GET /v1/me/unread's answer
	RawUnread QueryResult // raw SQL: the same counts in one statement
	List      QueryResult // service: the first topic-list page of 50
	RawList   QueryResult // raw SQL: the same page in one statement
	Read      QueryResult // service: a read-cursor move
	// Moved is the service's GET /v1/me/unread right after the same user
	// moved a cursor (to the topic's top, untimed): the cached entry and
	// that topic's count changed since the user's last badge
	Moved QueryResult
	Rows  int64 // memberships of the fixture
}

func inboxTopic(i int) string { return fmt.Sprintf("bi%05d", i) }

const inboxOutsider int64 = 9_000_000 // sends most fixture messages

func (p *InboxParams) logf(format string, args ...any) {
	if p.Progress != nil {
		fmt.Fprintf(p.Progress, format+"\n", args...)
	}
}

// Build writes the fixture with multi-row INSERTs.
func (p *InboxParams) Build(ctx context.Context) (int64, error) {
	rng := rand.New(rand.NewPCG(15, 15))
	flush := func(prefix string, vals *[]string) error {
		if len(*vals) == 0 {
			return nil
		}
		_, err := p.DB.ExecContext(ctx, prefix+strings.Join(*vals, ","))
		*vals = (*vals)[:0]
		return err
	}
	p.logf("bench: %d groups", p.Topics)
	var groups []acl.Group
	for i := range p.Topics {
		groups = append(groups, acl.Group{Topic: inboxTopic(i), ID: int64(i + 1), Status: acl.GroupActive})
		if len(groups) == 1000 || i == p.Topics-1 {
			if err := acl.InsertGroups(ctx, p.DB, groups); err != nil {
				return 0, err
			}
			groups = groups[:0]
		}
	}
	var vals []string
	var mentions []routing.Mention
	p.logf("bench: %d messages per topic in %s", p.Messages, p.Table.Name())
	base := time.Now().Add(-time.Hour).UTC()
	id := base.UnixNano()
	for i := range p.Topics {
		for s := 1; s <= p.Messages; s++ {
			from := inboxOutsider
			if rng.IntN(10) == 0 {
				from = int64(1 + rng.IntN(p.Users))
			}
			mention := "NULL"
			if rng.IntN(20) == 0 {
				u := 1 + rng.IntN(p.Users)
				mention = fmt.Sprintf("'[\"%d\"]'", u)
				mentions = append(mentions, routing.Mention{Topic: inboxTopic(i), User: int64(u), Seq: int64(s)})
			}
			id++
			at := base.Add(time.Duration(rng.Int64N(int64(time.Hour)))).Format("2006-01-02 15:04:05.000")
			vals = append(vals, fmt.Sprintf("(%d, '%s', %d, %d, %d, 'text', '{\"text\":\"hello\"}', %s, '%s', '%s')",
				id, inboxTopic(i), i+1, s, from, mention, at, at))
			if len(vals) == 1000 {
				if err := flush("INSERT INTO "+p.Table.Quoted()+" (message_id, topic, group_id, seqid, from_user, msg_type, content, mentioned_user_ids, created_at, updated_at) VALUES ", &vals); err != nil {
					return 0, err
				}
			}
		}
	}
	if err := flush("INSERT INTO "+p.Table.Quoted()+" (message_id, topic, group_id, seqid, from_user, msg_type, content, mentioned_user_ids, created_at, updated_at) VALUES ", &vals); err != nil {
		return 0, err
	}
	// the mention index persist writes beside such messages
	for lo := 0; lo < len(mentions); lo += 1000 {
		part := mentions[lo:min(len(mentions), lo+1000)]
		if err := routing.Fenced(ctx, p.DB, func(tx *sql.Tx) error { return routing.AddMentions(ctx, tx, part) }); err != nil {
			return 0, err
		}
	}
	if err := routing.Fenced(ctx, p.DB, func(tx *sql.Tx) error { return routing.MirrorFromTable(ctx, tx, p.Table) }); err != nil {
		return 0, err
	}
	if !p.Cold {
		if err := p.fillHot(ctx); err != nil {
			return 0, err
		}
	}
	p.logf("bench: %d users in %d..%d topics each", p.Users, p.MinPer, p.MaxPer)
	// every membership is drawn first, then each table is written in its
	// primary key's order (members by topic, cursors by user) by its own
	// connection: appending to the B-trees keeps a fixture of millions of
	// rows from paging a small buffer pool through random inserts
	type membership struct{ topic, user, read int32 }
	var all []membership
	for u := 1; u <= p.Users; u++ {
		n := p.MaxPer
		if u > p.HeavyUsers {
			n = p.MinPer + rng.IntN(p.MaxPer-p.MinPer+1)
		}
		ts := rng.Perm(p.Topics)[:n]
		slices.Sort(ts)
		for _, t := range ts {
			read := p.Messages
			if rng.IntN(5) == 0 {
				read = rng.IntN(p.Messages)
			}
			all = append(all, membership{int32(t), int32(u), int32(read)})
		}
	}
	byTopic := slices.Clone(all)
	slices.SortFunc(byTopic, func(a, b membership) int { return cmp.Or(cmp.Compare(a.topic, b.topic), cmp.Compare(a.user, b.user)) })
	const per = 5000 // rows a statement
	var wg sync.WaitGroup
	var merr, cerr error
	wg.Go(func() {
		rows := make([]acl.Member, 0, per)
		for lo := 0; lo < len(byTopic) && merr == nil; lo += per {
			rows = rows[:0]
			for _, m := range byTopic[lo:min(len(byTopic), lo+per)] {
				rows = append(rows, acl.Member{Topic: inboxTopic(int(m.topic)), User: int64(m.user)})
			}
			merr = acl.InsertMembers(ctx, p.DB, rows)
		}
	})
	wg.Go(func() {
		rows := make([]acl.Cursor, 0, per)
		for lo := 0; lo < len(all) && cerr == nil; lo += per {
			rows = rows[:0]
			for _, m := range all[lo:min(len(all), lo+per)] {
				rows = append(rows, acl.Cursor{User: int64(m.user), Topic: inboxTopic(int(m.topic)), ReadSeq: int64(m.read)})
			}
			cerr = acl.InsertCursors(ctx, p.DB, rows)
		}
	})
	wg.Wait()
	if err := errors.Join(merr, cerr); err != nil {
		return 0, err
	}
	return int64(len(all)), nil
}

// fillHot leaves in Redis what sending the fixture's messages would: each
// topic's messages in its hot cache (they are an hour old, within its
// day), its seq counter and its versions.
func (p *InboxParams) fillHot(ctx context.Context) error {
	p.logf("bench: hot caches of %d topics", p.Topics)
	keys, err := p.KeySpace.Tenant(p.Tenant)
	if err != nil {
		return err
	}
	const per = 100 // topics a pipeline
	for lo := 0; lo < p.Topics; lo += per {
		var cmds []rueidis.Completed
		for i := lo; i < min(p.Topics, lo+per); i++ {
			ms, err := tablePage(ctx, p.Reader, p.DB, p.Table.Quoted(), inboxTopic(i), int64(p.Messages)+1, p.Messages)
			if err != nil {
				return err
			}
			cmds = append(cmds, HotFill(p.Redis, keys, inboxTopic(i), ms, int64(p.Messages))...)
		}
		for _, r := range p.Redis.DoMulti(ctx, cmds...) {
			if err := r.Error(); err != nil && !rueidis.IsRedisNil(err) {
				return err
			}
		}
	}
	return nil
}

func drain(rows *sql.Rows, err error) error {
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
	}
	return rows.Err()
}

// Measure runs every read of the report, as heavy users (in MaxPer topics).
func (p *InboxParams) Measure(ctx context.Context) InboxReport {
	bp := &QueryParams{Duration: p.Duration, Warmup: p.Warmup, Progress: p.Progress}
	heavy := max(1, p.HeavyUsers)
	user := func(rng *rand.Rand) httpapi.Principal {
		return httpapi.Principal{Tenant: p.Tenant, UserID: int64(1 + rng.IntN(heavy))}
	}
	var rep InboxReport
	rep.Unread = bp.run(ctx, "service GET /v1/me/unread", p.Concurrency, func(ctx context.Context, rng *rand.Rand) error {
		return p.Unread(ctx, user(rng))
	})
	raw := acl.RawUnread(p.Table.Quoted(), p.NotHidden)
	rep.RawUnread = bp.run(ctx, "raw SQL unread", p.Concurrency, func(ctx context.Context, rng *rand.Rand) error {
		u := user(rng).UserID
		return drain(p.DB.QueryContext(ctx, raw, strconv.FormatInt(u, 10), u, u))
	})
	rep.List = bp.run(ctx, "service topic list page (50)", p.Concurrency, func(ctx context.Context, rng *rand.Rand) error {
		return p.List(ctx, user(rng))
	})
	rawL := acl.RawList(p.Table.Quoted())
	rep.RawList = bp.run(ctx, "raw SQL topic list page (50)", p.Concurrency, func(ctx context.Context, rng *rand.Rand) error {
		return drain(p.DB.QueryContext(ctx, rawL, user(rng).UserID))
	})
	mine := make([][]string, heavy)
	for i := range mine {
		ts, err := acl.TopicsOf(ctx, p.DB, int64(i+1))
		if err != nil {
			p.logf("bench: topics of user %d: %v", i+1, err)
			return rep
		}
		mine[i] = ts
	}
	rep.Read = bp.run(ctx, "service read-cursor move", p.Concurrency, func(ctx context.Context, rng *rand.Rand) error {
		pr := user(rng)
		ts := mine[pr.UserID-1]
		if len(ts) == 0 {
			return fmt.Errorf("bench: user %d has no topic", pr.UserID)
		}
		return p.MarkRead(ctx, pr, ts[rng.IntN(len(ts))], int64(rng.IntN(p.Messages+1)))
	})
	rep.Moved = bp.runStaged(ctx, "service GET /v1/me/unread after a cursor move", p.Concurrency, func(ctx context.Context, rng *rand.Rand) (func(context.Context) error, error) {
		pr := user(rng)
		ts := mine[pr.UserID-1]
		if len(ts) == 0 {
			return nil, fmt.Errorf("bench: user %d has no topic", pr.UserID)
		}
		if err := p.MarkRead(ctx, pr, ts[rng.IntN(len(ts))], int64(p.Messages)); err != nil {
			return nil, err
		}
		return func(ctx context.Context) error { return p.Unread(ctx, pr) }, nil
	})
	return rep
}
