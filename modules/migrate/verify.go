package migrate

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/modules/routing"
)

// verify compares, per topic and month range, the legacy rows up to the
// topic's cutover_seq with the month table's rows of the same seqs: count
// and an order-independent hash of every column (JSON normalised in Go, so
// MariaDB's text and MySQL 8's binary JSON hash alike). No difference:
// done. Differences are recorded; the first time, the backfill copies
// their ranges again and verification runs once more; after that the
// migration waits in verifying for the operator (`migrate verify`).
func (mg *Migrator) verify(ctx context.Context, db *sql.DB, tenant string, m routing.Migration) error {
	start := time.Now()
	diffs, err := Differences(ctx, db, mg.p.Catalog, tenant)
	if err != nil {
		return err
	}
	if err := routing.ReplaceMigrationDiffs(ctx, db, diffs); err != nil {
		return err
	}
	mg.m.diffs.WithLabelValues(tenant).Set(float64(len(diffs)))
	n := len(diffs)
	set := routing.MigrationChange{Verified: &n}
	log := mg.p.Log.Info().Str("tenant", tenant).Int("differences", n).Dur("took", time.Since(start))
	switch {
	case n == 0:
		_, err = routing.StepMigration(ctx, db, routing.StepVerified, set)
		log.Msg("verification passed")
	case m.RedoRounds == 0:
		_, err = routing.StepMigration(ctx, db, routing.StepRedo, set)
		log.Msg("verification found differences; copying their ranges again")
	default:
		err = routing.Fenced(ctx, db, func(tx *sql.Tx) error {
			_, err := routing.SetMigration(ctx, tx, set, routing.MigrationVerifying)
			return err
		})
		log.Msg("verification found differences again; waiting for the operator")
	}
	return err
}

// verifyChunk is how many topics one pass of the verification reads.
const verifyChunk = 1000

// Differences verifies every topic month of the migration: for a chunk of
// topics at a time it streams their legacy rows (each to the month its
// seq range goes to) and their rows in every month table up to the
// topic's cutover_seq, and compares count and hash per topic and month.
func Differences(ctx context.Context, db *sql.DB, catalog *routing.Catalog, tenant string) ([]routing.MigrationDiff, error) {
	topics, err := routing.MigrationTopics(ctx, db)
	if err != nil {
		return nil, err
	}
	shards, err := catalog.List(ctx, tenant)
	if err != nil {
		return nil, err
	}
	var out []routing.MigrationDiff
	for lo := 0; lo < len(topics); lo += verifyChunk {
		part := topics[lo:min(lo+verifyChunk, len(topics))]
		names := make([]string, len(part))
		cut := make(map[string]int64, len(part))
		for i, t := range part {
			names[i] = t.Topic
			cut[t.Topic] = t.CutoverSeq
		}
		splits, err := routing.LoadSplits(ctx, db, names)
		if err != nil {
			return nil, err
		}
		acc := map[topicMonth]*sides{}
		side := func(topic string, m routing.Month) *sides {
			k := topicMonth{topic, m}
			if acc[k] == nil {
				acc[k] = &sides{}
			}
			return acc[k]
		}
		err = hashRows(ctx, db, routing.LegacyQuoted(), names, func(topic string, seq int64, sum []byte) {
			if sp, ok := splits[topic]; ok && seq <= cut[topic] {
				side(topic, routing.MonthOfSeq(sp, seq)).legacy.add(seq, sum)
			}
		})
		if err != nil {
			return nil, err
		}
		for _, sh := range shards {
			month := sh.Month
			err := hashRows(ctx, db, sh.Table.Quoted(), names, func(topic string, seq int64, sum []byte) {
				if c, ok := cut[topic]; ok && seq <= c {
					side(topic, month).month.add(seq, sum)
				}
			})
			if err != nil {
				return nil, err
			}
		}
		keys := make([]topicMonth, 0, len(acc))
		for k := range acc {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(a, b topicMonth) int {
			if c := strings.Compare(a.topic, b.topic); c != 0 {
				return c
			}
			return a.month.Compare(b.month)
		})
		for _, k := range keys {
			s := acc[k]
			if s.legacy.n == s.month.n && s.legacy.sum == s.month.sum {
				continue
			}
			d := routing.MigrationDiff{Topic: k.topic, Month: k.month, MinSeq: s.legacy.lo, MaxSeq: s.legacy.hi,
				LegacyRows: s.legacy.n, MonthRows: s.month.n,
				LegacyHash: hex.EncodeToString(s.legacy.sum[:]), MonthHash: hex.EncodeToString(s.month.sum[:])}
			if s.legacy.n == 0 {
				d.MinSeq, d.MaxSeq = s.month.lo, s.month.hi
			} else if s.month.n > 0 {
				d.MinSeq, d.MaxSeq = min(d.MinSeq, s.month.lo), max(d.MaxSeq, s.month.hi)
			}
			out = append(out, d)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	return out, nil
}

// topicMonth is one topic's part in one month.
type topicMonth struct {
	topic string
	month routing.Month
}

// sides are one topic month's rows in the legacy table and in month tables.
type sides struct{ legacy, month digest }

// digest is a count, a seq range and the XOR of the rows' SHA-256: order
// does not matter ((topic, seqid) is unique in a table, so no row cancels
// a copy of itself).
type digest struct {
	n      int64
	lo, hi int64
	sum    [sha256.Size]byte
}

func (d *digest) add(seq int64, sum []byte) {
	if d.n == 0 || seq < d.lo {
		d.lo = seq
	}
	d.hi = max(d.hi, seq)
	d.n++
	for i := range d.sum {
		d.sum[i] ^= sum[i]
	}
}

// hashRows streams the rows of topics in the table quoted and hands each
// row's topic, seq and SHA-256 of its canonical form to fn.
func hashRows(ctx context.Context, db *sql.DB, quoted string, topics []string, fn func(topic string, seq int64, sum []byte)) error {
	rows, err := sq.Select(columnNames()...).From(quoted).Where(sq.Eq{"topic": topics}).RunWith(db).QueryContext(ctx)
	if err != nil {
		return fmt.Errorf("verify: read %s: %w", quoted, err)
	}
	defer rows.Close()
	vals := make([]any, len(routing.LegacyColumns))
	ptrs := make([]any, len(vals))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	var buf bytes.Buffer
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return err
		}
		buf.Reset()
		if err := CanonicalRow(&buf, vals); err != nil {
			return fmt.Errorf("verify: %s: %w", quoted, err)
		}
		sum := sha256.Sum256(buf.Bytes())
		topic, _ := vals[colTopic].([]byte)
		seq, _ := vals[colSeq].(int64)
		fn(string(topic), seq, sum[:])
	}
	return rows.Err()
}

// CanonicalRow is routing.CanonicalRow: the verification hashes rows the
// way the archive does.
func CanonicalRow(buf *bytes.Buffer, vals []any) error { return routing.CanonicalRow(buf, vals) }

func canonicalJSON(buf *bytes.Buffer, raw []byte) error { return routing.CanonicalJSON(buf, raw) }
