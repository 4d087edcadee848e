package move

import (
	"context"
	"errors"
	"fmt"
)

// reverseReady refuses a reverse whose target, the copy the reversed move
// left on its source, cannot take the tenant back: not reachable, not that
// move's source (dropped and created again, another database), or at
// another schema version than the tenant's database now.
func (m *Mover) reverseReady(ctx context.Context) error {
	if err := m.dst.PingContext(ctx); err != nil {
		return fmt.Errorf("%w: the source copy %s is not reachable: %w", ErrReverseRefused, serverOf(m.dstDSN), err)
	}
	st, err := readState(ctx, m.dst)
	if errors.Is(err, ErrNoMove) {
		return fmt.Errorf("%w: %s holds no move's source copy", ErrReverseRefused, serverOf(m.dstDSN))
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrReverseRefused, err)
	}
	if st.Role != "source" || (st.Step != StepDone && st.Step != StepSwitch) || serverOf(st.Peer) != serverOf(m.srcDSN) {
		return fmt.Errorf("%w: %s is not the source copy of the move to %s (its move: %s %s to %s)",
			ErrReverseRefused, serverOf(m.dstDSN), serverOf(m.srcDSN), st.Role, st.Step, st.PeerServer)
	}
	if err := m.sameSchema(ctx); err != nil {
		return fmt.Errorf("%w: %w", ErrReverseRefused, err)
	}
	return nil
}

// dropGone drops from a reverse's target the tables the tenant no longer
// has (a month retention dropped since the switch), so that the copy ends
// as the tenant is.
func (m *Mover) dropGone(ctx context.Context) error {
	have, err := listTables(ctx, m.src)
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, t := range have {
		keep[t.name] = true
	}
	old, err := listTables(ctx, m.dst)
	if err != nil {
		return err
	}
	for _, t := range old {
		if keep[t.name] {
			continue
		}
		if _, err := m.dst.ExecContext(ctx, "DROP TABLE IF EXISTS "+quote(t.name)); err != nil {
			return fmt.Errorf("move: drop %s, gone since the switch, from the source copy: %w", t.name, err)
		}
	}
	return nil
}
