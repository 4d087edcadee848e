package move

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/imshard/imshard/test/testenv"
)

// TestMarkTriggersCreatedUnderWrites: the mark triggers are created while
// writers insert, update and delete rows of the table, round after round
// (created, then dropped again), and no write fails. Without the
// LOCK TABLES of createLocked MariaDB fails a write that opened the table
// while its triggers were being created ("Table im_tenant_move_marks
// doesn't exist"), about once a round; with it the writes wait the few
// milliseconds of the creation. A change committed once a table's
// triggers exist always has its mark.
func TestMarkTriggersCreatedUnderWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, db := testenv.MigratedTenantDB(t)
	db.SetMaxOpenConns(16)
	if _, err := db.ExecContext(ctx, "CREATE TABLE im_move_written (id BIGINT PRIMARY KEY, v INT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	all, err := listTables(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	var tables []table
	for _, tb := range all {
		if tb.name == "im_move_written" {
			tables = append(tables, tb)
		}
	}
	if len(tables) != 1 {
		t.Fatalf("tables %v, want im_move_written", all)
	}
	m := &Mover{src: db}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var writes, failed atomic.Int64
	var lastErr atomic.Value
	const writers = 4
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := int64(0); ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := int64(w)*1_000_000 + i%50
				var err error
				switch i % 3 {
				case 0:
					_, err = db.ExecContext(ctx, "INSERT INTO im_move_written (id, v) VALUES (?, 1) ON DUPLICATE KEY UPDATE v = v + 1", id)
				case 1:
					_, err = db.ExecContext(ctx, "UPDATE im_move_written SET v = v + 1 WHERE id = ?", id)
				default:
					_, err = db.ExecContext(ctx, "DELETE FROM im_move_written WHERE id = ?", id-1)
				}
				writes.Add(1)
				if err != nil {
					failed.Add(1)
					lastErr.Store(err)
				}
			}
		}(w)
	}
	// the writers are under way before the first round
	for writes.Load() < writers*10 {
		time.Sleep(time.Millisecond)
	}
	const rounds = 20
	deadline := time.Now().Add(6 * time.Second)
	done := 0
	for ; done < rounds && time.Now().Before(deadline); done++ {
		if err := m.markTriggers(ctx, tables); err != nil {
			t.Fatalf("round %d: %v", done, err)
		}
		if err := dropMarks(ctx, db); err != nil {
			t.Fatalf("round %d: %v", done, err)
		}
	}
	close(stop)
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d writes failed over %d rounds of trigger creation; last: %v", n, writes.Load(), done, lastErr.Load())
	}
	if done < 5 {
		t.Fatalf("only %d rounds in the time given (%d writes)", done, writes.Load())
	}
	t.Logf("%d rounds, %d writes, none failed", done, writes.Load())
}
