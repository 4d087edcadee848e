package test

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/coder/websocket"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// issuer is a tenant's token issuer as a rotation sees it: it signs with
// one key at a time, and every client takes the token of the current key.
type issuer struct {
	t       *testing.T
	tenant  string
	current atomic.Pointer[issued]
}

// issued is the token of one signing key (one generation of the issuer).
type issued struct {
	gen   int64
	kid   string
	token string
}

func (i *issuer) use(gen int64, s httpapi.Signer) {
	tok, err := httpapi.SignWith(s, i.tenant, 1, "", time.Hour)
	if err != nil {
		i.t.Fatal(err)
	}
	i.current.Store(&issued{gen: gen, kid: s.KID, token: tok})
}

// load runs clients reading a topic with the issuer's current token until
// stop, counting every request and every one not answered 200; done[w] is
// the generation of the token client w's last finished request carried.
type load struct {
	total, failed atomic.Int64
	firstFailure  atomic.Value
	done          []atomic.Int64
	stop          chan struct{}
	wg            sync.WaitGroup
}

func startLoad(t *testing.T, baseURL, path string, is *issuer, clients int) *load {
	l := &load{done: make([]atomic.Int64, clients), stop: make(chan struct{})}
	client := &http.Client{Timeout: 10 * time.Second}
	for w := range clients {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				cur := is.current.Load()
				req, _ := http.NewRequest("GET", baseURL+path, nil)
				req.Header.Set("Authorization", "Bearer "+cur.token)
				resp, err := client.Do(req)
				l.total.Add(1)
				switch {
				case err != nil:
					l.failed.Add(1)
					l.firstFailure.CompareAndSwap(nil, err.Error())
				case resp.StatusCode != http.StatusOK:
					l.failed.Add(1)
					l.firstFailure.CompareAndSwap(nil, fmt.Sprintf("%d with the token of kid %s", resp.StatusCode, cur.kid))
				}
				if resp != nil {
					resp.Body.Close()
				}
				l.done[w].Store(cur.gen)
			}
		}()
	}
	t.Cleanup(l.halt)
	return l
}

// await waits until n more requests were made.
func (l *load) await(t *testing.T, n int64) {
	t.Helper()
	target := l.total.Load() + n
	deadline := time.Now().Add(60 * time.Second)
	for l.total.Load() < target {
		if time.Now().After(deadline) {
			t.Fatalf("the load made %d requests of %d in a minute", l.total.Load(), target)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// drained waits until every client's last finished request carried a token
// of generation gen: from then on no request with an older token is under
// way, and the key that signed those may go.
func (l *load) drained(t *testing.T, gen int64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for w := range l.done {
		for l.done[w].Load() < gen {
			if time.Now().After(deadline) {
				t.Fatalf("client %d still on generation %d", w, l.done[w].Load())
			}
			time.Sleep(time.Millisecond)
		}
	}
}

func (l *load) halt() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

// TestKeyRotationUnderLoad rotates a tenant's signing key the way
// docs/operations.md "Key rotation" tells, while clients read without
// pause: add the new key by a reload, switch the issuer to it, wait until
// no token of the old key is in use, remove the old key by a reload. No
// request fails; the socket opened with the old key's token ends with 1008
// "key removed" when that key goes, and the one of the new key stays.
func TestKeyRotationUnderLoad(t *testing.T) {
	t.Parallel()
	oldKey := config.TenantKey{KID: "2026-11", Alg: config.AlgHS256, Secret: strings.Repeat("o", 40)}
	newKey := config.TenantKey{KID: "2026-12", Alg: config.AlgHS256, Secret: strings.Repeat("n", 40)}
	e := stStart(t, harness.Options{Mutate: func(c *config.Config) { c.Tenants[0].Keys = []config.TenantKey{oldKey} }})
	e.group("club", 7, "active")
	e.member("club", 1, "member", time.Time{})
	is := &issuer{t: t, tenant: e.Tenant}
	is.use(1, httpapi.Signer{KID: oldKey.KID, Alg: oldKey.Alg, Key: []byte(oldKey.Secret)})
	l := startLoad(t, e.BaseURL, "/v1/topics/club/messages?limit=1", is, 4)
	l.await(t, 200)

	e.Reload(func(c *config.Config) { c.Tenants[0].Keys = []config.TenantKey{oldKey, newKey} })
	l.await(t, 200)
	oldSocket := stMustDial(t, e.Env, "/v1/topics/club/stream", is.current.Load().token)
	oldSocket.must("live")

	is.use(2, httpapi.Signer{KID: newKey.KID, Alg: newKey.Alg, Key: []byte(newKey.Secret)})
	newSocket := stMustDial(t, e.Env, "/v1/topics/club/stream", is.current.Load().token)
	newSocket.must("live")
	l.drained(t, 2)
	oldToken := oldSocketToken(t, e.Tenant, oldKey)

	e.Reload(func(c *config.Config) { c.Tenants[0].Keys = []config.TenantKey{newKey} })
	l.await(t, 200)
	l.halt()
	if n := l.failed.Load(); n != 0 {
		t.Fatalf("%d of %d requests failed during the rotation; the first: %v", n, l.total.Load(), l.firstFailure.Load())
	}
	t.Logf("%d requests during the rotation, none failed", l.total.Load())

	if code, reason := oldSocket.closed(); code != websocket.StatusPolicyViolation || reason != "key removed" {
		t.Fatalf("the old key's socket closed with %d %q, want 1008 key removed", code, reason)
	}
	reloadRefused(t, e, oldToken, "club")
	if code, body := e.Do("POST", "/v1/topics/club/messages", is.current.Load().token, sendBody("after-rotation", "hi")); code != http.StatusCreated {
		t.Fatalf("send with the new key's token: %d %s", code, body)
	}
	if f := newSocket.must("message"); f.Message.ClientMsgID != "after-rotation" {
		t.Fatalf("the new key's socket got %+v, want the message sent after the rotation", f)
	}
}

// oldSocketToken is a fresh token of the removed key, for the refusals.
func oldSocketToken(t *testing.T, tenant string, k config.TenantKey) string {
	t.Helper()
	tok, err := httpapi.SignWith(httpapi.Signer{KID: k.KID, Alg: k.Alg, Key: []byte(k.Secret)}, tenant, 1, "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// jwksServer is a tenant's identity provider publishing RSA public keys.
type jwksServer struct {
	mu   sync.Mutex
	keys map[string]*rsa.PrivateKey
	fail bool
	srv  *httptest.Server
}

func newJWKSServer(t *testing.T) *jwksServer {
	j := &jwksServer{keys: map[string]*rsa.PrivateKey{}}
	j.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		j.mu.Lock()
		defer j.mu.Unlock()
		if j.fail {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		var set jwkset.JWKSMarshal
		for kid, k := range j.keys {
			jwk, err := jwkset.NewJWKFromKey(k.Public(), jwkset.JWKOptions{Metadata: jwkset.JWKMetadataOptions{KID: kid, ALG: jwkset.AlgRS256, USE: jwkset.UseSig}})
			if err != nil {
				t.Error(err)
				return
			}
			set.Keys = append(set.Keys, jwk.Marshal())
		}
		_ = json.NewEncoder(w).Encode(set)
	}))
	t.Cleanup(j.srv.Close)
	return j
}

func (j *jwksServer) set(f func()) {
	j.mu.Lock()
	defer j.mu.Unlock()
	f()
}

// TestJWKSKeysServeAndRotate: a tenant whose users are authenticated by
// their own identity provider — RS256 keys published as a JWKS — is
// served with the provider's tokens, which must carry the issuer the
// tenant requires; a provider that fails keeps the last
// good keys in use; a key the provider drops is refused, and ends the
// socket that authenticated with it (1008 "key removed"), within a
// refresh interval.
func TestJWKSKeysServeAndRotate(t *testing.T) {
	t.Parallel()
	idp := newJWKSServer(t)
	k1, _ := rsa.GenerateKey(rand.Reader, 2048)
	k2, _ := rsa.GenerateKey(rand.Reader, 2048)
	idp.set(func() { idp.keys["idp-1"], idp.keys["idp-2"] = k1, k2 })
	e := stStart(t, harness.Options{Mutate: func(c *config.Config) {
		c.Tenants[0].JWKSURL = idp.srv.URL
		c.Auth.JWKSRefreshInterval = time.Second
	}})
	e.group("club", 7, "active")
	e.member("club", 1, "member", time.Time{})
	// from here on every token of the tenant must carry the provider's iss
	e.Reload(func(c *config.Config) { c.Tenants[0].Issuer = "https://idp.example" })
	token := func(kid string, key *rsa.PrivateKey, iss string) string {
		tok, err := httpapi.SignWith(httpapi.Signer{KID: kid, Alg: config.AlgRS256, Key: key, Issuer: iss}, e.Tenant, 1, "", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	t1, t2 := token("idp-1", k1, "https://idp.example"), token("idp-2", k2, "https://idp.example")
	for name, tok := range map[string]string{"idp-1": t1, "idp-2": t2} {
		if code, body := e.Do("GET", "/v1/topics/club/messages", tok, nil); code != http.StatusOK {
			t.Fatalf("token of the provider's key %s: %d %s", name, code, body)
		}
	}
	reloadRefused(t, e, token("idp-1", k1, "https://other.example"), "club")
	s1 := stMustDial(t, e.Env, "/v1/topics/club/stream", t1)
	s1.must("live")
	s2 := stMustDial(t, e.Env, "/v1/topics/club/stream", t2)
	s2.must("live")

	idp.set(func() { idp.fail = true })
	failures := func() float64 {
		return persistMetric(t, e.Env, "imshard_jwks_fetches_total", `tenant="`+e.Tenant+`"`, `result="error"`)
	}
	deadline := time.Now().Add(20 * time.Second)
	for failures() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("no failed JWKS fetch counted while the provider is down")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, body := e.Do("GET", "/v1/topics/club/messages", t1, nil); code != http.StatusOK {
		t.Fatalf("while the provider is down, a key of its last good JWKS: %d %s", code, body)
	}

	idp.set(func() { idp.fail = false; delete(idp.keys, "idp-1") })
	if code, reason := s1.closed(); code != websocket.StatusPolicyViolation || reason != "key removed" {
		t.Fatalf("the socket of the dropped key closed with %d %q, want 1008 key removed", code, reason)
	}
	reloadRefused(t, e, t1, "club")
	if code, body := e.Do("POST", "/v1/topics/club/messages", t2, sendBody("kept", "hi")); code != http.StatusCreated {
		t.Fatalf("send with the kept key's token: %d %s", code, body)
	}
	if f := s2.must("message"); f.Message.ClientMsgID != "kept" {
		t.Fatalf("the kept key's socket got %+v", f)
	}
}

// `imshard bench rotation` runs end to end — the run without a rotation
// and the one across it — in a tenant of its own that it drops, and
// rejects bad usage with exit 2 (figures are not asserted: they belong to
// docs/performance.md).
func TestRotationBenchCommand(t *testing.T) {
	t.Parallel()
	tenant := testenv.NewTenant(t)
	cfg := tenantConfig(t, tenant, "")
	code, out := runCLI(t, nil, "--config", cfg, "bench", "rotation", "--tenant", tenant, "--rate=200", "--duration=1s", "--concurrency=4")
	for _, want := range []string{"steady    200", "rotation  200", "key bench-new added", "key bench-old removed", "failed requests during the rotation                  0 at"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("bench rotation: exit %d, want %q in\n%s", code, want, out)
		}
	}
	for _, bad := range [][]string{{"--rate=0"}, {"--duration=0s"}, {"--tenant=Bad-Id"}} {
		if code, out := runCLI(t, nil, append([]string{"--config", cfg, "bench", "rotation"}, bad...)...); code != 2 {
			t.Fatalf("bench rotation %v: exit %d, want 2\n%s", bad, code, out)
		}
	}
}
