package acl

import (
	"database/sql"
	"testing"
	"time"
)

// TestPrefsField: a topic's preferences field holds pinned and the
// notification mute to the millisecond, is absent when neither is set,
// and a malformed value is refused.
func TestPrefsField(t *testing.T) {
	mute := time.Date(2026, 12, 1, 10, 30, 0, 123_000_000, time.UTC)
	for _, c := range []struct {
		name   string
		pinned bool
		mute   sql.NullTime
		field  string
	}{
		{"none", false, sql.NullTime{}, ""},
		{"pinned", true, sql.NullTime{}, "p1:0"},
		{"muted", false, sql.NullTime{Time: mute, Valid: true}, "p0:1796121000123"},
		{"both", true, sql.NullTime{Time: mute, Valid: true}, "p1:1796121000123"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, ok := prefsField(Prefs{Pinned: c.pinned, NotifyMute: c.mute})
			if f != c.field || ok != (c.field != "") {
				t.Fatalf("field %q %v, want %q", f, ok, c.field)
			}
			if !ok {
				return
			}
			p, ok := prefsFrom(f)
			if !ok || p.Pinned != c.pinned || p.NotifyMute != c.mute {
				t.Fatalf("read back %v %v, want %v %v", p.Pinned, p.NotifyMute, c.pinned, c.mute)
			}
		})
	}
	for _, bad := range []string{"", "p1", "p2:0", "1:0", "p1:-5", "p1:x", "p1:0:0"} {
		if _, ok := prefsFrom(bad); ok {
			t.Errorf("%q read as preferences", bad)
		}
	}
}
