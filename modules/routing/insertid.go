package routing

import (
	"context"
	"database/sql"
)

// LastInsertID is LAST_INSERT_ID() of tx's connection after its last
// statement: the first AUTO_INCREMENT value that statement generated, or
// the value it gave LAST_INSERT_ID(expr). Read it with this, never with
// sql.Result.LastInsertId: a statement whose trigger inserted a row into
// a table with an AUTO_INCREMENT key (a tenant move's mark triggers, from
// its copy to its end) reports 0 to the client in place of the value
// LAST_INSERT_ID(expr) set, while the session's LAST_INSERT_ID() keeps it
// (a trigger's own change of it is undone when the trigger ends).
func LastInsertID(ctx context.Context, tx *sql.Tx) (int64, error) {
	var id int64
	err := tx.QueryRowContext(ctx, "SELECT LAST_INSERT_ID()").Scan(&id)
	return id, err
}
