// Package bench holds the drivers of `imshard bench send|persist|query|inbox|stream|migrate|limits|rotation|archive|move|retention`:
// each measures a path of a role beside its raw limit — the same work
// without the role around it — on the same services in the same run. The
// roles' code reaches it only through what cmd passes in, so no role
// package carries benchmark code.
package bench

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"time"

	sq "github.com/Masterminds/squirrel"
)

// percentiles sorts d and returns its median and 99th percentile.
func percentiles(d []time.Duration) (p50, p99 time.Duration) {
	if len(d) == 0 {
		return 0, 0
	}
	slices.Sort(d)
	return d[len(d)/2], d[min(len(d)-1, len(d)*99/100)]
}

// DropFixtures drops the benchmark tenant's whole database.
func DropFixtures(ctx context.Context, db *sql.DB, drop func(quotedDB string) string) error {
	var name string
	if err := sq.Select("DATABASE()").RunWith(db).QueryRowContext(ctx).Scan(&name); err != nil {
		return err
	}
	if !validDatabase(name) {
		return fmt.Errorf("bench: refusing to drop database %q", name)
	}
	_, err := db.ExecContext(ctx, drop("`"+name+"`"))
	return err
}

func validDatabase(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for _, c := range name {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
