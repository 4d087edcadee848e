package httpapi

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/imshard/imshard/modules/tenantdb"
)

func TestWriteErrorDetails(t *testing.T) {
	cases := []struct {
		name    string
		err     error
		status  int
		details string
	}{
		{"no details", Errorf(CodeNotFound, "no such message"), 404, ""},
		{"details", Errorf(CodeConflict, "stale version").WithDetails(map[string]any{"current_version": 3}), 409, `{"current_version":3}`},
		{"tenant removed by a reload mid-request", fmt.Errorf("acl: group: %w", fmt.Errorf("%w: %q", tenantdb.ErrUnknownTenant, "gone")), 401, ""},
		{"wrapped keeps details", fmt.Errorf("edit: %w", Errorf(CodeUnavailable, "retry").WithDetails(map[string]any{"retry_after_ms": 250})), 503, `{"retry_after_ms":250}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			WriteError(rec, httptest.NewRequest("GET", "/x", nil), zerologNop(), c.err)
			if rec.Code != c.status {
				t.Fatalf("status %d, want %d", rec.Code, c.status)
			}
			var env struct {
				Error map[string]json.RawMessage `json:"error"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &env); err != nil {
				t.Fatal(err)
			}
			got, ok := env.Error["details"]
			if c.details == "" {
				if ok {
					t.Fatalf("details %s present, want absent", got)
				}
				return
			}
			if string(got) != c.details {
				t.Fatalf("details %s, want %s", got, c.details)
			}
		})
	}
}
