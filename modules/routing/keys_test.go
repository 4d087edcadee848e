package routing

import (
	"context"
	"errors"
	"path"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// hashTag is the part of key Redis Cluster hashes: the text between the
// first "{" and the first "}" after it, when not empty; else the whole key.
func hashTag(key string) string {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return key
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j <= 0 {
		return key
	}
	return key[i+1 : i+1+j]
}

// allKeys calls every method of k that names keys — the exported ones
// found by reflection, so a builder added later is checked without being
// listed here, and the unexported ones by name — with arguments that
// carry metacharacters where a request value may. It returns the keys and,
// apart, the SCAN patterns (the methods named ...Pattern).
func allKeys(t *testing.T, k Keys) (keys, patterns []string) {
	t.Helper()
	v := reflect.ValueOf(k)
	for i := range v.NumMethod() {
		m, name := v.Method(i), v.Type().Method(i).Name
		var args []reflect.Value
		for a := range m.Type().NumIn() {
			switch in := m.Type().In(a); in.Kind() {
			case reflect.String:
				arg := "g" // topics and bench runs are validated names
				if name == "Idempotency" && a == 2 {
					arg = "c:{x}*?[ ]" // a client_msg_id is any text
				}
				args = append(args, reflect.ValueOf(arg))
			case reflect.Int64:
				args = append(args, reflect.ValueOf(int64(7)))
			default:
				t.Fatalf("Keys.%s takes a %s: teach allKeys its argument", name, in)
			}
		}
		for _, out := range m.Call(args) {
			var got []string
			switch o := out.Interface().(type) {
			case string:
				got = []string{o}
			case []string:
				got = o
			default:
				t.Fatalf("Keys.%s returns a %T: teach allKeys what it names", name, o)
			}
			if strings.HasSuffix(name, "Pattern") {
				patterns = append(patterns, got...)
			} else {
				keys = append(keys, got...)
			}
		}
	}
	keys = append(keys, k.legacySeqHW("g"), k.legacySeqStamp("g"))
	keys = append(keys, k.seqState("g")...)
	keys = append(keys, k.alloc("g")...)
	return keys, patterns
}

// Every key and channel the builder names starts with the installation's
// redis.key_prefix and keeps the tenant as its Cluster hash tag (all of a
// tenant's keys share one slot, whatever the prefix); request values add
// no brace or glob metacharacter; the tenant's SCAN pattern matches each of
// them, and no key of one prefix matches the pattern of another.
func TestEveryKeyHonoursThePrefixAndKeepsTheTenantTag(t *testing.T) {
	prefixes := []string{"", "prod:", "a", "aim:", "ab", "x.y-z_9:", strings.Repeat("p", 32)}
	patterns := map[string]string{} // prefix → the tenant's SCAN pattern
	built := map[string][]string{}  // prefix → every key
	for _, prefix := range prefixes {
		space, err := NewKeySpace(prefix)
		if err != nil {
			t.Fatalf("NewKeySpace(%q): %v", prefix, err)
		}
		k, err := space.Tenant("acme")
		if err != nil {
			t.Fatal(err)
		}
		keys, pats := allKeys(t, k)
		if len(keys) < 40 || len(pats) != 2 {
			t.Fatalf("found %d keys and %d patterns: the builder's methods were not all reached", len(keys), len(pats))
		}
		for _, key := range append(slices.Clone(keys), pats...) {
			if !strings.HasPrefix(key, prefix+"im:{acme}:") {
				t.Errorf("prefix %q: key %q does not start with the prefix and the tenant", prefix, key)
			}
			if tag := hashTag(key); tag != "acme" {
				t.Errorf("prefix %q: key %q hashes on %q, not the tenant", prefix, key, tag)
			}
		}
		for _, key := range keys {
			if strings.Count(key, "{") != 1 || strings.Count(key, "}") != 1 || strings.ContainsAny(key, "*?[] ") {
				t.Errorf("prefix %q: key %q carries a request's metacharacters", prefix, key)
			}
			if ok, _ := path.Match(k.TenantPattern(), key); !ok {
				t.Errorf("prefix %q: key %q escapes the tenant's SCAN pattern %q", prefix, key, k.TenantPattern())
			}
		}
		for _, global := range []func() (string, error){func() (string, error) { return space.SnowflakeNode(3) }, space.BenchChannel} {
			key, err := global()
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(key, prefix+"im:{-global}:") || hashTag(key) != "-global" {
				t.Errorf("prefix %q: global key %q outside the prefix or the global hash tag", prefix, key)
			}
			keys = append(keys, key)
		}
		patterns[prefix], built[prefix] = k.TenantPattern(), keys
	}
	for _, a := range prefixes {
		for _, b := range prefixes {
			if a == b {
				continue
			}
			for _, key := range built[a] {
				if ok, _ := path.Match(patterns[b], key); ok || strings.HasPrefix(key, b+"im:{") {
					t.Errorf("key %q of prefix %q is in the key space of prefix %q", key, a, b)
				}
			}
		}
	}

	// an installation without a prefix keeps the documented names
	// (docs/architecture.md)
	none, _ := NewKeySpace("")
	k, _ := none.Tenant("acme")
	if k.ActiveMonth() != "im:{acme}:groupmsg:active_month" || k.Route("g") != "im:{acme}:groupmsg:route:g" {
		t.Error("the documented Redis key names changed")
	}
	if _, err := none.Tenant("a}b"); err == nil {
		t.Error("a tenant id with a brace must be refused")
	}
}

// A prefix that could move the hash tag, act as a glob or run long is
// refused; a key space not made by NewKeySpace names nothing.
func TestKeySpaceRefusesUnsafePrefixesAndTheZeroValue(t *testing.T) {
	for _, p := range []string{"{x}", "a{", "b}", "a*", "a?", "a[b]", "a b", `a\b`, "é", "a\n", strings.Repeat("p", 33)} {
		if _, err := NewKeySpace(p); err == nil {
			t.Errorf("NewKeySpace(%q) accepted", p)
		}
	}
	var zero KeySpace
	if _, err := zero.Tenant("acme"); !errors.Is(err, ErrNoKeySpace) {
		t.Errorf("zero KeySpace Tenant: %v", err)
	}
	if _, err := zero.SnowflakeNode(1); !errors.Is(err, ErrNoKeySpace) {
		t.Errorf("zero KeySpace SnowflakeNode: %v", err)
	}
	if _, err := zero.BenchChannel(); !errors.Is(err, ErrNoKeySpace) {
		t.Errorf("zero KeySpace BenchChannel: %v", err)
	}
	if err := zero.DropTenantKeys(context.Background(), nil, "acme"); !errors.Is(err, ErrNoKeySpace) {
		t.Errorf("zero KeySpace DropTenantKeys: %v", err)
	}
}
