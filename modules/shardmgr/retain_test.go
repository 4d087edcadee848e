package shardmgr

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/rs/zerolog"
)

type appliedTo []string

func (a *appliedTo) Apply(_ context.Context, tenant string) error {
	*a = append(*a, tenant)
	return nil
}

// A tenant in a move — or whose move state cannot be read — gets neither
// retention nor the archive from the patrol: both remove or replace month
// tables the move copies and catches up.
func TestRetainSkipsTenantsInAMove(t *testing.T) {
	var kept, archived appliedTo
	mg := &Manager{p: Params{Log: zerolog.Nop(), Retention: &kept, Archive: &archived,
		Moving: func(_ context.Context, tenant string) (bool, error) {
			switch tenant {
			case "moving":
				return true, nil
			case "unreadable":
				return false, errors.New("no connection")
			}
			return false, nil
		}}}
	mg.retain(context.Background(), []string{"a", "moving", "unreadable", "b"})
	if want := []string{"a", "b"}; !slices.Equal(kept, want) || !slices.Equal(archived, want) {
		t.Fatalf("retention ran for %v and the archive for %v, want %v for both", kept, archived, want)
	}
}
