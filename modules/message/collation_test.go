package message

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/testenv"
)

// TestClientMsgIDPadSpace shows on the real server why CheckClientMsgID
// refuses white space at the ends: the month table's client_msg_id
// collation pads with spaces, so "pad-1" and "pad-1 " are one key to the
// unique index, while Redis and Go tell them apart; and every id the check
// accepts that differs from another anywhere else is a different key.
func TestClientMsgIDPadSpace(t *testing.T) {
	tenant := testenv.NewTenant(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := testenv.MySQL(t).ExecContext(ctx, "CREATE DATABASE `"+testenv.TenantDBPrefix+tenant+"`"); err != nil {
		t.Fatal(err)
	}
	db := testenv.OpenDB(t, strings.Replace(testenv.DSNTemplate(), "{tenant}", tenant, 1))
	table, err := routing.TableFor(routing.MonthOf(time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, table.CreateDDL()); err != nil {
		t.Fatal(err)
	}
	var collation string
	if err := db.QueryRowContext(ctx, "SELECT COLLATION_NAME FROM information_schema.COLUMNS"+
		" WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = 'client_msg_id'", table.Name()).
		Scan(&collation); err != nil {
		t.Fatal(err)
	}
	if collation != "utf8mb4_bin" {
		t.Fatalf("client_msg_id collation %s, want utf8mb4_bin (PAD SPACE in MariaDB 10.11 and MySQL 8)", collation)
	}
	seq := int64(0)
	insert := func(id string) error {
		seq++
		now := time.Now().UTC()
		_, err := db.ExecContext(ctx, "INSERT INTO "+table.Quoted()+
			" (message_id, topic, group_id, seqid, from_user, client_msg_id, created_at, updated_at)"+
			" VALUES (?, 't', 1, ?, 1, ?, ?, ?)", seq, seq, id, now, now)
		return err
	}
	duplicate := func(err error) bool {
		var me *mysql.MySQLError
		return errors.As(err, &me) && me.Number == 1062
	}
	if err := insert("pad-1"); err != nil {
		t.Fatal(err)
	}
	if err := insert("pad-1 "); !duplicate(err) {
		t.Fatalf("\"pad-1 \" did not collide with \"pad-1\" in %s: %v", collation, err)
	}
	if CheckClientMsgID("pad-1 ") == nil || CheckClientMsgID(" pad-1") == nil {
		t.Fatal("an id with white space at an end is accepted")
	}
	// what the check accepts compares byte for byte, as in Redis
	for _, id := range []string{"pad-1\t1", "pad 1", "PAD-1", "pad-1\u00e9", "pad-1\u0000x", "pad-1."} {
		if err := CheckClientMsgID(id); err != nil {
			t.Fatalf("%q: %v", id, err)
		}
		if err := insert(id); err != nil {
			t.Errorf("%q collides with an earlier id: %v", id, err)
		}
	}
}
