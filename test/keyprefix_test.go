package test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// kpScan lists every key of every node matching pattern.
func kpScan(t *testing.T, rdb rueidis.Client, pattern string) []string {
	t.Helper()
	var out []string
	for addr, node := range rdb.Nodes() {
		var cursor uint64
		for {
			e, err := node.Do(context.Background(), node.B().Scan().Cursor(cursor).Match(pattern).Count(1000).Build()).AsScanEntry()
			if err != nil {
				t.Fatalf("scan %s on %s: %v", pattern, addr, err)
			}
			out = append(out, e.Elements...)
			if cursor = e.Cursor; cursor == 0 {
				break
			}
		}
	}
	return out
}

// kpUnder fails the test unless every name starts with one of prefixes,
// and every prefix starts at least one name; what names what.
func kpUnder(t *testing.T, what string, names []string, prefixes ...string) {
	t.Helper()
	per := map[string]int{}
	for _, n := range names {
		found := false
		for _, p := range prefixes {
			if strings.HasPrefix(n, p) {
				per[p]++
				found = true
			}
		}
		if !found {
			t.Errorf("%s %q lies outside the installations' key prefixes", what, n)
		}
	}
	for _, p := range prefixes {
		if per[p] == 0 {
			t.Errorf("no %s under %q (found %v)", what, p, names)
		}
	}
}

// Two installations share one Redis, each under its own redis.key_prefix,
// and both serve a tenant of the same id (each with its own MySQL database
// and Kafka): each sends, stores, reads and streams its own messages only,
// both count the topic's seqs from 1, and every Redis key and pub/sub
// channel either one uses lies under its installation's prefix.
func TestTwoInstallationsShareRedisUnderTheirKeyPrefixes(t *testing.T) {
	t.Parallel()
	tenant := testenv.NewTenant(t) // its cleanup takes the tenant's keys under every prefix
	admin := testenv.MySQL(t)
	otherDB := "imshard_kpb_" + tenant
	t.Cleanup(func() {
		if _, err := admin.Exec("DROP DATABASE IF EXISTS `" + otherDB + "`"); err != nil {
			t.Errorf("drop %s: %v", otherDB, err)
		}
	})
	prefixes := []string{"kpa:", "kpb:"}
	texts := [][]string{{"a1", "a2", "a3"}, {"b1", "b2"}}
	var envs []*sendEnv
	var socks []*stClient
	for i, prefix := range prefixes {
		e := stStart(t, harness.Options{Tenant: tenant, Mutate: func(c *config.Config) {
			c.Redis.KeyPrefix = prefix
			if i == 1 {
				c.MySQL.DSNTemplate = strings.Replace(c.MySQL.DSNTemplate, testenv.TenantDBPrefix+"{tenant}", "imshard_kpb_{tenant}", 1)
			}
		}})
		e.group("room", 7, "active")
		e.member("room", 42, "member", time.Time{})
		c := stMustDial(t, e.Env, "/v1/topics/room/stream?since=0", e.Token(42, ""))
		if f := c.must("live"); f.Seq != 0 {
			t.Fatalf("installation %s: a fresh topic is live at seq %d", prefix, f.Seq)
		}
		envs, socks = append(envs, e), append(socks, c)
	}

	// the sends interleave: a shared counter would number them across both
	for n := range texts[0] {
		for i, e := range envs {
			if n >= len(texts[i]) {
				continue
			}
			r := e.mustSend(e.Token(42, ""), "room", sendBody(fmt.Sprintf("c%d", n), texts[i][n]))
			if r.Seq != int64(n+1) {
				t.Fatalf("installation %s: message %d got seq %d, want %d", prefixes[i], n+1, r.Seq, n+1)
			}
		}
	}

	for i, e := range envs {
		want := texts[i]
		for n, text := range want {
			f := socks[i].must("message")
			if f.Message.Seq != int64(n+1) || kpText(f.Message) != text {
				t.Fatalf("installation %s: stream frame %d is seq %d %q, want seq %d %q", prefixes[i], n+1, f.Message.Seq, kpText(f.Message), n+1, text)
			}
		}
		stored := persistWaitCount(t, e.Env, len(want), 30*time.Second, e.Start)
		if len(stored["room"]) != len(want) {
			t.Fatalf("installation %s: stored %v, want %d messages", prefixes[i], stored, len(want))
		}
		page := rpList(t, e.Env, 42, "room", nil)
		var got []string
		for _, m := range page.Messages {
			got = append(got, fmt.Sprintf("%d:%s", m.Seq, kpText(m)))
		}
		var exp []string
		for n := len(want); n >= 1; n-- {
			exp = append(exp, fmt.Sprintf("%d:%s", n, want[n-1]))
		}
		if strings.Join(got, " ") != strings.Join(exp, " ") {
			t.Fatalf("installation %s reads %v, want %v", prefixes[i], got, exp)
		}
	}

	rdb := envs[0].Redis
	tagged := make([]string, len(prefixes))
	for i, p := range prefixes {
		tagged[i] = p + "im:{" + tenant + "}:"
	}
	// every key of the tenant, whoever wrote it, and the stream's channels
	// (subscribed while the sockets are open)
	kpUnder(t, "key", kpScan(t, rdb, "*{"+tenant+"}*"), tagged...)
	channels, err := rdb.Do(context.Background(), rdb.B().PubsubShardchannels().Pattern("*{"+tenant+"}*").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	kpUnder(t, "channel", channels, tagged...)
	for i, p := range prefixes {
		leases := kpScan(t, rdb, p+"im:{-global}:snowflake:node:*")
		kpUnder(t, "snowflake lease", leases, p+"im:{-global}:")
		keys := envs[i].Keys()
		// persist publishes its progress on a timer: its key comes within seconds
		waitFor(t, 30*time.Second, func() bool {
			n, err := rdb.Do(context.Background(), rdb.B().Exists().Key(keys.PersistedBefore()).Build()).AsInt64()
			return err == nil && n == 1
		})
		for _, key := range []string{keys.Seq("room"), keys.Route("room"), keys.ActiveMonth(), keys.PersistedBefore()} {
			if !strings.HasPrefix(key, p) {
				t.Fatalf("installation %s names key %q", p, key)
			}
			if n, err := rdb.Do(context.Background(), rdb.B().Exists().Key(key).Build()).AsInt64(); err != nil || n != 1 {
				t.Errorf("installation %s: key %q missing (%d, %v)", p, key, n, err)
			}
		}
		if last, err := rdb.Do(context.Background(), rdb.B().Get().Key(keys.Seq("room")).Build()).AsInt64(); err != nil || last != int64(len(texts[i])) {
			t.Errorf("installation %s: last seq %d (%v), want %d", p, last, err, len(texts[i]))
		}
	}
}

// kpText is a message's content.text.
func kpText(m message.Message) string {
	var c struct {
		Text string `json:"text"`
	}
	_ = json.Unmarshal(m.Content, &c)
	return c.Text
}
