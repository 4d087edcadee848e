package readpath

import (
	"context"
	"testing"

	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/testenv"
)

// TestStatementsPerShapeNotPerLimit: pages of many different sizes reuse
// one prepared statement per statement shape.
func TestStatementsPerShapeNotPerLimit(t *testing.T) {
	ctx := context.Background()
	_, db := testenv.MigratedTenantDB(t)
	table, err := routing.TableFor(routing.MustMonth("202601"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, table.CreateDDL()); err != nil {
		t.Fatal(err)
	}
	s := newStore()
	defer s.close()
	for limit := 1; limit <= 60; limit++ {
		for _, hidNothing := range []bool{false, true} {
			q := ListQuery{Topic: "t", User: 1, Order: Desc, Bound: 100, Limit: limit, HidNothing: hidNothing}
			if _, err := s.Messages(ctx, db, q.build(table.Quoted())); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.HiddenRanges(ctx, db, "t", 1, 0, uint64(limit)); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.stmts.Len(); n != 3 {
		t.Fatalf("%d prepared statements for 3 shapes read with 60 page sizes", n)
	}
}
