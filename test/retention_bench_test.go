package test

import (
	"context"
	"strings"
	"testing"
	"time"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// BenchmarkEraseWalk: how long an erase takes to find one user's messages
// in a month table of 100,000 rows (100 topics of 1,000 seqs, 50 senders:
// the user sent 2,000), in batches of 1,000 as the job reads them — through
// the sender index (from_user, topic, seqid), and ignoring it (a table made
// before the template had it). docs/performance.md "User erase".
//
//	go test -run '^$' -bench BenchmarkEraseWalk -benchtime 20x ./test
func BenchmarkEraseWalk(b *testing.B) {
	ctx := context.Background()
	e := harness.Start(b, harness.Options{Roles: []string{"query"}})
	t, err := routing.TableFor(e.Now())
	if err != nil {
		b.Fatal(err)
	}
	at := time.Now().UTC()
	for topic := range 100 {
		q := sq.Insert(t.Quoted()).Columns("message_id", "topic", "group_id", "seqid", "from_user", "content", "created_at", "updated_at")
		for seq := 1; seq <= 1000; seq++ {
			q = q.Values(topic*10_000+seq, "t"+string(rune('A'+topic/26))+string(rune('a'+topic%26)), topic, seq, seq%50, `{"text":"x"}`, at, at)
		}
		if _, err := q.RunWith(e.DB).ExecContext(ctx); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := e.DB.ExecContext(ctx, "ANALYZE TABLE "+t.Quoted()); err != nil {
		b.Fatal(err)
	}
	walk := func(b *testing.B, hint string) {
		for b.Loop() {
			topic, seq, found := "", int64(0), 0
			for {
				rows, err := sq.Select("topic", "seqid").From(t.Quoted()+" "+hint+" (idx_from_topic_seq)").Where(sq.Eq{"from_user": 7}).
					Where(sq.Or{sq.Gt{"topic": topic}, sq.And{sq.Eq{"topic": topic}, sq.Gt{"seqid": seq}}}).
					OrderBy("topic", "seqid").Limit(1000).RunWith(e.DB).QueryContext(ctx)
				if err != nil {
					b.Fatal(err)
				}
				n := 0
				for rows.Next() {
					if err := rows.Scan(&topic, &seq); err != nil {
						b.Fatal(err)
					}
					n++
				}
				rows.Close()
				found += n
				if n < 1000 {
					break
				}
			}
			if found != 2000 {
				b.Fatalf("found %d of the user's 2,000 messages", found)
			}
		}
	}
	b.Run("scan", func(b *testing.B) { walk(b, "IGNORE INDEX") })
	b.Run("index", func(b *testing.B) { walk(b, "FORCE INDEX") })
}

// BenchmarkEraseBatched: a user erase of 10,000 messages (40 topics of 250,
// one month) through the job, batch by batch, beside a raw UPDATE of the
// same rows in the same run; reports both rates and their ratio (the
// issue's bar is 0.5). docs/performance.md "User erase".
//
//	go test -run '^$' -bench BenchmarkEraseBatched -benchtime 1x ./test
func BenchmarkEraseBatched(b *testing.B) {
	ctx := context.Background()
	e := harness.Start(b, harness.Options{Roles: []string{"send", "query"}})
	t, err := routing.TableFor(e.Now())
	if err != nil {
		b.Fatal(err)
	}
	at := time.Now().UTC()
	for topic := range 40 {
		q := sq.Insert(t.Quoted()).Columns("message_id", "topic", "group_id", "seqid", "from_user", "content", "created_at", "updated_at")
		for seq := 1; seq <= 250; seq++ {
			q = q.Values(topic*10_000+seq, "e"+string(rune('A'+topic/26))+string(rune('a'+topic%26)), topic, seq, 5, `{"text":"x"}`, at, at)
		}
		if _, err := q.RunWith(e.DB).ExecContext(ctx); err != nil {
			b.Fatal(err)
		}
	}
	var erase, raw time.Duration
	for b.Loop() {
		if _, err := sq.Update(t.Quoted()).Set("status", "normal").Set("content", `{"text":"x"}`).Where(sq.Eq{"from_user": 5}).
			RunWith(e.DB).ExecContext(ctx); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if _, err := e.App.Retention().StartErase(ctx, e.Tenant, 5); err != nil {
			b.Fatal(err)
		}
		if n, err := e.App.Retention().RunJobs(ctx, e.Tenant, "bench", time.Minute); err != nil || n != 1 {
			b.Fatalf("erase: %d %v", n, err)
		}
		erase += time.Since(start)
		start = time.Now()
		if _, err := sq.Update(t.Quoted()).Set("status", "deleted").Set("content", nil).Set("head", nil).Set("version", sq.Expr("version + 1")).
			Where(sq.Eq{"from_user": 5}).RunWith(e.DB).ExecContext(ctx); err != nil {
			b.Fatal(err)
		}
		raw += time.Since(start)
	}
	b.ReportMetric(float64(10_000*b.N)/erase.Seconds(), "erase-msg/s")
	b.ReportMetric(float64(10_000*b.N)/raw.Seconds(), "raw-msg/s")
	b.ReportMetric(raw.Seconds()/erase.Seconds(), "ratio")
}

// `imshard bench retention` runs end to end — the expired month filled,
// sealed and dropped by the retention run under a send load beside the
// load without it, the user erased through the job beside a raw UPDATE,
// the oldest of the three months archived first through the archive job —
// in a tenant of its own that it drops, and rejects bad usage with exit 2
// (figures are not asserted: they belong to docs/performance.md).
func TestRetentionBenchCommand(t *testing.T) {
	t.Parallel()
	tenant := testenv.NewTenant(t)
	cfg := tenantConfig(t, tenant, "")
	code, out := runCLI(t, nil, "--config", cfg, "bench", "retention", "--tenant", tenant,
		"--rows=400", "--topics=4", "--erase-messages=60", "--rate=50", "--duration=1s")
	for _, want := range []string{"without a drop", "across the retention run", "retention run: 1 month(s), 400 rows dropped",
		"month drop (retention run)", "not judged: below the bar's size", "send p99 across the drop / without it (mean)",
		"first erase (user 1000001, the tenant's overlay empty): 120 messages", "warm-up erase: 80 messages of the archived month",
		"erase job (user 1000002, the steady state): 120 messages", "erase job rate / raw UPDATE rate",
		"40 of each user's messages (erased into its overlay"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("bench retention: exit %d, want %q in\n%s", code, want, out)
		}
	}
	var n int
	if err := testenv.MySQL(t).QueryRowContext(context.Background(), "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME LIKE ?",
		"%"+tenant+"%").Scan(&n); err != nil || n != 0 {
		t.Fatalf("bench retention left %d databases of its tenant: %v", n, err)
	}
	for _, bad := range [][]string{{"--rows=0"}, {"--rate=0"}, {"--erase-messages=2"}, {"--tenant=Bad-Id"}} {
		if code, out := runCLI(t, nil, append([]string{"--config", cfg, "bench", "retention"}, bad...)...); code != 2 {
			t.Fatalf("bench retention %v: exit %d, want 2\n%s", bad, code, out)
		}
	}
}
