// Package sql holds every DDL statement imshard runs, embedded so the binary
// carries its schema. Go code never builds DDL in strings; it reads it here.
package sql

import (
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
)

//go:embed *.sql migrations/*.sql
var files embed.FS

// TablePlaceholder marks where the month table's quoted name goes in
// MonthTable. Only modules/routing substitutes it, with a validated name.
const TablePlaceholder = "{{table}}"

// DatabasePlaceholder marks where a quoted database name goes in
// CreateDatabase; the caller quotes a name it has validated.
const DatabasePlaceholder = "{{database}}"

// MonthTable is the month-table template (utf8mb4_bin on topic and
// client_msg_id, so MySQL compares them byte-exact as Redis does).
func MonthTable() string { return mustRead("month_table.sql") }

// CreateDatabase creates a tenant database if it is missing.
func CreateDatabase() string { return mustRead("create_database.sql") }

// DropDatabase drops a database (benchmark fixtures only: `imshard bench`
// builds its own tenant database and removes it afterwards).
func DropDatabase() string { return mustRead("drop_database.sql") }

// DropTable drops a month table (TablePlaceholder): only an empty one a
// migration plan created, when the plan is aborted.
func DropTable() string { return mustRead("drop_table.sql") }

// SenderIndex adds a month table's (from_user, topic, seqid) index, which
// a user erase walks, to a table made before the template had it (its name
// is TablePlaceholder): online, so sends and persist go on meanwhile.
func SenderIndex() string { return mustRead("sender_index.sql") }

// PlacementTable holds the tenants' placement records, in the placement
// database of each placement server (not in a tenant database).
func PlacementTable() string { return mustRead("placement.sql") }

// PlacementMovesTable notes the tenants a move was begun for, beside the
// placement records.
func PlacementMovesTable() string { return mustRead("placement_moves.sql") }

// MigrationsTable records which schema versions a tenant database has.
func MigrationsTable() string { return mustRead("schema_migrations.sql") }

func mustRead(name string) string {
	b, err := files.ReadFile(name)
	if err != nil {
		panic(err) // embedded at build time; absence is a build defect
	}
	return strings.TrimSpace(string(b))
}

// Migration is one numbered schema step applied once per tenant database.
type Migration struct {
	Version    int
	Name       string
	Statements []string
}

// Migrations returns the schema steps in version order. File names are
// NNNN_name.sql; statements are separated by a line holding only ";".
func Migrations() ([]Migration, error) {
	entries, err := fs.ReadDir(files, "migrations")
	if err != nil {
		return nil, err
	}
	var out []Migration
	for _, e := range entries {
		name := e.Name()
		base := strings.TrimSuffix(name, ".sql")
		num, label, ok := strings.Cut(base, "_")
		if !ok {
			return nil, fmt.Errorf("sql: migration %q: want NNNN_name.sql", name)
		}
		v, err := strconv.Atoi(num)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("sql: migration %q: bad version", name)
		}
		body, err := files.ReadFile("migrations/" + name)
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Version: v, Name: label, Statements: split(string(body))})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("sql: duplicate migration version %d", out[i].Version)
		}
	}
	return out, nil
}

func split(body string) []string {
	var stmts []string
	for _, part := range strings.Split(body, "\n;\n") {
		s := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(part), ";"))
		if s != "" && !onlyComments(s) {
			stmts = append(stmts, s)
		}
	}
	return stmts
}

func onlyComments(s string) bool {
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "--") {
			return false
		}
	}
	return true
}
