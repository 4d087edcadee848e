package acl

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/tenantdb"
	"github.com/imshard/imshard/test/testenv"
)

func TestMembershipLifecycle(t *testing.T) {
	tenant := testenv.NewTenant(t)
	pools := tenantdb.New(tenantdb.Params{MaxOpenConns: 4, Log: zerolog.Nop()},
		[]tenantdb.Tenant{{ID: tenant, DSN: strings.ReplaceAll(testenv.DSNTemplate(), "{tenant}", tenant)}})
	t.Cleanup(func() { _ = pools.Close() })
	space, err := routing.NewKeySpace("")
	if err != nil {
		t.Fatal(err)
	}
	c := New(Params{Redis: testenv.Redis(t), KeySpace: space, Scripts: routing.NewScripts(), DBs: pools, TTL: time.Minute, Log: zerolog.Nop()})
	ctx := context.Background()

	if _, err := c.Lookup(ctx, tenant, "g", 1); !errors.Is(err, ErrNoGroup) {
		t.Fatalf("no group: %v", err)
	}
	if err := c.PutGroup(ctx, tenant, "g", 77, "team", GroupActive); err != nil {
		t.Fatal(err)
	}
	m, err := c.Lookup(ctx, tenant, "g", 1)
	if err != nil || m.Member || m.GroupID != 77 {
		t.Fatalf("non-member: %+v %v", m, err)
	}
	if err := c.PutMember(ctx, tenant, "g", 1, RoleMember, nil); err != nil {
		t.Fatal(err)
	}
	m, err = c.Lookup(ctx, tenant, "g", 1) // the cached "not a member" was invalidated
	if err != nil || !m.Member || m.Role != RoleMember || m.Muted(time.Now()) {
		t.Fatalf("member: %+v %v", m, err)
	}
	until := time.Now().Add(time.Hour)
	if err := c.PutMember(ctx, tenant, "g", 1, RoleMember, &until); err != nil {
		t.Fatal(err)
	}
	if m, _ = c.Lookup(ctx, tenant, "g", 1); !m.Muted(time.Now()) {
		t.Fatalf("muted member not muted: %+v", m)
	}
	if err := c.PutGroup(ctx, tenant, "g", 77, "team", GroupMuted); err != nil {
		t.Fatal(err)
	}
	if err := c.PutMember(ctx, tenant, "g", 2, RoleOwner, nil); err != nil {
		t.Fatal(err)
	}
	if m, _ = c.Lookup(ctx, tenant, "g", 2); m.Muted(time.Now()) {
		t.Fatal("an owner may post in a muted group")
	}
	if err := c.DeleteMember(ctx, tenant, "g", 1); err != nil {
		t.Fatal(err)
	}
	if m, _ = c.Lookup(ctx, tenant, "g", 1); m.Member {
		t.Fatal("removed member still a member")
	}
}
