package test

import (
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/imshard/imshard/test/harness"
)

// TestOpenAPIMatchesRouter holds docs/openapi.yaml and the routes a
// process of every role registers to the same list, both ways: every
// served route is documented and every documented route is served, on the
// server the document places it (the API server, or the operations server
// for paths that name their own servers). The end-to-end tests check the
// answers themselves through harness.Env.Do.
func TestOpenAPIMatchesRouter(t *testing.T) {
	doc, err := harness.LoadOpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	env := harness.Start(t, harness.Options{})
	var api, ops []string
	for _, op := range doc.Operations() {
		if op.Ops {
			ops = append(ops, op.Pattern)
		} else {
			api = append(api, op.Pattern)
		}
	}
	openapiCompare(t, "API server (http.addr)", env.App.APIRoutes(), api)
	openapiCompare(t, "operations server (metrics.addr)", env.App.OpsRoutes(), ops)
}

// openapiCompare reports every pattern served but not documented and every
// one documented but not served, naming what to add where.
func openapiCompare(t *testing.T, server string, served, documented []string) {
	t.Helper()
	if len(served) == 0 {
		t.Fatalf("%s: no route registered; the comparison would prove nothing", server)
	}
	for _, p := range served {
		if !slices.Contains(documented, p) {
			method, path, _ := strings.Cut(p, " ")
			t.Errorf("%s serves %q, which docs/openapi.yaml does not describe: add operation %q under paths: %q (with its parameters, request body and every response it can answer)",
				server, p, strings.ToLower(method), path)
		}
	}
	for _, p := range documented {
		if !slices.Contains(served, p) {
			t.Errorf("docs/openapi.yaml describes %q on the %s, which no role registers: remove it or register its handler", p, server)
		}
	}
}

// TestOpenAPIRejectsDepartures shows that the check the end-to-end tests
// rely on fails for answers the document does not describe: an unknown
// field, a missing field, an undocumented status, an operation that is not
// documented at all, and a request the server accepted that the document
// calls invalid.
func TestOpenAPIRejectsDepartures(t *testing.T) {
	doc, err := harness.LoadOpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	json := http.Header{"Content-Type": {"application/json"}}
	get := func(path string) *http.Request {
		r, err := http.NewRequest("GET", "http://127.0.0.1:8080"+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	shards := `{"active_month":"202611","routes_complete":"","shards":[]}`
	if err := doc.Check(get("/v1/admin/shards"), nil, 200, json, []byte(shards)); err != nil {
		t.Fatalf("a documented answer was rejected: %v", err)
	}
	envelope := `{"error":{"code":"permission_denied","message":"admin role required","details":{"x":1}}}`
	if err := doc.Check(get("/v1/admin/shards"), nil, 403, json, []byte(envelope)); err != nil {
		t.Fatalf("a documented error was rejected: %v", err)
	}
	for _, c := range []struct {
		name   string
		req    *http.Request
		body   []byte
		status int
		resp   string
	}{
		{"unknown field", get("/v1/admin/shards"), nil, 200, `{"active_month":"202611","routes_complete":"","shards":[],"extra":1}`},
		{"missing field", get("/v1/admin/shards"), nil, 200, `{"active_month":"202611","shards":[]}`},
		{"undocumented status", get("/v1/admin/shards"), nil, 418, envelope},
		{"error outside the envelope", get("/v1/admin/shards"), nil, 403, `{"code":"permission_denied"}`},
		{"unknown error code", get("/v1/admin/shards"), nil, 403, `{"error":{"code":"nope","message":"m"}}`},
		{"undocumented operation", get("/v1/nowhere"), nil, 200, `{}`},
		{"accepted but invalid request", get("/v1/topics/t/messages?limit=500"), nil, 200, `{"messages":[],"next_before":null,"has_more":false}`},
	} {
		if err := doc.Check(c.req, c.body, c.status, json, []byte(c.resp)); err == nil {
			t.Errorf("%s: the check passed %d %s", c.name, c.status, c.resp)
		} else {
			t.Logf("%s: %v", c.name, err)
		}
	}
}

// TestOpsEndpointsMatchOpenAPI: the operations server's real answers are
// the ones docs/openapi.yaml describes (the API's are checked by every
// end-to-end test through harness.Env.Do).
func TestOpsEndpointsMatchOpenAPI(t *testing.T) {
	env := harness.Start(t, harness.Options{Roles: []string{"query"}})
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		req, err := http.NewRequest("GET", env.OpsURL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: %d %s", path, resp.StatusCode, body)
		}
		harness.CheckExchange(t, req, nil, resp, body)
	}
}
