package robustness

import (
	"fmt"
	"math"
	"sort"

	"github.com/anishathalye/porcupine"
)

const casName = "cas"

// movingReason is the details.reason of a change refused while a tenant
// move's switch holds the tenant's writes.
const movingReason = "tenant_moving"

// CAS: the changes of one message are linearizable against its version.
var CAS = Checker{
	Name: casName,
	Invariant: "the recalls, edits and deletes of each message are linearizable: an edit with expected_version E " +
		"succeeds exactly when the message is at E and normal (so of edits based on one version one succeeds), " +
		"and answers the next version; a 409 means it was not (at details.current_version when given, still " +
		"unchanged when the message was not stored yet, in any state when the tenant's writes were held by a move's " +
		"switch); a recall or delete moves the version once and makes " +
		"edits conflict; an op without an answer may have applied at any time after it began",
	Check: checkCAS,
}

// casState is a message as its changes see it; a send stores version 1.
type casState struct {
	version int64
	status  string
}

type casInput struct {
	action   Kind
	expected int64
}

type casOutput struct {
	status     int // 200, 409, or 0 for no answer
	version    int64
	current    int64
	notStored  bool
	held       bool // refused while a move's switch held the tenant's writes
	unanswered bool
}

// casStep is the sequential specification of one change: the states the
// message may be in after it.
func casStep(s casState, in casInput, out casOutput) []casState {
	next, ok := s, true
	switch in.action {
	case Edit:
		ok = s.status == "normal" && s.version == in.expected
		next = casState{s.version + 1, "normal"}
	case Recall:
		ok = s.status != "deleted"
		if s.status == "normal" {
			next = casState{s.version + 1, "recalled"}
		}
	case DeleteAll:
		if s.status != "deleted" {
			next = casState{s.version + 1, "deleted"}
		}
	}
	switch {
	case out.unanswered && ok:
		return []casState{s, next}
	case out.unanswered:
		return []casState{s}
	case out.status == 200 && ok && (out.version == 0 || out.version == next.version):
		return []casState{next}
	case out.status != 409:
		return nil
	case out.held:
		// refused before looking at the message: nothing changed, and
		// nothing is said of its state
		return []casState{s}
	case out.notStored:
		// nothing has changed the message yet
		if s == (casState{1, "normal"}) {
			return []casState{s}
		}
		return nil
	case !ok && (out.current == 0 || (s.status == "normal" && s.version == out.current)):
		return []casState{s}
	}
	return nil
}

var casModel = (&porcupine.NondeterministicModel{
	Init: func() []any { return []any{casState{1, "normal"}} },
	Step: func(state, input, output any) []any {
		var out []any
		for _, s := range casStep(state.(casState), input.(casInput), output.(casOutput)) {
			out = append(out, s)
		}
		return out
	},
}).ToModel()

func checkCAS(ops []Op) []Violation {
	all := ordered(ops)
	type seqKey struct {
		topicKey
		seq int64
	}
	byMsg := map[seqKey][]*Op{}
	var keys []seqKey
	for _, o := range all {
		if (o.Kind != Edit && o.Kind != Recall && o.Kind != DeleteAll) || (o.Status != 200 && o.Status != 409 && !o.Unknown()) {
			continue
		}
		k := seqKey{keyOf(o), o.Seq}
		if byMsg[k] == nil {
			keys = append(keys, k)
		}
		byMsg[k] = append(byMsg[k], o)
	}
	sort.SliceStable(keys, func(i, j int) bool { return byMsg[keys[i]][0].ID < byMsg[keys[j]][0].ID })
	var out []Violation
	for _, k := range keys {
		changes := byMsg[k]
		history := make([]porcupine.Operation, len(changes))
		for i, o := range changes {
			ret := o.End.UnixNano()
			if o.Unknown() {
				ret = math.MaxInt64
			}
			history[i] = porcupine.Operation{ClientId: o.Client, Call: o.Start.UnixNano(), Return: ret,
				Input: casInput{o.Kind, o.ExpectedVersion},
				Output: casOutput{status: o.Status, version: changeVersion(o), current: o.CurrentVersion,
					notStored: o.RetryAfterMS > 0 && o.Reason != movingReason, held: o.Reason == movingReason,
					unanswered: o.Unknown()}}
		}
		if !porcupine.CheckOperations(casModel, history) {
			out = append(out, violation(casName,
				fmt.Sprintf("%s seq %d: its %d changes are not linearizable", k.topic, k.seq, len(changes)), changes...))
		}
	}
	return out
}
