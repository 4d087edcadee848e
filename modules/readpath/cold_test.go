package readpath

import (
	"testing"
	"time"

	"github.com/imshard/imshard/modules/message"
)

// A search's condition on archived rows is the statement's: a normal
// message in [From, To) whose content.text is LIKE the pattern (ESCAPE
// '!', case-sensitive, _ one character, a non-string text as its JSON).
func TestColdSearchMatchesAsLike(t *testing.T) {
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	m := TextMatch{From: at.Add(-time.Hour), To: at.Add(time.Hour), Like: "%a!_b_%"}
	keep, err := m.rows()
	if err != nil {
		t.Fatal(err)
	}
	row := func(content, status string, created time.Time) *Row {
		return &Row{Content: []byte(content), Status: status, CreatedAt: created}
	}
	for _, c := range []struct {
		row  *Row
		want bool
	}{
		{row(`{"text":"xa_bcy"}`, message.StatusNormal, at), true},
		{row(`{"text":"a_bé"}`, message.StatusNormal, at), true},        // _ is one character, not one byte
		{row(`{"text":"a_b"}`, message.StatusNormal, at), false},        // _ needs a character
		{row(`{"text":"axbc"}`, message.StatusNormal, at), false},       // ! escapes the _
		{row(`{"text":"A_BC"}`, message.StatusNormal, at), false},       // case-sensitive
		{row(`{"text":"a\u005fbc\n"}`, message.StatusNormal, at), true}, // unquoted; % spans lines
		{row(`{"text":"a_bc"}`, message.StatusRecalled, at), false},
		{row(`{"text":"a_bc"}`, message.StatusNormal, m.To), false},
		{row(`{"text":"a_bc"}`, message.StatusNormal, m.From), true},
		{row(`{"text":null}`, message.StatusNormal, at), false},
		{row(`{"other":"a_bc"}`, message.StatusNormal, at), false},
	} {
		if got := keep(c.row); got != c.want {
			t.Errorf("%s %s %v: %v, want %v", c.row.Content, c.row.Status, c.row.CreatedAt, got, c.want)
		}
	}
}
