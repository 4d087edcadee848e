package httpapi

import (
	"net/http"
	"slices"
	"sync"
)

// Mux is an http.ServeMux that remembers the patterns registered on it, so
// the routes a process serves can be listed (the test that compares them
// with docs/openapi.yaml reads them from here).
type Mux struct {
	mux      http.ServeMux
	mu       sync.Mutex
	patterns []string
}

// NewMux returns an empty Mux.
func NewMux() *Mux { return &Mux{} }

// Handle registers h for pattern ("METHOD /path/{param}", as http.ServeMux).
func (m *Mux) Handle(pattern string, h http.Handler) {
	m.mux.Handle(pattern, h)
	m.mu.Lock()
	m.patterns = append(m.patterns, pattern)
	m.mu.Unlock()
}

// HandleFunc registers fn for pattern.
func (m *Mux) HandleFunc(pattern string, fn func(http.ResponseWriter, *http.Request)) {
	m.Handle(pattern, http.HandlerFunc(fn))
}

// ServeHTTP dispatches r to the handler of the most specific pattern.
func (m *Mux) ServeHTTP(w http.ResponseWriter, r *http.Request) { m.mux.ServeHTTP(w, r) }

// Patterns lists the registered patterns, sorted.
func (m *Mux) Patterns() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := slices.Clone(m.patterns)
	slices.Sort(out)
	return out
}
