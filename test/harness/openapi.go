package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
)

// OpenAPI is docs/openapi.yaml, loaded and validated, able to tell whether
// a real exchange with the service is one the document describes.
type OpenAPI struct {
	Doc *openapi3.T
	// mux resolves a request to its documented operation with the same
	// pattern rules as the server's own mux: one pattern per operation.
	mux *http.ServeMux
}

var (
	openAPIOnce sync.Once
	openAPI     *OpenAPI
	openAPIErr  error
)

// OpenAPIPath is where the document lives.
func OpenAPIPath() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "docs", "openapi.yaml")
}

// LoadOpenAPI reads and validates the document once per test binary.
func LoadOpenAPI() (*OpenAPI, error) {
	openAPIOnce.Do(func() { openAPI, openAPIErr = loadOpenAPI(OpenAPIPath()) })
	return openAPI, openAPIErr
}

func loadOpenAPI(path string) (*OpenAPI, error) {
	doc, err := openapi3.NewLoader().LoadFromFile(path)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", path, err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("%s is not a valid OpenAPI document: %w", path, err)
	}
	o := &OpenAPI{Doc: doc, mux: http.NewServeMux()}
	for _, op := range o.Operations() {
		o.mux.Handle(op.Pattern, http.NotFoundHandler())
	}
	return o, nil
}

// Operation is one documented method + path.
type Operation struct {
	Pattern string // "METHOD /path/{param}", as the server registers it
	Method  string
	Path    string
	// Ops is true for the operations server (metrics.addr): the path item
	// names its own servers. Everything else is on the API server.
	Ops bool
}

// Operations lists every documented operation, sorted by pattern.
func (o *OpenAPI) Operations() []Operation {
	var out []Operation
	for path, item := range o.Doc.Paths.Map() {
		for method := range item.Operations() {
			out = append(out, Operation{Pattern: method + " " + path, Method: method, Path: path, Ops: len(item.Servers) > 0})
		}
	}
	slices.SortFunc(out, func(a, b Operation) int { return strings.Compare(a.Pattern, b.Pattern) })
	return out
}

// route resolves req to its documented operation (nil when none).
func (o *OpenAPI) route(req *http.Request) *routers.Route {
	_, pattern := o.mux.Handler(req)
	method, path, ok := strings.Cut(pattern, " ")
	if !ok {
		return nil
	}
	item := o.Doc.Paths.Value(path)
	return &routers.Route{Spec: o.Doc, Path: path, PathItem: item, Method: method, Operation: item.GetOperation(method)}
}

// CheckExchange fails t, without stopping it (any goroutine may call it),
// when an exchange with the service departs from docs/openapi.yaml.
func CheckExchange(t testing.TB, req *http.Request, reqBody []byte, resp *http.Response, respBody []byte) {
	doc, err := LoadOpenAPI()
	if err == nil {
		err = doc.Check(req, reqBody, resp.StatusCode, resp.Header, respBody)
	}
	if err != nil {
		t.Errorf("the exchange departs from docs/openapi.yaml: %v", err)
	}
}

// Check reports how an exchange departs from the document: a request to
// an undocumented operation (unless the server did not serve it either),
// an answer whose status or body the operation does not describe, or a
// request the server accepted (2xx) that the document calls invalid.
// reqBody and respBody are the bodies as sent and received.
func (o *OpenAPI) Check(req *http.Request, reqBody []byte, status int, header http.Header, respBody []byte) error {
	route := o.route(req)
	if route == nil {
		if status == http.StatusNotFound || status == http.StatusMethodNotAllowed {
			return nil // not served either: the route test keeps the two in step
		}
		return fmt.Errorf("%s %s answered %d but docs/openapi.yaml has no operation for it", req.Method, req.URL.Path, status)
	}
	opts := &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true,
		AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}
	in := &openapi3filter.RequestValidationInput{Request: req, Route: route, Options: opts,
		PathParams: pathParams(route.Path, req.URL.Path)}
	var errs []error
	if status >= 200 && status < 300 {
		r := req.Clone(req.Context())
		r.Body = io.NopCloser(bytes.NewReader(reqBody))
		in.Request = r
		if err := openapi3filter.ValidateRequest(req.Context(), in); err != nil {
			errs = append(errs, fmt.Errorf("the server accepted a request the document calls invalid: %w", err))
		}
		in.Request = req
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: status, Header: header, Options: opts}
	out.SetBodyBytes(respBody)
	if err := openapi3filter.ValidateResponse(req.Context(), out); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		shown := respBody
		if len(shown) > 600 {
			shown = append(shown[:600:600], "…"...)
		}
		return fmt.Errorf("%s %s (operation %s %s in docs/openapi.yaml) answered %d %s: %w",
			req.Method, req.URL.RequestURI(), route.Method, route.Path, status, shown, err)
	}
	return nil
}

// pathParams pairs the {name} segments of a documented path with the
// request path's segments (the patterns have whole-segment parameters).
func pathParams(template, path string) map[string]string {
	ts, ps := strings.Split(template, "/"), strings.Split(path, "/")
	out := map[string]string{}
	for i, t := range ts {
		if i < len(ps) && strings.HasPrefix(t, "{") && strings.HasSuffix(t, "}") {
			out[t[1:len(t)-1]] = ps[i]
		}
	}
	return out
}
