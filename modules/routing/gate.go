package routing

import (
	"context"
	"fmt"
	"strconv"

	sq "github.com/Masterminds/squirrel"
	"github.com/redis/rueidis"
)

// The migration write gate (docs/migration.md, "The write gate"). Which
// writes a tenant takes is decided by its migration's state in MySQL; the
// gate is that decision copied into Redis, where every allocation reads it
// in its own call (lua/fenced.lua). The migrate commands move the state in
// MySQL, then converge the gate before they return, so from then on no
// process allocates a seq the state refuses — whatever its own copy of the
// state (Migrations) says, and without waiting for it to refresh. The gate
// is rebuilt from MySQL when Redis lost it, never assumed open.

// Replies of the library's alloc and send functions from the gate; the
// allocation's slow paths (Allocator.Resolve) handle them.
const (
	allocGateShut    = 10 // {10, state}: the migration refuses sends
	allocGateUnknown = 11 // {11}: the gate is missing or stale
)

// maxGateWrites bounds one convergence: each lost write means the gate
// was written meanwhile, by a command that moved the state or another
// rebuild.
const maxGateWrites = 5

// gateValue is the gate of state s without its stamp and count
// ("SC:state", see lua/fenced.lua, gate_read).
func gateValue(s MigrationState) string {
	flag := func(b bool) string {
		if b {
			return "1"
		}
		return "0"
	}
	return flag(s.RefusesSends()) + flag(s.RefusesChanges()) + ":" + string(s)
}

// ConvergeMigrationGate makes the tenant's gate in Redis say what its
// migration's state in MySQL says, and returns that state. It reads the
// gate before MySQL and replaces only the gate it read: a state committed
// before the MySQL read is in what it writes, and a state committed after
// it is converged by the command that committed it, whose read of MySQL
// comes after its commit — so a stale read never overwrites a newer gate.
func ConvergeMigrationGate(ctx context.Context, rdb rueidis.Client, lib *FencedLib, space KeySpace, db sq.BaseRunner, tenant string) (MigrationState, error) {
	keys, err := space.Tenant(tenant)
	if err != nil {
		return MigrationNone, err
	}
	k := []string{keys.MigrationGate()}
	for range maxGateWrites {
		n, have, err := readGate(ctx, rdb, lib, k)
		if err != nil {
			return MigrationNone, fmt.Errorf("migration gate of %s: %w", tenant, err)
		}
		m, err := LoadMigration(ctx, db)
		if err != nil {
			return MigrationNone, err
		}
		want := gateValue(m.State)
		if n > 0 && have == want {
			return m.State, nil
		}
		set, err := lib.GateSet(ctx, rdb, k, []string{strconv.FormatInt(n, 10), want}).AsInt64()
		if err != nil {
			return MigrationNone, fmt.Errorf("migration gate of %s: set: %w", tenant, err)
		}
		if set == 1 {
			return m.State, nil
		}
	}
	return MigrationNone, fmt.Errorf("migration gate of %s: rewritten under each of %d attempts", tenant, maxGateWrites)
}

// readGate is the gate as this Redis incarnation holds it: its write count
// (0: missing or stale) and "SC:state".
func readGate(ctx context.Context, rdb rueidis.Client, lib *FencedLib, k []string) (int64, string, error) {
	reply, err := lib.GateGet(ctx, rdb, k).ToArray()
	if err != nil {
		return 0, "", err
	}
	if len(reply) != 3 {
		return 0, "", fmt.Errorf("get: reply of %d elements", len(reply))
	}
	n, err := reply[0].AsInt64()
	if err != nil {
		return 0, "", fmt.Errorf("get: %w", err)
	}
	flags, _ := reply[1].ToString()
	state, _ := reply[2].ToString()
	return n, flags + ":" + state, nil
}

// gateAllows reports whether a gate read by readGate lets a change through
// without asking MySQL: present and not refusing changes.
func gateAllows(n int64, have string) bool {
	return n > 0 && len(have) >= 2 && have[1] == '0'
}
