package robustness

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// shrinkBudget bounds the checker runs one Shrink makes: each run reads a
// candidate history, and a long run's history can be large, so a shrink
// that has not converged by then returns the smallest failing history it
// found.
const shrinkBudget = 400

// Shrink returns a short sub-history of ops that still fails c the same
// way: delta debugging (ddmin) over the ops, keeping every subset in which
// c still finds a violation with the first one's detail (a subset that
// breaks c otherwise — a count judged against fewer writes — would show
// another failure than the run's), with the Quiesce op and the ops of c's
// first violation always kept.
// The order of ops is kept; the result is ops itself when it does not
// fail c. Deterministic, and bounded by shrinkBudget checker runs.
func Shrink(ops []Op, c Checker) []Op {
	vs := c.Check(ops)
	if len(vs) == 0 {
		return ops
	}
	keep := map[int64]bool{}
	for _, id := range vs[0].Ops {
		keep[id] = true
	}
	var kept, rest []int
	for i, o := range ops {
		if keep[o.ID] || o.Kind == Quiesce {
			kept = append(kept, i)
		} else {
			rest = append(rest, i)
		}
	}
	runs := 0
	fails := func(subset []int) bool {
		runs++
		return slices.ContainsFunc(c.Check(pick(ops, kept, subset)), func(v Violation) bool { return v.Detail == vs[0].Detail })
	}
	if fails(nil) {
		return pick(ops, kept, nil)
	}
	n := 2
	for len(rest) >= 2 && runs < shrinkBudget {
		chunks := split(rest, n)
		reduced := false
		for _, ch := range chunks {
			if runs >= shrinkBudget {
				break
			}
			if fails(ch) {
				rest, n, reduced = ch, 2, true
				break
			}
		}
		if !reduced && n > 2 {
			for i := range chunks {
				if runs >= shrinkBudget {
					break
				}
				comp := complement(chunks, i)
				if fails(comp) {
					rest, n, reduced = comp, max(n-1, 2), true
					break
				}
			}
		}
		if !reduced {
			if n >= len(rest) {
				break
			}
			n = min(2*n, len(rest))
		}
	}
	return pick(ops, kept, rest)
}

// pick returns the ops at the indexes of a and b, in their original order.
func pick(ops []Op, a, b []int) []Op {
	out := make([]Op, 0, len(a)+len(b))
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		if j >= len(b) || (i < len(a) && a[i] < b[j]) {
			out = append(out, ops[a[i]])
			i++
		} else {
			out = append(out, ops[b[j]])
			j++
		}
	}
	return out
}

// split cuts s into n nearly equal runs.
func split(s []int, n int) [][]int {
	out := make([][]int, 0, n)
	for i := range n {
		lo, hi := i*len(s)/n, (i+1)*len(s)/n
		if lo < hi {
			out = append(out, s[lo:hi])
		}
	}
	return out
}

// complement joins every chunk but the i-th.
func complement(chunks [][]int, i int) []int {
	var out []int
	for j, c := range chunks {
		if j != i {
			out = append(out, c...)
		}
	}
	return out
}

// Format prints a history one op a line, in the order the ops started:
// the time since the first op, the client, the kind, the topic, what was
// asked and what came back.
func Format(ops []Op) string {
	all := ordered(ops)
	if len(all) == 0 {
		return ""
	}
	t0 := all[0].Start
	var b strings.Builder
	for _, o := range all {
		fmt.Fprintf(&b, "%9s c%-3d #%-6d %-18s %s/%s user=%d", offset(o.Start.Sub(t0)), o.Client, o.ID, o.Kind, o.Tenant, o.Topic, o.User)
		if o.Role != "" {
			fmt.Fprintf(&b, " role=%s", o.Role)
		}
		fmt.Fprintf(&b, " %s → %s (%s)\n", request(o), answer(o), offset(o.End.Sub(o.Start)))
	}
	return b.String()
}

func offset(d time.Duration) string { return fmt.Sprintf("%.3fs", d.Seconds()) }

// request is what an op asked, in the API's words.
func request(o *Op) string {
	var f []string
	add := func(format string, a ...any) { f = append(f, fmt.Sprintf(format, a...)) }
	switch o.Kind {
	case Send:
		add("client_msg_id=%s", o.ClientMsgID)
		if len(o.Mentions) > 0 || o.MentionAll {
			add("mentions=%v all=%v", o.Mentions, o.MentionAll)
		}
	case Recall, DeleteAll, BySeq:
		add("seq=%d", o.Seq)
	case Edit:
		add("seq=%d expected_version=%d", o.Seq, o.ExpectedVersion)
	case Hide:
		add("[%d, %d)", o.Seq, o.HideHi)
	case CursorPut:
		add("seq=%d", o.Seq)
	case PageSince:
		add("since=%d limit=%d", o.Since, o.Limit)
	case PageBefore:
		add("before=%d limit=%d", o.Before, o.Limit)
	case ByID:
		add("id=%s", o.MessageID)
	case StreamOpen, StreamSubscribe:
		add("stream=%d since=%d changes_since=%d", o.Stream, o.Since, o.ChangesSince)
		if len(o.StreamTopics) > 0 {
			add("topics=%v", o.StreamTopics)
		}
	case StreamUnsubscribe, StreamClose:
		add("stream=%d", o.Stream)
	case Frame:
		add("stream=%d %s", o.Stream, o.FrameType)
	case Fault:
		add("%s", o.Fault)
	}
	return strings.Join(f, " ")
}

// answer is what came back.
func answer(o *Op) string {
	var f []string
	add := func(format string, a ...any) { f = append(f, fmt.Sprintf(format, a...)) }
	if o.Kind != Frame && o.Kind != Fault && o.Kind != Quiesce {
		add("%d", o.Status)
	}
	if o.Code != "" {
		add("%s", o.Code)
	}
	if o.Err != "" {
		add("err=%q", o.Err)
	}
	if len(o.Messages) > 0 {
		ms := make([]string, len(o.Messages))
		for i, m := range o.Messages {
			ms[i] = fmt.Sprintf("%d:%s", m.Seq, m.MessageID)
			if m.Status != "" && m.Status != "normal" {
				ms[i] += "/" + m.Status
			}
			if m.Version > 1 {
				ms[i] += fmt.Sprintf("/v%d", m.Version)
			}
		}
		add("messages=[%s]", strings.Join(ms, " "))
	}
	if len(o.Gaps) > 0 {
		add("gaps=%v", o.Gaps)
	}
	if o.Kind == PageSince {
		add("next_since=%d has_more=%v", o.NextSince, o.HasMore)
	}
	if c := o.Change; c != nil {
		add("change=%s seq=%d v%d change_seq=%d", c.Action, c.Seq, c.Version, c.ChangeSeq)
	}
	if o.CurrentVersion != 0 || o.RetryAfterMS != 0 {
		add("current_version=%d retry_after_ms=%d", o.CurrentVersion, o.RetryAfterMS)
	}
	for _, t := range o.Topics {
		e := fmt.Sprintf("{%s last=%d read=%d unread=%d mentions=%d", t.Topic, t.LastSeq, t.ReadSeq, t.Unread, t.MentionUnread)
		if t.UnreadCapped {
			e += " capped"
		}
		if t.Removed {
			e += " removed"
		}
		if t.LastMessage != nil {
			e += fmt.Sprintf(" last_message=%d", t.LastMessage.Seq)
		}
		f = append(f, e+"}")
	}
	switch {
	case o.Kind == CursorPut:
		add("read_seq=%d", o.ReadSeq)
	case o.FrameType == "gap":
		add("[%d, %d]", o.GapFrom, o.GapTo)
	case o.FrameType == "live" || o.FrameType == "reset" || o.FrameType == "read":
		add("seq=%d change_seq=%d", o.Seq, o.ChangeSeq)
	case o.Kind == StreamClose:
		add("close=%d", o.CloseCode)
	}
	return strings.Join(f, " ")
}
