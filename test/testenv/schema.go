package testenv

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	imsql "github.com/imshard/imshard/sql"
)

// MigratedTenantDB makes a fresh tenant (see NewTenant), creates its
// database with every embedded schema step applied, and returns the tenant
// and a handle on the database, closed on cleanup. Its connections carry
// the placement epoch 0 (as a tenant pool at the configured placement
// does), so routing's fenced writes pass on it.
func MigratedTenantDB(t testing.TB) (string, *sql.DB) {
	t.Helper()
	ctx := context.Background()
	tenant := NewTenant(t)
	if _, err := MySQL(t).ExecContext(ctx, "CREATE DATABASE `"+TenantDBPrefix+tenant+"`"); err != nil {
		t.Fatalf("testenv: create database of %s: %v", tenant, err)
	}
	db := OpenDB(t, strings.ReplaceAll(DSNTemplate(), "{tenant}", tenant)+"&@imshard_epoch=0")
	steps, err := imsql.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range steps {
		for _, q := range st.Statements {
			if _, err := db.ExecContext(ctx, q); err != nil {
				t.Fatalf("testenv: schema step %d of %s: %v", st.Version, tenant, err)
			}
		}
	}
	return tenant, db
}

// SchemaLock holds the named lock under which a process applies the schema
// of the tenant's database, so that a process opening the tenant's pool
// waits (for as long as the test wants) in the middle of its work.
type SchemaLock struct {
	t      testing.TB
	conn   *sql.Conn
	name   string
	tenant string
}

// HoldSchemaLock takes the tenant's schema lock on a connection of its own;
// it is released on cleanup at the latest.
func HoldSchemaLock(t testing.TB, tenant string) *SchemaLock {
	t.Helper()
	ctx := context.Background()
	conn, err := MySQL(t).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l := &SchemaLock{t: t, conn: conn, name: "imshard_schema:" + TenantDBPrefix + tenant, tenant: tenant}
	var got int
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 10)", l.name).Scan(&got); err != nil || got != 1 {
		t.Fatalf("testenv: GET_LOCK(%s) = %d, %v", l.name, got, err)
	}
	t.Cleanup(func() { l.Release(); _ = conn.Close() })
	return l
}

// Waiters counts the connections of the tenant's database waiting for it.
func (l *SchemaLock) Waiters() int {
	l.t.Helper()
	var n int
	if err := l.conn.QueryRowContext(context.Background(),
		"SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = ? AND STATE = 'User lock'",
		TenantDBPrefix+l.tenant).Scan(&n); err != nil {
		l.t.Fatal(err)
	}
	return n
}

// Release lets the waiters go on.
func (l *SchemaLock) Release() {
	_, _ = l.conn.ExecContext(context.Background(), "DO RELEASE_LOCK(?)", l.name)
}
