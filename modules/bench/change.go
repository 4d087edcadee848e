package bench

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/readpath"
	"github.com/imshard/imshard/modules/routing"
)

// The change runs of `imshard bench query`: edits and recalls through the
// service (the whole change path: membership, in-flight check, route, the
// locked row, revision, change_seq, the Redis script before the commit,
// the hot-cache put and the event after it) beside the raw transaction on
// the same fixture — SELECT … FOR UPDATE, UPDATE, the revision INSERT.
// Every operation takes a row no earlier one touched, spread over every
// month of the fixture, so an edit is always based on version 1 and a
// recall never meets a recalled message.

// ChangeReport holds the change runs. The raw transaction runs before and
// after the service runs: the host drifts (a freshly built fixture's pages
// are still being flushed; other work comes and goes), and the service
// runs are compared with the mean of the two.
type ChangeReport struct {
	RawBefore QueryResult // raw SQL: the edit's transaction without the caches
	Edit      QueryResult // service: PATCH's path, a message of any month
	Recall    QueryResult // service: recall's path, a message of any month
	RawAfter  QueryResult // raw SQL again
}

// Raw is the raw transaction's mean of the runs before and after the
// service runs (those that ran), as the rate the bars compare with.
func (r ChangeReport) Raw() QueryResult {
	out := QueryResult{Name: "raw SQL edit transaction, mean", Skipped: true}
	for _, b := range []QueryResult{r.RawBefore, r.RawAfter} {
		if !b.Skipped {
			out.Skipped = false
			out.Count += b.Count
			out.Elapsed += b.Elapsed
		}
	}
	return out
}

// rows hands out fixture rows, each once: the k-th is topic k mod Topics
// at a seq that strides through the topic's whole history.
type benchRows struct {
	next   atomic.Int64
	topics int64
	last   int64
	stride int64
}

func newBenchRows(topics int, last int64) *benchRows {
	stride := int64(7919) // coprime to last: steps through every seq once
	for gcd(stride, last) != 1 {
		stride++
	}
	return &benchRows{topics: int64(topics), last: last, stride: stride}
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// take is the next row no operation had; false when all were had.
func (r *benchRows) take() (topic string, seq int64, ok bool) {
	k := r.next.Add(1) - 1
	if k >= r.topics*r.last {
		return "", 0, false
	}
	return benchTopic(int(k % r.topics)), 1 + (k/r.topics*r.stride)%r.last, true
}

// tableOf is the month table holding seq.
func (p *QueryParams) tableOf(seq int64) routing.Table {
	for j := range p.Tables {
		if base, n := p.span(j); seq <= base+n {
			return p.Tables[j]
		}
	}
	return p.Tables[len(p.Tables)-1]
}

// rawEdit is an edit's transaction and nothing else on table t — the row
// locked (the statement the change path locks it with), the update, the
// revision by benchUser; no membership check, caches or event: the raw
// limit of an edit.
func rawEdit(ctx context.Context, db *sql.DB, t routing.Table, topic string, seq int64, content string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	rows, err := sq.Select(readpath.Columns...).From(t.Quoted() + " AS m").
		Where(sq.Eq{"m.topic": topic, "m.seqid": seq}).Suffix("FOR UPDATE").RunWith(tx).QueryContext(ctx)
	if err != nil {
		return err
	}
	var old message.Message
	if rows.Next() {
		old, err = readpath.ScanMessage(rows)
	} else if err = rows.Err(); err == nil {
		err = readpath.ErrNotFound
	}
	if err = errors.Join(err, rows.Close()); err != nil {
		return fmt.Errorf("bench: lock %s/%d: %w", topic, seq, err)
	}
	now := time.Now().UTC()
	if _, err := sq.Update(t.Quoted()).Set("content", content).Set("version", old.Version+1).Set("updated_at", now).
		Where(sq.Eq{"topic": topic, "seqid": seq}).RunWith(tx).ExecContext(ctx); err != nil {
		return err
	}
	if err := readpath.RecordRevision(ctx, tx, readpath.NewRevision{
		Topic: topic, Month: t.Month(), Seq: seq, MessageID: old.MessageID, Action: message.ActionEdit, Version: old.Version + 1,
		Content: old.Content, Head: old.Head, Actor: benchUser, At: now,
	}); err != nil {
		return err
	}
	return tx.Commit()
}

var errBenchRowsUsed = errors.New("bench: every fixture row was changed; use a larger fixture or shorter runs")

// MeasureChanges runs the change runs on the fixture (which they change:
// a kept fixture holds edited and recalled rows afterwards).
func (p *QueryParams) MeasureChanges(ctx context.Context) (ChangeReport, error) {
	var rep ChangeReport
	rows := newBenchRows(p.Topics, p.last())
	sender := httpapi.Principal{Tenant: p.Tenant, UserID: benchUser}
	service := httpapi.Principal{Tenant: p.Tenant, UserID: benchUser, Role: httpapi.RoleService}
	raw := func(ctx context.Context, _ *rand.Rand) error {
		topic, seq, ok := rows.take()
		if !ok {
			return errBenchRowsUsed
		}
		return rawEdit(ctx, p.DB, p.tableOf(seq), topic, seq, `{"text":"edited `+strconv.FormatInt(seq, 10)+`"}`)
	}
	rep.RawBefore = p.run(ctx, "raw SQL edit transaction, before", p.Concurrency, raw)
	rep.Edit = p.run(ctx, "service edit, any month", p.Concurrency, func(ctx context.Context, _ *rand.Rand) error {
		topic, seq, ok := rows.take()
		if !ok {
			return errBenchRowsUsed
		}
		content := json.RawMessage(`{"text":"edited ` + strconv.FormatInt(seq, 10) + `"}`)
		changeSeq, err := p.Edit(ctx, sender, topic, seq, content, 1)
		if err == nil && changeSeq == 0 {
			err = fmt.Errorf("edit of %s/%d changed nothing", topic, seq)
		}
		return err
	})
	rep.Recall = p.run(ctx, "service recall, any month", p.Concurrency, func(ctx context.Context, _ *rand.Rand) error {
		topic, seq, ok := rows.take()
		if !ok {
			return errBenchRowsUsed
		}
		changeSeq, err := p.Recall(ctx, service, topic, seq, "bench")
		if err == nil && changeSeq == 0 {
			err = fmt.Errorf("recall of %s/%d changed nothing", topic, seq)
		}
		return err
	})
	rep.RawAfter = p.run(ctx, "raw SQL edit transaction, after", p.Concurrency, raw)
	return rep, ctx.Err()
}
