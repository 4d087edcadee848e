package robustness

import "testing"

func TestCAS(t *testing.T) {
	conflict := func(o Op, current int64) Op {
		o = status(o, 409, "conflict")
		o.CurrentVersion = current
		return o
	}
	notStored := status(edit(1, "g", 1, 1, 0, 0), 409, "conflict")
	notStored.RetryAfterMS = 50
	held := status(edit(1, "g", 1, 2, 0, 0), 409, "conflict")
	held.RetryAfterMS, held.Reason = 250, "tenant_moving"
	runCases(t, CAS, []checkCase{
		{name: "two edits on one version: one wins", h: h().
			at(0, 10, edit(1, "g", 1, 1, 2, 1)).at(0, 10, conflict(edit(1, "g", 1, 1, 0, 0), 2))},
		{name: "two edits with the same expected_version both succeeding", h: h().
			at(0, 10, edit(1, "g", 1, 1, 2, 1)).at(0, 10, edit(1, "g", 1, 1, 2, 2)),
			flagged: true, detail: "g seq 1: its 2 changes are not linearizable"},
		{name: "edits in a chain", h: h().
			at(0, 10, edit(1, "g", 1, 1, 2, 1)).at(11, 20, edit(1, "g", 1, 2, 3, 2)).
			at(21, 30, conflict(edit(1, "g", 1, 2, 0, 0), 3))},
		{name: "a conflict naming a version the message never had then", h: h().
			at(0, 10, edit(1, "g", 1, 1, 2, 1)).at(11, 20, conflict(edit(1, "g", 1, 1, 0, 0), 1)),
			flagged: true, detail: "not linearizable"},
		{name: "an unanswered edit may have applied", h: h().
			at(0, 10, unknown(edit(1, "g", 1, 1, 2, 1))).at(11, 20, conflict(edit(1, "g", 1, 1, 0, 0), 2)).
			at(21, 30, edit(1, "g", 1, 2, 3, 2))},
		{name: "an unanswered edit may not have applied", h: h().
			at(0, 10, unknown(edit(1, "g", 1, 1, 2, 1))).at(11, 20, edit(1, "g", 1, 1, 2, 2))},
		{name: "an edit succeeding after a recall answered", h: h().
			at(0, 10, change(Recall, 1, "g", 1, 2, 1)).at(11, 20, edit(1, "g", 1, 2, 3, 2)),
			flagged: true, detail: "not linearizable"},
		{name: "a recall after a delete conflicts, a repeated delete answers the tombstone", h: h().
			at(0, 10, deleteAll("g", 1, 2, 1)).at(11, 20, conflict(change(Recall, 1, "g", 1, 0, 0), 0)).
			at(21, 30, deleteAll("g", 1, 2, 0))},
		{name: "not stored yet, then edited", h: h().at(0, 10, notStored).at(11, 20, edit(1, "g", 1, 1, 2, 1))},
		{name: "an edit refused while a move holds the tenant's writes, after an edit answered, then retried", h: h().
			at(0, 10, edit(1, "g", 1, 1, 2, 1)).at(11, 20, held).at(21, 30, edit(1, "g", 1, 2, 3, 2))},
		{name: "not stored yet after an edit answered", h: h().
			at(0, 10, edit(1, "g", 1, 1, 2, 1)).at(11, 20, notStored),
			flagged: true, detail: "not linearizable"},
	})
}
