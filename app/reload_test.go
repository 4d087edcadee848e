package app

import (
	"slices"
	"testing"

	"github.com/imshard/imshard/config"
)

// TestAddedTenants: a reload provisions the tenants it added and those it
// moved to another database — never one only its secret changed.
func TestAddedTenants(t *testing.T) {
	live := &config.Config{MySQL: config.MySQL{DSNTemplate: "root@tcp(db:3306)/im_{tenant}"}, Tenants: []config.Tenant{
		{ID: "kept", JWTSecret: "a"}, {ID: "rotated", JWTSecret: "a"}, {ID: "moved", JWTSecret: "a"}, {ID: "removed", JWTSecret: "a"},
	}}
	next := *live
	next.Tenants = []config.Tenant{
		{ID: "kept", JWTSecret: "a"}, {ID: "rotated", JWTSecret: "b"},
		{ID: "moved", JWTSecret: "a", DSN: "root@tcp(db2:3306)/im_moved"}, {ID: "new", JWTSecret: "a"},
	}
	if got, want := addedTenants(live, &next), []string{"moved", "new"}; !slices.Equal(got, want) {
		t.Fatalf("addedTenants = %v, want %v", got, want)
	}
	if got := addedTenants(live, live); got != nil {
		t.Fatalf("an unchanged tenant list provisions %v", got)
	}
}
