package robustness

import "testing"

func TestIsolation(t *testing.T) {
	list := func(user int64, topics ...string) Op {
		o := Op{Kind: List, User: user, Status: 200}
		for _, tp := range topics {
			o.Topics = append(o.Topics, TopicEntry{Topic: tp})
		}
		return o
	}
	removed := Op{Kind: Sync, User: 2, Status: 200, Topics: []TopicEntry{{Topic: "g", Removed: true}}}
	admin := since(9, "g", 0, 1, 1)
	admin.Role = "admin"
	otherTenant := bySeq(2, "g", 1)
	otherTenant.Tenant = "globex"
	dissolve := Op{Kind: Dissolve, User: 9, Topic: "g", Status: 200, Role: "service"}
	runCases(t, Isolation, []checkCase{
		{name: "a member reads", h: h().
			at(0, 10, join(2, "g")).at(11, 12, since(2, "g", 0, 1, 1)).at(13, 14, list(2, "g"))},
		{name: "a list showing a topic after the leave answered", h: h().
			at(0, 10, join(2, "g")).at(20, 30, leave(2, "g")).at(31, 32, list(2, "g")),
			flagged: true, detail: "a list entry reached user 2 of g, who leave (#2)"},
		{name: "a read concurrent with the leave may see it", h: h().
			at(0, 10, join(2, "g")).at(20, 30, leave(2, "g")).at(25, 32, list(2, "g"))},
		{name: "a removed sync entry after the leave", h: h().
			at(0, 10, join(2, "g")).at(20, 30, leave(2, "g")).at(31, 32, removed)},
		{name: "a rejoin whose answer never came may have applied", h: h().
			at(0, 10, join(2, "g")).at(20, 30, leave(2, "g")).at(31, 40, unknown(join(2, "g"))).at(50, 52, list(2, "g"))},
		{name: "a page for a user who never joined", h: h().
			at(11, 12, since(2, "g", 0, 1, 1)),
			flagged: true, detail: "since of seq 1 reached user 2 of g, who never joined"},
		{name: "a page that ended before the join began", h: h().
			at(11, 12, since(2, "g", 0, 1, 1)).at(13, 20, join(2, "g")),
			flagged: true, detail: "only joined later"},
		{name: "an admin reads any topic", h: h().at(11, 12, admin)},
		{name: "a stream opened after the leave", h: h().
			at(0, 10, join(2, "g")).at(20, 30, leave(2, "g")).at(31, 32, stream(7, 2, "g", 0)).at(33, 33, frameMsg(7, "g", 1)),
			flagged: true, detail: "a message frame on stream 7"},
		{name: "a stream opened before the leave keeps going until it is closed", h: h().
			at(0, 10, join(2, "g")).at(11, 12, stream(7, 2, "g", 0)).at(20, 30, leave(2, "g")).at(33, 33, frameMsg(7, "g", 1))},
		{name: "a dissolved group in a later list", h: h().
			at(0, 10, join(2, "g")).at(20, 30, dissolve).at(31, 32, list(2, "g")),
			flagged: true, detail: "dissolve"},
		{name: "a dissolved group in a later sync, not as removed", h: h().
			at(0, 10, join(2, "g")).at(20, 30, dissolve).at(31, 32, Op{Kind: Sync, User: 2, Status: 200, Topics: []TopicEntry{{Topic: "g"}}}),
			flagged: true, detail: "a sync entry reached user 2 of g, who dissolve"},
		{name: "a dissolved group reported removed by a later sync", h: h().
			at(0, 10, join(2, "g")).at(20, 30, dissolve).at(31, 32, Op{Kind: Sync, User: 2, Status: 200, Topics: []TopicEntry{{Topic: "g", Removed: true}}})},
		{name: "a dissolved group's members keep reading its history", h: h().
			at(0, 10, join(2, "g")).at(20, 30, dissolve).
			at(31, 32, since(2, "g", 0, 1, 1)).at(33, 34, bySeq(2, "g", 1)).
			at(35, 36, stream(7, 2, "g", 0)).at(37, 37, frameMsg(7, "g", 1))},
		{name: "a dissolve does not let a user who left read", h: h().
			at(0, 10, join(2, "g")).at(11, 12, leave(2, "g")).at(20, 30, dissolve).at(31, 32, since(2, "g", 0, 1, 1)),
			flagged: true, detail: "since of seq 1 reached user 2 of g, who leave (#2)"},
		{name: "another tenant's message", h: h().
			at(0, 10, send(1, "g", 1)).at(0, 10, Op{Kind: Join, User: 2, Topic: "g", Tenant: "globex", Status: 200}).
			at(11, 12, otherTenant),
			flagged: true, detail: "message g-1 of tenant acme reached tenant globex"},
	})
}
