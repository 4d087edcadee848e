package app

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Module names. A role is a module an operator may ask for by name; the
// others are pulled in as dependencies.
const (
	Ops      = "ops"      // /metrics, /healthz, /readyz on metrics.addr
	MySQL    = "mysql"    // tenant pools
	Redis    = "redis"    // Redis client (standalone or cluster)
	Kafka    = "kafka"    // brokers (or the in-process kfake cluster)
	Routing  = "routing"  // catalog, allocator, route lookup
	Keys     = "keys"     // the tenants' key sets: their JWKS fetched in the background
	ReadPath = "readpath" // the read path the reading modules share (library)
	ShardMgr = "shardmgr" // month-table patrol
	API      = "api"      // the HTTP API server on http.addr
	Send     = "send"     // POST messages, group and member management; runs changes
	Changes  = "changes"  // recall, edit, delete for everyone and for me
	Persist  = "persist"  // Kafka → month tables consumer
	Query    = "query"    // GET messages, search, admin routes; runs inbox and stream
	Inbox    = "inbox"    // read cursors, badges, topic list, sync, preferences
	Stream   = "stream"   // the realtime WebSocket stream
	Migrate  = "migrate"  // legacy-table migrations: backfill, routes, verification
	Relay    = "relay"    // the change feed: outbox rows → kafka.changes_topic
	All      = "all"      // every role; no code of its own
)

// deps is the dependency table: each module starts after the ones it lists
// and stops before them. A role lists the modules it runs beside its own as
// dependencies too: send runs changes; query runs inbox and stream.
var deps = map[string][]string{
	Ops:      nil,
	MySQL:    {Ops},
	Redis:    {Ops},
	Kafka:    {Ops},
	Routing:  {MySQL, Redis},
	Keys:     {Ops},
	ShardMgr: {Routing, ReadPath}, // ReadPath: the erase jobs delete through the changes path
	API:      {Routing},
	Changes:  {ReadPath, Keys},
	Send:     {Routing, Kafka, Changes},
	Persist:  {Routing, Kafka},
	ReadPath: {Routing},
	Inbox:    {ReadPath, Keys},
	Stream:   {ReadPath, Keys},
	Query:    {ReadPath, Inbox, Stream},
	Migrate:  {Routing},
	Relay:    {MySQL, Kafka},
	All:      {ShardMgr, Send, Persist, Query, Migrate, Relay},
}

// after orders the API server behind the HTTP roles present, so every
// handler is registered before it listens (and it stops accepting first),
// without making a role's presence pull in the others.
var after = map[string][]string{
	API: {Send, Changes, Query, Inbox, Stream},
}

// roles are the modules an operator may name in `serve --roles`.
var roles = []string{ShardMgr, Send, Persist, Query, Stream, Migrate, Relay}

// httpModules are the modules that serve the HTTP API; any of them adds API.
var httpModules = []string{Send, Changes, Query, Inbox, Stream}

// Roles lists the valid role names, sorted.
func Roles() []string {
	out := slices.Clone(roles)
	sort.Strings(out)
	return out
}

// ParseRoles splits a --roles value; an unknown role is an error that lists
// the valid ones.
func ParseRoles(s string) ([]string, error) {
	valid := Roles()
	var out []string
	for _, r := range strings.Split(s, ",") {
		r = strings.TrimSpace(r)
		if r == "" {
			continue
		}
		if r != All && !slices.Contains(valid, r) {
			return nil, fmt.Errorf("unknown role %q (valid: %s, or all)", r, strings.Join(valid, ", "))
		}
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no role given (valid: %s, or all)", strings.Join(valid, ", "))
	}
	return out, nil
}

// StartOrder resolves the targets to every module they need, in a
// deterministic order where each module comes after its dependencies.
func StartOrder(targets []string) ([]string, error) {
	want := map[string]bool{}
	var visit func(string) error
	visit = func(m string) error {
		if want[m] {
			return nil
		}
		if _, ok := deps[m]; !ok {
			return fmt.Errorf("unknown module %q", m)
		}
		want[m] = true
		for _, d := range deps[m] {
			if err := visit(d); err != nil {
				return err
			}
		}
		return nil
	}
	for _, t := range targets {
		if err := visit(t); err != nil {
			return nil, err
		}
	}
	for _, r := range httpModules {
		if want[r] {
			if err := visit(API); err != nil {
				return nil, err
			}
			break
		}
	}

	var order []string
	done := map[string]bool{}
	var place func(string, []string) error
	place = func(m string, path []string) error {
		if done[m] {
			return nil
		}
		if slices.Contains(path, m) {
			return fmt.Errorf("module dependency cycle: %s", strings.Join(append(path, m), " → "))
		}
		before := append(slices.Clone(deps[m]), after[m]...)
		sort.Strings(before)
		for _, d := range before {
			if !want[d] {
				continue
			}
			if err := place(d, append(path, m)); err != nil {
				return err
			}
		}
		done[m] = true
		order = append(order, m)
		return nil
	}
	names := make([]string, 0, len(want))
	for m := range want {
		names = append(names, m)
	}
	sort.Strings(names)
	for _, m := range names {
		if err := place(m, nil); err != nil {
			return nil, err
		}
	}
	return order, nil
}
