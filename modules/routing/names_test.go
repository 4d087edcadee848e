package routing

import (
	"errors"
	"regexp"
	"strings"
	"testing"
)

func TestParseTable(t *testing.T) {
	good := []string{"im_group_messages_202609", "im_group_messages_200001"}
	bad := []string{
		"im_group_messages", "im_group_messages_legacy", "im_group_messages_202613",
		"im_group_messages_000000", "im_group_messages_20261", "im_group_messages_2026011",
		"im_group_messages_202609; DROP TABLE x", "im_group_messages_202609`", "`im_group_messages_202609`",
		"IM_GROUP_MESSAGES_202609", "im_group_messages_2026O9", "im_dellog", "",
		"im_group_messages_202609\n", " im_group_messages_202609",
	}
	for _, name := range good {
		tb, err := ParseTable(name)
		if err != nil || tb.Name() != name || tb.Quoted() != "`"+name+"`" {
			t.Errorf("ParseTable(%q) = %v, %v", name, tb, err)
		}
	}
	for _, name := range bad {
		if _, err := ParseTable(name); !errors.Is(err, ErrInvalidTable) {
			t.Errorf("ParseTable(%q) err = %v, want ErrInvalidTable", name, err)
		}
	}
	if _, err := TableFor(Month{}); !errors.Is(err, ErrInvalidTable) {
		t.Error("TableFor(zero month) must fail")
	}
	if _, err := TableFor(MustMonth("219912").Next()); !errors.Is(err, ErrInvalidTable) {
		t.Error("TableFor(out-of-range month) must fail")
	}
}

func TestCreateDDL(t *testing.T) {
	tb, _ := TableFor(MustMonth("202611"))
	ddl := tb.CreateDDL()
	if !strings.HasPrefix(ddl, "CREATE TABLE IF NOT EXISTS `im_group_messages_202611` (") {
		t.Fatalf("DDL starts %q", ddl[:60])
	}
	for _, want := range []string{"UNIQUE KEY uk_topic_seq (topic, seqid)", "COLLATE utf8mb4_bin", "PRIMARY KEY (message_id)"} {
		if !strings.Contains(ddl, want) {
			t.Errorf("DDL lacks %q", want)
		}
	}
}

func TestValidTopicAndTenant(t *testing.T) {
	topics := map[string]bool{
		"grp_1": true, "A-b_9": true, strings.Repeat("a", 64): true,
		"": false, strings.Repeat("a", 65): false, "a b": false, "a'b": false, "a:b": false,
		"{t}": false, "x*": false, "a/b": false, "a\nb": false, "é": false, "a;DROP": false,
	}
	for topic, ok := range topics {
		if err := ValidTopic(topic); (err == nil) != ok {
			t.Errorf("ValidTopic(%q) = %v, want ok=%v", topic, err, ok)
		}
	}
	tenants := map[string]bool{
		"demo": true, "t_1": true, strings.Repeat("a", 32): true,
		"": false, "Demo": false, "a-b": false, strings.Repeat("a", 33): false, "{x}": false, "a*": false,
	}
	for id, ok := range tenants {
		if err := ValidTenant(id); (err == nil) != ok {
			t.Errorf("ValidTenant(%q) = %v, want ok=%v", id, err, ok)
		}
	}
}

func FuzzParseTable(f *testing.F) {
	for _, s := range []string{"im_group_messages_202609", "im_group_messages", "x`; DROP"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tb, err := ParseTable(s)
		if err != nil {
			return
		}
		if tb.Name() != s || strings.ContainsAny(tb.Name(), "`;' \n") {
			t.Fatalf("ParseTable(%q) accepted %q", s, tb.Name())
		}
	})
}

func FuzzValidTopic(f *testing.F) {
	for _, s := range []string{"grp_1", "a'b", "{t}", "x*", "Grp-1", "t\u00e9", strings.Repeat("a", 65)} {
		f.Add(s)
	}
	// invariant 5, docs/invariants.md's patterns, which nameOf implements by hand
	tenant := regexp.MustCompile(`^[a-z0-9_]{1,32}$`)
	topic := regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := ValidTopic(s) == nil, topic.MatchString(s); got != want {
			t.Fatalf("ValidTopic(%q) accepts %v, the pattern %v", s, got, want)
		}
		if got, want := ValidTenant(s) == nil, tenant.MatchString(s); got != want {
			t.Fatalf("ValidTenant(%q) accepts %v, the pattern %v", s, got, want)
		}
		if ValidTopic(s) == nil && (strings.ContainsAny(s, "{}*?[]:'\"` \\\n") || len(s) > 64 || s == "") {
			t.Fatalf("ValidTopic accepted %q", s)
		}
	})
}

func TestParseRangeValue(t *testing.T) {
	mr, ok := ParseRangeValue("min_seq=1,max_seq=10086,count=10086")
	if !ok || mr.MinSeq != 1 || mr.MaxSeq != 10086 || mr.Count != 10086 {
		t.Fatalf("got %+v %v", mr, ok)
	}
	for _, bad := range []string{"", "min_seq=1", "min_seq=a,max_seq=1,count=1", "junk"} {
		if _, ok := ParseRangeValue(bad); ok {
			t.Errorf("ParseRangeValue(%q) accepted", bad)
		}
	}
}
