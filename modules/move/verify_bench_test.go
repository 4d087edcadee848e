package move

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	imsql "github.com/imshard/imshard/sql"
)

// BenchmarkVerifyAll times the verification of a copied tenant of three
// month tables (IMSHARD_VERIFY_ROWS rows in all, 30,000 by default; chunks
// of 2,000 rows) on two databases of the shared server, while a writer
// inserts 100 rows a second into the last month (the active one) from
// before the copy on: the copy step's proofs of the tables nobody wrote
// (beside its copy; the step waits for those still running once every
// chunk is copied, from HookCopied to its end) and, after a catch-up round
// as the mover's, the verification step (verifyAll). It reports the rows
// verified per second of the step alone (rows/s) and of the copy step's
// wait for its proofs and the step together (rows/s-all: each pass of the
// step counted with that wait once), the wait (s-proofs) and the copy
// step's time before it (s-copy: the copy with the proofs beside it).
func BenchmarkVerifyAll(b *testing.B) {
	ctx := context.Background()
	total := 30000
	if s := os.Getenv("IMSHARD_VERIFY_ROWS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			b.Fatal(err)
		}
		total = n
	}
	src, dst := moverDB(b), moverDB(b)
	months := []string{"209001", "209002", "209003"}
	for i, month := range months {
		name := "im_group_messages_" + month
		if _, err := src.ExecContext(ctx, strings.ReplaceAll(imsql.MonthTable(), "{{table}}", name)); err != nil {
			b.Fatal(err)
		}
		per := total / len(months)
		base := i * per
		if _, err := src.ExecContext(ctx, "SET SESSION max_recursive_iterations = ?", per+1); err != nil {
			b.Fatal(err)
		}
		if _, err := src.ExecContext(ctx, "INSERT INTO "+name+` (message_id, topic, group_id, seqid, from_user, client_msg_id, content, head, created_at, updated_at)
			WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < ?)
			SELECT ? + n, CONCAT('topic-', n % 100), n % 100, n, n % 97, CONCAT('c', n), JSON_OBJECT('text', REPEAT('x', 100), 'n', n), NULL, NOW(3), NOW(3) FROM s`,
			per, base); err != nil {
			b.Fatal(err)
		}
	}
	active := "im_group_messages_" + months[len(months)-1]
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for id := int64(10_000_000); ; id++ {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			if _, err := src.ExecContext(ctx, "INSERT INTO "+active+" (message_id, topic, group_id, seqid, from_user, created_at, updated_at) VALUES (?, 'w', 1, ?, 1, NOW(3), NOW(3))", id, id); err != nil {
				b.Error(err)
				return
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	// the active month's first marks before its copy, as under sends
	time.Sleep(50 * time.Millisecond)
	if _, err := src.ExecContext(ctx, "INSERT INTO im_tenant_move (id, role, peer_dsn, step, from_epoch) VALUES (1, 'source', '', ?, 0)", StepVerify); err != nil {
		b.Fatal(err)
	}
	var copied time.Time
	hook := func(step string) error {
		if step == HookCopied {
			copied = time.Now()
		}
		return nil
	}
	m := &Mover{src: src, dst: dst, o: Options{ChunkRows: 2000, CatchUpRounds: 2, StepHook: hook}, st: State{Step: StepVerify}}
	copying := time.Now()
	if err := m.copyAll(ctx); err != nil {
		b.Fatal(err)
	}
	proofs := time.Since(copied)
	// the catch-up step between, as the mover runs it: the active month's
	// rows written during the copy (its last chunk split) copied
	if _, err := m.catchUp(ctx, false); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if err := m.verifyAll(ctx); err != nil {
			b.Fatal(err)
		}
	}
	step := time.Since(start)
	b.ReportMetric(float64(total*b.N)/step.Seconds(), "rows/s")
	b.ReportMetric(float64(total*b.N)/(step+time.Duration(b.N)*proofs).Seconds(), "rows/s-all")
	b.ReportMetric(proofs.Seconds(), "s-proofs")
	b.ReportMetric(copied.Sub(copying).Seconds(), "s-copy")
}
