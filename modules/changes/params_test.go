package changes

import (
	"net/url"
	"strings"
	"testing"

	"github.com/imshard/imshard/modules/httpapi"
)

func TestDecodeChangeBodies(t *testing.T) {
	for body, want := range map[string]string{"": "", "  ": "", `{}`: "", `{"reason":"spam"}`: "spam"} {
		if got, err := DecodeRecall(strings.NewReader(body)); err != nil || got != want {
			t.Fatalf("recall body %q: %q %v", body, got, err)
		}
	}
	for _, body := range []string{`{"reason":1}`, `{"why":"x"}`, `[]`, `{"reason":"` + strings.Repeat("é", 256) + `"}`, `{}{}`} {
		if _, err := DecodeRecall(strings.NewReader(body)); !httpapi.HasCode(err, httpapi.CodeInvalidArgument) {
			t.Fatalf("recall body %q: %v, want invalid_argument", body, err)
		}
	}
	req, err := DecodeEdit(strings.NewReader(`{"content":{"text":"x"},"expected_version":3}`))
	if err != nil || *req.ExpectedVersion != 3 || req.Head != nil || req.FromUser != nil {
		t.Fatalf("edit without head: %+v %v", req, err)
	}
	if req, err = DecodeEdit(strings.NewReader(`{"content":{},"head":null,"expected_version":1,"from_user":"7"}`)); err != nil ||
		string(req.Head) != "null" || *req.FromUser != 7 {
		t.Fatalf("edit clearing the head for a member: %+v %v", req, err)
	}
	for _, body := range []string{
		`{"content":{}}`, `{"content":{},"expected_version":0}`, `{"expected_version":1}`, `{"content":[],"expected_version":1}`,
		`{"content":{},"head":"x","expected_version":1}`, `{"content":{},"expected_version":1,"from_user":0}`,
		`{"content":{},"expected_version":1,"mention_all":true}`, `{"content":{"a":1,"a":2},"expected_version":1}`,
	} {
		if _, err := DecodeEdit(strings.NewReader(body)); !httpapi.HasCode(err, httpapi.CodeInvalidArgument) {
			t.Fatalf("edit body %s: %v, want invalid_argument", body, err)
		}
	}
	if _, err := ParseReason(url.Values{"reason": {"a", "b"}}); !httpapi.HasCode(err, httpapi.CodeInvalidArgument) {
		t.Fatal("a repeated reason")
	}
}

// FuzzDecodeDeletion: a body either is a 4xx API error or a valid range.
func FuzzDecodeDeletion(f *testing.F) {
	for _, s := range []string{`{"low":1,"hi":2}`, `{"low":0,"hi":2}`, `{"hi":2}`, `{"low":1,"hi":2}x`, `[]`, `null`, `{"low":1e3,"hi":2e3}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := DecodeDeletion(strings.NewReader(s))
		if err != nil {
			if !httpapi.HasCode(err, httpapi.CodeInvalidArgument) {
				t.Fatalf("%q: non-API error %v", s, err)
			}
			return
		}
		if r.Low < 1 || r.Hi <= r.Low {
			t.Fatalf("%q accepted as %+v", s, r)
		}
	})
}
