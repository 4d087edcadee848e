package robustness

// Checkers are every checker of a run's history, each guarding one
// invariant of docs/invariants.md as a client can observe it.
var Checkers = []Checker{Delivery, Settled, NoDuplicate, NoMissing, Isolation, ChangeOrder, Cursor, Model, CAS}

// Check runs every checker over ops and returns what they found, checker
// by checker.
func Check(ops []Op) []Violation {
	var out []Violation
	for _, c := range Checkers {
		out = append(out, c.Check(ops)...)
	}
	return out
}
