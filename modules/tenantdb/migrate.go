package tenantdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	sq "github.com/Masterminds/squirrel"
	"github.com/go-sql-driver/mysql"

	imsql "github.com/imshard/imshard/sql"
)

// schemaLockWait bounds how long a process waits for another one applying
// the schema of the same database (seconds, as GET_LOCK takes it).
const schemaLockWait = 60

const migrationsTable = "im_schema_migrations"

// Migrate applies every embedded schema step the database lacks, in order,
// recording each version. Steps are idempotent (IF NOT EXISTS), and a
// server-side named lock keeps two processes from applying them at once.
func Migrate(ctx context.Context, db *sql.DB) error {
	steps, err := imsql.Migrations()
	if err != nil {
		return err
	}
	c, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	defer c.Close()
	conn := connRunner{c}

	var dbName sql.NullString
	if err := sq.Select("DATABASE()").RunWith(conn).QueryRowContext(ctx).Scan(&dbName); err != nil {
		return fmt.Errorf("schema: current database: %w", err)
	}
	lock := "imshard_schema:" + dbName.String
	var got sql.NullInt64
	if err := sq.Select().Column("GET_LOCK(?, ?)", lock, schemaLockWait).RunWith(conn).QueryRowContext(ctx).Scan(&got); err != nil {
		return fmt.Errorf("schema: lock: %w", err)
	}
	if !got.Valid || got.Int64 != 1 {
		return errors.New("schema: another process holds the schema lock")
	}
	defer func() {
		_, _ = sq.Select().Column("RELEASE_LOCK(?)", lock).RunWith(conn).ExecContext(context.WithoutCancel(ctx))
	}()

	if _, err := conn.ExecContext(ctx, imsql.MigrationsTable()); err != nil {
		return fmt.Errorf("schema: %s: %w", migrationsTable, err)
	}
	applied := map[int]bool{}
	rows, err := sq.Select("version").From(migrationsTable).RunWith(conn).QueryContext(ctx)
	if err != nil {
		return fmt.Errorf("schema: read versions: %w", err)
	}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			rows.Close()
			return err
		}
		applied[v] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, step := range steps {
		if applied[step.Version] {
			continue
		}
		for _, stmt := range step.Statements {
			if _, err := conn.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("schema: step %04d_%s: %w", step.Version, step.Name, err)
			}
		}
		if _, err := sq.Insert(migrationsTable).Columns("version", "name").Values(step.Version, step.Name).
			Options("IGNORE").RunWith(conn).ExecContext(ctx); err != nil {
			return fmt.Errorf("schema: record %04d: %w", step.Version, err)
		}
	}
	return nil
}

// checkSchema reports, as ErrNotProvisioned, a database that does not
// exist or lacks schema steps this build applies — without changing it.
func checkSchema(ctx context.Context, db *sql.DB, name string) error {
	steps, err := imsql.Migrations()
	if err != nil {
		return err
	}
	want := steps[len(steps)-1].Version
	have, err := schemaVersion(ctx, db)
	var me *mysql.MySQLError
	switch {
	case errors.As(err, &me) && me.Number == 1049: // ER_BAD_DB_ERROR
		return fmt.Errorf("database %s does not exist: %w", name, ErrNotProvisioned)
	case errors.As(err, &me) && me.Number == 1146: // ER_NO_SUCH_TABLE: no step applied
		return fmt.Errorf("database %s has no imshard schema: %w", name, ErrNotProvisioned)
	case err != nil:
		return fmt.Errorf("schema version: %w", err)
	case have < want:
		return fmt.Errorf("database %s is at schema version %d, this build's is %d: %w", name, have, want, ErrNotProvisioned)
	}
	return nil
}

// schemaVersion is the newest schema version recorded in db (0 if none).
func schemaVersion(ctx context.Context, db sq.BaseRunner) (int, error) {
	var v sql.NullInt64
	if err := sq.Select("MAX(version)").From(migrationsTable).RunWith(db).QueryRowContext(ctx).Scan(&v); err != nil {
		return 0, err
	}
	return int(v.Int64), nil
}

// connRunner lets squirrel run on one pinned connection: GET_LOCK belongs to
// a session, so the lock, the steps and the release must share it.
type connRunner struct{ *sql.Conn }

func (c connRunner) Exec(query string, args ...any) (sql.Result, error) {
	return c.ExecContext(context.Background(), query, args...)
}

func (c connRunner) Query(query string, args ...any) (*sql.Rows, error) {
	return c.QueryContext(context.Background(), query, args...)
}

func (c connRunner) QueryRow(query string, args ...any) *sql.Row {
	return c.QueryRowContext(context.Background(), query, args...)
}
