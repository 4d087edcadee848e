// Package placement keeps the tenants' placement records: which MySQL
// server (DSN) serves a tenant, from which epoch on. The records live in a
// small table on every placement server (mysql.placement_dsns, by default
// each server the tenants' DSNs name), not in Redis — losing Redis must not
// lose where the data is — and not on one server alone: a move writes its
// record to every placement server, and a reader takes, per tenant, the
// highest epoch any reachable server holds, so the loss of any one server
// (the move's source or target included) leaves the records readable.
// Records only ever go up in epoch; a tenant without one is placed by its
// configured DSN at epoch 0.
package placement

import (
	"context"
	"crypto/tls"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	sq "github.com/Masterminds/squirrel"
	"github.com/go-sql-driver/mysql"

	"github.com/imshard/imshard/config"
	imsql "github.com/imshard/imshard/sql"
)

// table is the fixed placement table (sql/placement.sql); movesTable
// notes the tenants a move was begun for (sql/placement_moves.sql).
const (
	table      = "im_tenant_placement"
	movesTable = "im_tenant_moves"
)

// serverTimeout bounds one read or write of one placement server: a server
// that does not answer is skipped by readers, and fails a writer.
const serverTimeout = 3 * time.Second

// Record is one tenant's placement.
type Record struct {
	Tenant string
	DSN    string
	Epoch  int64
}

// Store reads and writes the records on every placement server.
type Store struct {
	servers []*server
}

type server struct {
	name string // host:port/database, for errors and metrics (never the password)
	cfg  *mysql.Config

	mu    sync.Mutex
	db    *sql.DB
	ready bool // database and table exist
}

// DefaultServers is one placement DSN per distinct server (network,
// address, user) of the tenants' DSNs, naming config.PlacementDatabase.
func DefaultServers(tenantDSNs []string) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	for _, dsn := range tenantDSNs {
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			return nil, fmt.Errorf("placement: tenant dsn: %w", err)
		}
		key := cfg.Net + "\x00" + cfg.Addr + "\x00" + cfg.User
		if seen[key] {
			continue
		}
		seen[key] = true
		cfg.DBName = config.PlacementDatabase
		out = append(out, cfg.FormatDSN())
	}
	sort.Strings(out)
	return out, nil
}

// Open prepares the store over dsns (nothing is connected yet); tlsCfg,
// when set, encrypts and verifies every connection as mysql.tls does.
func Open(dsns []string, tlsCfg *tls.Config) (*Store, error) {
	if len(dsns) == 0 {
		return nil, errors.New("placement: no placement server (mysql.placement_dsns, or a tenant)")
	}
	s := &Store{}
	for _, dsn := range dsns {
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			return nil, fmt.Errorf("placement: mysql.placement_dsns: %w", err)
		}
		if cfg.DBName == "" || strings.ContainsAny(cfg.DBName, "`\x00") {
			return nil, fmt.Errorf("placement: mysql.placement_dsns: %s names no plain database", cfg.Addr)
		}
		cfg.ParseTime, cfg.Loc = true, time.UTC
		cfg.Timeout = serverTimeout
		if tlsCfg != nil {
			cfg.TLS = tlsCfg.Clone()
		}
		s.servers = append(s.servers, &server{name: cfg.Addr + "/" + cfg.DBName, cfg: cfg})
	}
	return s, nil
}

// Servers names the placement servers (host:port/database).
func (s *Store) Servers() []string {
	out := make([]string, len(s.servers))
	for i, sv := range s.servers {
		out[i] = sv.name
	}
	return out
}

// Close closes every server's handle.
func (s *Store) Close() error {
	var errs []error
	for _, sv := range s.servers {
		sv.mu.Lock()
		if sv.db != nil {
			errs = append(errs, sv.db.Close())
			sv.db, sv.ready = nil, false
		}
		sv.mu.Unlock()
	}
	return errors.Join(errs...)
}

// handle opens the server's pool, creating the placement database and
// table on first use.
func (sv *server) handle(ctx context.Context) (*sql.DB, error) {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if sv.db == nil {
		conn, err := mysql.NewConnector(sv.cfg)
		if err != nil {
			return nil, err
		}
		sv.db = sql.OpenDB(conn)
		sv.db.SetMaxOpenConns(4)
		sv.db.SetConnMaxIdleTime(time.Minute)
	}
	if sv.ready {
		return sv.db, nil
	}
	admin := sv.cfg.Clone()
	admin.DBName = ""
	conn, err := mysql.NewConnector(admin)
	if err != nil {
		return nil, err
	}
	adb := sql.OpenDB(conn)
	defer adb.Close()
	create := strings.Replace(imsql.CreateDatabase(), imsql.DatabasePlaceholder, "`"+sv.cfg.DBName+"`", 1)
	if _, err := adb.ExecContext(ctx, create); err != nil {
		return nil, fmt.Errorf("create database: %w", err)
	}
	if _, err := sv.db.ExecContext(ctx, imsql.PlacementTable()); err != nil {
		return nil, fmt.Errorf("create %s: %w", table, err)
	}
	if _, err := sv.db.ExecContext(ctx, imsql.PlacementMovesTable()); err != nil {
		return nil, fmt.Errorf("create %s: %w", movesTable, err)
	}
	sv.ready = true
	return sv.db, nil
}

// ServerError is one placement server that did not answer.
type ServerError struct {
	Server string
	Err    error
}

func (e *ServerError) Error() string { return "placement server " + e.Server + ": " + e.Err.Error() }
func (e *ServerError) Unwrap() error { return e.Err }

// Load reads every server at once and keeps, per tenant, the record of the
// highest epoch. failed are the servers that did not answer; err is set
// only when none did (then nothing is known, and the caller keeps what it
// had).
func (s *Store) Load(ctx context.Context) (recs map[string]Record, failed []*ServerError, err error) {
	type answer struct {
		recs []Record
		err  error
	}
	answers := make([]answer, len(s.servers))
	var wg sync.WaitGroup
	for i, sv := range s.servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rctx, cancel := context.WithTimeout(ctx, serverTimeout)
			defer cancel()
			answers[i].recs, answers[i].err = sv.load(rctx)
		}()
	}
	wg.Wait()
	recs = map[string]Record{}
	for i, a := range answers {
		if a.err != nil {
			failed = append(failed, &ServerError{Server: s.servers[i].name, Err: a.err})
			continue
		}
		for _, r := range a.recs {
			if cur, ok := recs[r.Tenant]; !ok || r.Epoch > cur.Epoch {
				recs[r.Tenant] = r
			}
		}
	}
	if len(failed) == len(s.servers) {
		errs := make([]error, len(failed))
		for i, f := range failed {
			errs[i] = f
		}
		return nil, failed, fmt.Errorf("placement: no placement server answered: %w", errors.Join(errs...))
	}
	return recs, failed, nil
}

func (sv *server) load(ctx context.Context) ([]Record, error) {
	db, err := sv.handle(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := sq.Select("tenant", "dsn", "epoch").From(table).RunWith(db).QueryContext(ctx)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Record
	for rows.Next() {
		var r Record
		if err := rows.Scan(&r.Tenant, &r.DSN, &r.Epoch); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// NoteMove notes on every placement server that a move of tenant began,
// so Moving finds it without opening the tenant's database; like Write it
// fails unless every server took it.
func (s *Store) NoteMove(ctx context.Context, tenant string) error {
	return s.everyServer(ctx, func(ctx context.Context, db *sql.DB) error {
		_, err := sq.Insert(movesTable).Columns("tenant").Values(tenant).
			Suffix("ON DUPLICATE KEY UPDATE noted_at = CURRENT_TIMESTAMP(3)").RunWith(db).ExecContext(ctx)
		return err
	})
}

// Moving is every tenant a move was begun for, as the placement servers
// that answer note them; err is set only when none answered.
func (s *Store) Moving(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	var errs []error
	for _, sv := range s.servers {
		rctx, cancel := context.WithTimeout(ctx, serverTimeout)
		err := sv.moving(rctx, seen)
		cancel()
		if err != nil {
			errs = append(errs, &ServerError{Server: sv.name, Err: err})
		}
	}
	if len(errs) == len(s.servers) {
		return nil, fmt.Errorf("placement: no placement server answered: %w", errors.Join(errs...))
	}
	out := make([]string, 0, len(seen))
	for t := range seen {
		out = append(out, t)
	}
	sort.Strings(out)
	return out, nil
}

func (sv *server) moving(ctx context.Context, into map[string]bool) error {
	db, err := sv.handle(ctx)
	if err != nil {
		return err
	}
	rows, err := sq.Select("tenant").From(movesTable).RunWith(db).QueryContext(ctx)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return err
		}
		into[t] = true
	}
	return rows.Err()
}

// everyServer runs fn on every placement server and fails unless each one
// succeeded.
func (s *Store) everyServer(ctx context.Context, fn func(ctx context.Context, db *sql.DB) error) error {
	var errs []error
	for _, sv := range s.servers {
		wctx, cancel := context.WithTimeout(ctx, serverTimeout)
		db, err := sv.handle(wctx)
		if err == nil {
			err = fn(wctx, db)
		}
		cancel()
		if err != nil {
			errs = append(errs, &ServerError{Server: sv.name, Err: err})
		}
	}
	return errors.Join(errs...)
}

// Write puts rec on every placement server, where it replaces a record of
// a lower epoch and leaves a higher (or equal) one alone, so running it
// again — after a crash between two servers — is harmless. It fails unless
// every server took it: a switch must not count on a record one server
// lacks.
func (s *Store) Write(ctx context.Context, rec Record) error {
	return s.everyServer(ctx, func(ctx context.Context, db *sql.DB) error {
		// dsn is assigned before epoch: its IF still sees the stored epoch
		_, err := sq.Insert(table).Columns("tenant", "dsn", "epoch").Values(rec.Tenant, rec.DSN, rec.Epoch).
			Suffix("ON DUPLICATE KEY UPDATE dsn = IF(VALUES(epoch) > epoch, VALUES(dsn), dsn), epoch = GREATEST(epoch, VALUES(epoch))").
			RunWith(db).ExecContext(ctx)
		return err
	})
}

// Delete removes tenant's record and move note from every server it can
// reach (a test or an operator removing a tenant for good); a tenant with
// no record is placed by its configuration again.
func (s *Store) Delete(ctx context.Context, tenant string) error {
	return s.everyServer(ctx, func(ctx context.Context, db *sql.DB) error {
		for _, t := range []string{table, movesTable} {
			if _, err := sq.Delete(t).Where(sq.Eq{"tenant": tenant}).RunWith(db).ExecContext(ctx); err != nil {
				return err
			}
		}
		return nil
	})
}
