package persist

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	sq "github.com/Masterminds/squirrel"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/routing"
)

// ToolParams are what the operator's `imshard dlq` commands need.
type ToolParams struct {
	Kafka     config.Kafka
	KafkaConn []kgo.Opt // seed brokers, TLS, SASL: every Kafka client of the service connects alike
	DBs       routing.DBs
	Tenants   func() []string
	Catalog   *routing.Catalog
}

// Tool lists and replays dead letters and compensation entries.
type Tool struct{ p ToolParams }

// NewTool builds the operator tool.
func NewTool(p ToolParams) *Tool { return &Tool{p: p} }

// DeadLetter is one record of the dead-letter topic.
type DeadLetter struct {
	ID        string // dl-PARTITION-OFFSET
	Partition int32
	Offset    int64
	Tenant    string
	Topic     string // "" when the event did not decode
	Seq       int64
	Month     string
	Reason    string
	Error     string
	Source    string
	At        time.Time
	key       []byte
	value     []byte
}

// Compensation is one entry of a tenant's compensation queue.
type Compensation struct {
	ID     string // comp-TENANT-ROW
	Tenant string
	Row    int64
	Topic  string
	Seq    int64
	Month  string
	Reason string
	Status string
	At     time.Time
	value  []byte
}

// DeadLetters reads the dead-letter topic from its start (the tenant's
// records only when tenant is set), at most limit records (0: all).
func (t *Tool) DeadLetters(ctx context.Context, tenant string, limit int) ([]DeadLetter, error) {
	var out []DeadLetter
	err := t.scan(ctx, t.p.Kafka.DLQTopic, time.Time{}, func(r *kgo.Record) {
		if d := deadLetterOf(r); tenant == "" || d.Tenant == tenant {
			out = append(out, d)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("dlq: %w", err)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Partition != out[j].Partition {
			return out[i].Partition < out[j].Partition
		}
		return out[i].Offset < out[j].Offset
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// scan reads topic from since (from its start when zero) up to its end as
// of the call, handing every record to fn.
func (t *Tool) scan(ctx context.Context, topic string, since time.Time, fn func(*kgo.Record)) error {
	from := kgo.NewOffset().AtStart()
	if !since.IsZero() {
		from = kgo.NewOffset().AfterMilli(since.UnixMilli())
	}
	cl, err := kgo.NewClient(append(slices.Clone(t.p.KafkaConn), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(from))...)
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return fmt.Errorf("end offsets of %s: %w", topic, err)
	}
	var starts kadm.ListedOffsets
	if since.IsZero() {
		starts, err = adm.ListStartOffsets(ctx, topic)
	} else {
		starts, err = adm.ListOffsetsAfterMilli(ctx, since.UnixMilli(), topic)
	}
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return fmt.Errorf("start offsets of %s: %w", topic, err)
	}
	// the partitions with records to read, and the offset each ends at
	left := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if s, ok := starts.Lookup(topic, o.Partition); ok && o.Offset > s.Offset {
			left[o.Partition] = o.Offset
		}
	})
	for len(left) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
		for _, fe := range fs.Errors() {
			return fmt.Errorf("read %s: %w", topic, fe.Err)
		}
		for _, r := range fs.Records() {
			end, ok := left[r.Partition]
			if !ok {
				continue // past the end taken at the start
			}
			if r.Offset+1 >= end {
				delete(left, r.Partition)
			}
			fn(r)
		}
	}
	return nil
}

// IssuedSeqs reads the message topic from since (from its start when zero)
// and returns, for each topic of tenant, the highest seq an event carries,
// and how many of the tenant's events it read. Every seq a send acknowledged
// is in an event, so this is the highest seq any client may hold — as far
// back as the topic's retention reaches. Events are read for their tenant,
// topic and seq only, so events of any version count.
func (t *Tool) IssuedSeqs(ctx context.Context, tenant string, since time.Time) (map[string]int64, int, error) {
	prefix := []byte(tenant + "/") // message.Event.Key
	seqs := map[string]int64{}
	n := 0
	err := t.scan(ctx, t.p.Kafka.Topic, since, func(r *kgo.Record) {
		if !bytes.HasPrefix(r.Key, prefix) {
			return
		}
		var ev struct {
			Tenant string `json:"tenant"`
			Topic  string `json:"topic"`
			SeqID  int64  `json:"seq_id"`
		}
		if err := json.Unmarshal(r.Value, &ev); err != nil || ev.Tenant != tenant {
			return // not an event of the tenant's
		}
		if err := routing.ValidTopic(ev.Topic); err != nil {
			return
		}
		n++
		seqs[ev.Topic] = max(seqs[ev.Topic], ev.SeqID)
	})
	if err != nil {
		return nil, 0, fmt.Errorf("issued seqs: %w", err)
	}
	return seqs, n, nil
}

func deadLetterOf(r *kgo.Record) DeadLetter {
	d := DeadLetter{ID: fmt.Sprintf("dl-%d-%d", r.Partition, r.Offset), Partition: r.Partition, Offset: r.Offset,
		key: r.Key, value: r.Value}
	for _, h := range r.Headers {
		switch h.Key {
		case HeaderReason:
			d.Reason = string(h.Value)
		case HeaderError:
			d.Error = string(h.Value)
		case HeaderSource:
			d.Source = string(h.Value)
		case HeaderTenant:
			d.Tenant = string(h.Value)
		case HeaderAt:
			d.At, _ = time.Parse(time.RFC3339Nano, string(h.Value))
		}
	}
	if ev, m, err := DecodeEvent(r.Value); err == nil {
		d.Tenant, d.Topic, d.Seq, d.Month = ev.Tenant, ev.Topic, ev.SeqID, m.String()
	}
	return d
}

func (t *Tool) tenants(tenant string) []string {
	if tenant != "" {
		return []string{tenant}
	}
	return t.p.Tenants()
}

// Compensations lists the compensation queue of tenant (every tenant when
// empty), oldest first, at most limit entries per tenant (0: all).
func (t *Tool) Compensations(ctx context.Context, tenant string, limit int) ([]Compensation, error) {
	var out []Compensation
	var errs []error
	for _, id := range t.tenants(tenant) {
		cs, err := t.compensations(ctx, id, sq.Eq{}, limit)
		if err != nil {
			errs = append(errs, fmt.Errorf("tenant %s: %w", id, err))
			continue
		}
		out = append(out, cs...)
	}
	return out, errors.Join(errs...)
}

func (t *Tool) compensations(ctx context.Context, tenant string, where sq.Sqlizer, limit int) ([]Compensation, error) {
	db, err := t.p.DBs.DB(ctx, tenant)
	if err != nil {
		return nil, err
	}
	q := sq.Select("id", "topic", "seqid", "shard_month", "reason", "status", "created_at", "event").
		From(compensationTable).Where(where).OrderBy("id")
	if limit > 0 {
		q = q.Limit(uint64(limit))
	}
	rows, err := q.RunWith(db).QueryContext(ctx)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Compensation
	for rows.Next() {
		c := Compensation{Tenant: tenant}
		if err := rows.Scan(&c.Row, &c.Topic, &c.Seq, &c.Month, &c.Reason, &c.Status, &c.At, &c.value); err != nil {
			return nil, err
		}
		c.ID = "comp-" + tenant + "-" + strconv.FormatInt(c.Row, 10)
		out = append(out, c)
	}
	return out, rows.Err()
}

// ReplayOptions select what `imshard dlq replay` re-injects: one entry by
// ID, or All pending compensation entries and dead letters (of Tenant, when
// set). Malformed dead letters are replayed only by ID: they would only
// come back.
type ReplayOptions struct {
	Tenant string
	ID     string
	All    bool
	// Month (with Tenant) replays the late events of one month: its pending
	// compensation entries and its dead letters. A sealed month is reopened
	// (sealing, its grace restarted) first, so the patrol seals it again only
	// once the replayed events are proven stored.
	Month string
}

// ReplayReport says what a replay did.
type ReplayReport struct {
	Replayed int
	Skipped  []string // entries left in place, with the reason
}

// ErrNotFound is an --id that names nothing.
var ErrNotFound = errors.New("no such entry")

// Replay re-injects the selected entries into the message topic exactly as
// they were produced: the frozen shard_month is never recomputed (invariant
// 2, docs/invariants.md), and the unique keys make a replay of something already
// stored a no-op. A compensation entry whose month is still sealed is
// skipped (unseal it first); skips make the returned error non-nil.
func (t *Tool) Replay(ctx context.Context, o ReplayOptions) (ReplayReport, error) {
	var rep ReplayReport
	cl, err := kgo.NewClient(append(slices.Clone(t.p.KafkaConn), kgo.RequiredAcks(kgo.AllISRAcks()))...)
	if err != nil {
		return rep, err
	}
	defer cl.Close()
	comps, dls, err := t.selectEntries(ctx, o)
	if err != nil {
		return rep, err
	}
	if o.Month != "" && len(comps)+len(dls) > 0 {
		if err := t.reopen(ctx, o.Tenant, o.Month); err != nil {
			return rep, err
		}
	}
	for _, c := range comps {
		m, err := routing.ParseMonth(c.Month)
		if err != nil {
			rep.Skipped = append(rep.Skipped, c.ID+": "+err.Error())
			continue
		}
		t.p.Catalog.Invalidate(c.Tenant)
		if _, st, err := t.p.Catalog.Table(ctx, c.Tenant, m); err != nil || !st.AcceptsWrites() {
			rep.Skipped = append(rep.Skipped, fmt.Sprintf("%s: month %s is %s; run `imshard shard unseal` first", c.ID, c.Month, orErr(st, err)))
			continue
		}
		rec := &kgo.Record{Topic: t.p.Kafka.Topic, Key: []byte(c.Tenant + "/" + c.Topic), Value: c.value}
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			return rep, fmt.Errorf("replay %s: %w", c.ID, err)
		}
		db, err := t.p.DBs.DB(ctx, c.Tenant)
		if err != nil {
			return rep, err
		}
		if err := routing.Fenced(ctx, db, func(tx *sql.Tx) error {
			_, err := sq.Update(compensationTable).Set("status", "replayed").Where(sq.Eq{"id": c.Row}).
				RunWith(tx).ExecContext(ctx)
			return err
		}); err != nil {
			return rep, fmt.Errorf("replay %s: mark replayed: %w", c.ID, err)
		}
		rep.Replayed++
	}
	for _, d := range dls {
		rec := &kgo.Record{Topic: t.p.Kafka.Topic, Key: d.key, Value: d.value}
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			return rep, fmt.Errorf("replay %s: %w", d.ID, err)
		}
		rep.Replayed++
	}
	if len(rep.Skipped) > 0 {
		return rep, fmt.Errorf("%d entries skipped: %s", len(rep.Skipped), strings.Join(rep.Skipped, "; "))
	}
	return rep, nil
}

// ErrArchived refuses a month replay into an archived month: its rows are
// in the archive, which is never rewritten; restore the month first.
var ErrArchived = errors.New("month is archived; run imshard shard restore first")

// reopen makes a sealed month take writes again for a month replay.
func (t *Tool) reopen(ctx context.Context, tenant, month string) error {
	m, err := routing.ParseMonth(month)
	if err != nil {
		return err
	}
	defer t.p.Catalog.Invalidate(tenant)
	t.p.Catalog.Invalidate(tenant)
	_, st, err := t.p.Catalog.Table(ctx, tenant, m)
	switch {
	case err != nil:
		return err
	case st == routing.StatusArchived:
		return fmt.Errorf("%w: %s", ErrArchived, month)
	case st != routing.StatusSealed:
		return nil
	}
	db, err := t.p.DBs.DB(ctx, tenant)
	if err != nil {
		return err
	}
	if _, err := routing.SetStatus(ctx, db, m, routing.StatusSealing, routing.StatusSealed); err != nil {
		return err
	}
	return nil
}

func orErr(st routing.Status, err error) string {
	if err != nil {
		return err.Error()
	}
	return string(st)
}

func (t *Tool) selectEntries(ctx context.Context, o ReplayOptions) ([]Compensation, []DeadLetter, error) {
	switch {
	case strings.HasPrefix(o.ID, "comp-"):
		rest := strings.TrimPrefix(o.ID, "comp-")
		i := strings.LastIndexByte(rest, '-')
		if i < 0 {
			return nil, nil, fmt.Errorf("%w: %s", ErrNotFound, o.ID)
		}
		tenant, row := rest[:i], rest[i+1:]
		n, err := strconv.ParseInt(row, 10, 64)
		if err != nil || routing.ValidTenant(tenant) != nil || (o.Tenant != "" && o.Tenant != tenant) {
			return nil, nil, fmt.Errorf("%w: %s", ErrNotFound, o.ID)
		}
		cs, err := t.compensations(ctx, tenant, sq.Eq{"id": n}, 1)
		if err != nil {
			return nil, nil, err
		}
		if len(cs) == 0 {
			return nil, nil, fmt.Errorf("%w: %s", ErrNotFound, o.ID)
		}
		return cs, nil, nil
	case strings.HasPrefix(o.ID, "dl-"):
		all, err := t.DeadLetters(ctx, o.Tenant, 0)
		if err != nil {
			return nil, nil, err
		}
		for _, d := range all {
			if d.ID == o.ID {
				return nil, []DeadLetter{d}, nil
			}
		}
		return nil, nil, fmt.Errorf("%w: %s", ErrNotFound, o.ID)
	case o.ID != "":
		return nil, nil, fmt.Errorf("%w: %s (ids look like comp-TENANT-N or dl-P-OFFSET)", ErrNotFound, o.ID)
	case o.Month != "":
		if o.Tenant == "" {
			return nil, nil, errors.New("replay --month needs --tenant")
		}
		if _, err := routing.ParseMonth(o.Month); err != nil {
			return nil, nil, err
		}
		comps, err := t.compensations(ctx, o.Tenant, sq.Eq{"status": "pending", "shard_month": o.Month}, 0)
		if err != nil {
			return nil, nil, err
		}
		all, err := t.DeadLetters(ctx, o.Tenant, 0)
		if err != nil {
			return nil, nil, err
		}
		var dls []DeadLetter
		for _, d := range all {
			if d.Reason != reasonMalformed && d.Month == o.Month {
				dls = append(dls, d)
			}
		}
		return comps, dls, nil
	case !o.All:
		return nil, nil, errors.New("replay needs --id or --all")
	}
	var comps []Compensation
	var errs []error
	for _, id := range t.tenants(o.Tenant) {
		cs, err := t.compensations(ctx, id, sq.Eq{"status": "pending"}, 0)
		if err != nil {
			errs = append(errs, fmt.Errorf("tenant %s: %w", id, err))
			continue
		}
		comps = append(comps, cs...)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, nil, err
	}
	all, err := t.DeadLetters(ctx, o.Tenant, 0)
	if err != nil {
		return nil, nil, err
	}
	var dls []DeadLetter
	for _, d := range all {
		if d.Reason != reasonMalformed && d.Topic != "" {
			dls = append(dls, d)
		}
	}
	return comps, dls, nil
}
