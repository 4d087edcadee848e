package routing

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	sq "github.com/Masterminds/squirrel"
)

// ErrPlacementMoved is a write refused by the tenant's placement fence: the
// connection belongs to a placement older (or newer) than the one the
// database serves. Nothing was written; the writer retries once this
// process follows the tenant's current placement (mysql.placement_poll).
var ErrPlacementMoved = errors.New("the tenant's placement changed: write refused by the fence")

// fenceTable is the fixed one-row table of a tenant database's placement
// epoch (sql/migrations/0016_tenant_fence.sql).
const fenceTable = "im_tenant_fence"

// CheckPlacement is the first statement of every write transaction of a
// tenant (a persist batch, a change, a deletion range): it reads the
// database's fence epoch with a shared lock and compares it with the
// epoch the connection was opened for (the session variable
// @imshard_epoch, tenantdb.EpochVar). The shared lock lasts until the
// transaction ends, so a move's switch — an UPDATE of the row, which needs
// the exclusive lock — waits for every writer already past this check, and
// every writer after the switch sees the new epoch and writes nothing. The
// move takes its final catch-up position only after the switch commits,
// so whatever a writer committed before it is copied, and nothing is
// written after it.
func CheckPlacement(ctx context.Context, tx *sql.Tx) error {
	var fence int64
	var mine sql.NullInt64
	err := sq.Select("epoch", "@imshard_epoch").From(fenceTable).Where(sq.Eq{"id": 1}).
		Suffix("LOCK IN SHARE MODE").RunWith(tx).QueryRowContext(ctx).Scan(&fence, &mine)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("%w: the database has no fence row (not this build's schema)", ErrPlacementMoved)
	case err != nil:
		return fmt.Errorf("placement fence: %w", err)
	case !mine.Valid:
		return fmt.Errorf("%w: the connection carries no placement epoch", ErrPlacementMoved)
	case mine.Int64 != fence:
		return fmt.Errorf("%w: this connection's epoch is %d, the database serves epoch %d", ErrPlacementMoved, mine.Int64, fence)
	}
	return nil
}
