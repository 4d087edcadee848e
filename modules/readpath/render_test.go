package readpath

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
)

// The list endpoint's hand-rendered pages are the bytes the generic
// encoder writes.
func TestPagesRenderAsWriteJSON(t *testing.T) {
	full := msgs(3, 2, 1)
	full[0].Content, full[1].Topic = json.RawMessage(`{"text":"<hi>"}`), "t\"1"
	for i := range full {
		full[i] = full[i].Normalized()
	}
	next := int64(1)
	cases := map[string]interface{ AppendJSON([]byte) ([]byte, error) }{
		"before, empty":       BeforePage{Messages: NonNil(nil)},
		"before, full":        BeforePage{Messages: full, NextBefore: &next, HasMore: true},
		"since, empty, nil":   SincePage{Messages: NonNil(nil), NextSince: 4},
		"since, gaps":         SincePage{Messages: full, NextSince: 3, HasMore: true, Gaps: []int64{5, 9}},
		"since, no gaps":      SincePage{Messages: full[:1], NextSince: 3, Gaps: nonNilSeqs(nil)},
		"before, nil message": BeforePage{Messages: []message.Message{{}}},
	}
	for name, page := range cases {
		t.Run(name, func(t *testing.T) {
			want, got := httptest.NewRecorder(), httptest.NewRecorder()
			httpapi.WriteJSON(want, 200, page)
			if err := WritePage(got, page.AppendJSON); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Body.Bytes(), want.Body.Bytes()) || got.Header().Get("Content-Type") != want.Header().Get("Content-Type") || got.Code != want.Code {
				t.Fatalf("got  %d %s\nwant %d %s", got.Code, got.Body, want.Code, want.Body)
			}
		})
	}
}
