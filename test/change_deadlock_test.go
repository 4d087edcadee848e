package test

import (
	"context"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/test/harness"
)

// TestChangeRetriesALostDeadlock: a change that loses a deadlock (the
// server rolls its transaction back, error 1213 — as persist's mirror
// write did while a move created its mark triggers) runs again and
// answers 200, not 503. A transaction of the test's own holds the
// message's row, waits until the recall waits for it, then asks for the
// fence row the recall holds shared: a cycle, and the server rolls back
// the lighter transaction — the recall's (the test's has inserted rows
// first). The recall's second run waits for the test's transaction,
// which then ends, and completes.
func TestChangeRetriesALostDeadlock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := harness.Start(t, harness.Options{})
	rpGroup(t, env, "chdead")
	tok := env.Token(rpMember, "")
	seq, _ := rpPost(t, env, tok, "chdead", "dl-1", "as sent")
	chWaitSettled(t, env, "chdead")
	db, err := env.App.Pools().DB(ctx, env.Tenant)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE im_test_weight (id INT PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	// the month table holding the message
	var table string
	for _, name := range mvMonthTables(t, db) {
		var n int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+name+" WHERE topic = ? AND seqid = ?", "chdead", seq).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			table = name
		}
	}
	if table == "" {
		t.Fatalf("seq %d is in no month table", seq)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	// weight: the server rolls back the transaction that changed the fewest rows
	for i := 0; i < 200; i++ {
		if _, err := tx.ExecContext(ctx, "INSERT INTO im_test_weight (id) VALUES (?)", i); err != nil {
			t.Fatal(err)
		}
	}
	var one, trx int64
	if err := tx.QueryRowContext(ctx, "SELECT 1 FROM "+table+" WHERE topic = ? AND seqid = ? FOR UPDATE", "chdead", seq).Scan(&one); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRowContext(ctx, "SELECT trx_id FROM information_schema.innodb_trx WHERE trx_mysql_thread_id = CONNECTION_ID()").Scan(&trx); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		code int
		r    chResult
	}
	recalled := make(chan answer, 1)
	go func() {
		code, out := env.Do("POST", chSeqPath("chdead", seq)+"/recall", tok, nil)
		recalled <- answer{code, chDecode(t, out)}
	}()
	// the recall holds the fence row shared and waits for the message's row:
	// its locking read is under way (MariaDB 10.11 takes the row lock of
	// that read while it plans it, in its "Statistics" state, and lists no
	// wait in information_schema.innodb_lock_waits then)
	sendWaitFor(t, 20*time.Second, "the recall waits for the test's row lock", func() bool {
		var n int
		err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.processlist WHERE db = DATABASE() AND info LIKE '%FOR UPDATE%' AND id <> CONNECTION_ID()").Scan(&n)
		return err == nil && n > 0
	})
	if _, err := tx.ExecContext(ctx, "UPDATE im_tenant_fence SET epoch = epoch WHERE id = 1"); err != nil {
		t.Fatalf("the test's transaction lost the deadlock (the recall's was to): %v", err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	a := <-recalled
	if a.code != 200 || a.r.Message.Status != message.StatusRecalled {
		t.Fatalf("recall after a lost deadlock: %d %+v, want 200 and the message recalled", a.code, a.r.Error)
	}
}
