package readpath

import (
	"slices"
	"strings"
	"testing"
)

func TestHiddenMerged(t *testing.T) {
	for _, c := range []struct {
		name string
		in   Hidden
		want Hidden
	}{
		{"none", nil, nil},
		{"one", Hidden{{3, 5}}, Hidden{{3, 5}}},
		{"sorted", Hidden{{10, 12}, {1, 2}}, Hidden{{1, 2}, {10, 12}}},
		{"overlapping", Hidden{{1, 5}, {3, 9}}, Hidden{{1, 9}}},
		{"adjacent", Hidden{{1, 5}, {5, 6}}, Hidden{{1, 6}}},
		{"contained", Hidden{{1, 10}, {2, 3}, {4, 5}}, Hidden{{1, 10}}},
		{"repeated", Hidden{{7, 8}, {7, 8}}, Hidden{{7, 8}}},
		{"empty dropped", Hidden{{4, 4}, {6, 5}, {1, 2}}, Hidden{{1, 2}}},
		{"chain", Hidden{{20, 30}, {1, 10}, {9, 21}, {40, 41}}, Hidden{{1, 30}, {40, 41}}},
	} {
		got := c.in.Merged()
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
		for s := int64(0); s < 50; s++ {
			if got.Hides(s) != c.in.Hides(s) {
				t.Errorf("%s: merging changed what seq %d shows", c.name, s)
			}
		}
	}
}

func TestHiddenEncoding(t *testing.T) {
	for _, h := range []Hidden{{}, {{1, 2}}, {{1, 5}, {9, 10}, {9223372036854775806, 9223372036854775807}}} {
		s := EncodeHidden(h)
		back, err := DecodeHidden(s)
		if err != nil || !slices.Equal(back, h) {
			t.Errorf("%v → %q → %v, %v", h, s, back, err)
		}
	}
	if EncodeHidden(Hidden{{4, 7}, {9, 10}}) != "4-7,9-10" {
		t.Error("encoding changed: cached entries of running services would no longer decode")
	}
	for _, bad := range []string{"x", "1", "1-", "-1-2", "0-1", "5-5", "6-5", "1-2,", ",1-2", "1-2;3-4", "1-2, 3-4",
		"1-99999999999999999999", strings.Repeat("1-2,", hiddenCap) + "1-2"} {
		if _, err := DecodeHidden(bad); err == nil {
			t.Errorf("%q decoded", bad)
		}
	}
}

// FuzzDecodeHidden: a cache entry either decodes to ranges that encode
// back to it, or is an error; nothing panics.
func FuzzDecodeHidden(f *testing.F) {
	for _, s := range []string{"", "1-2", "4-7,9-10", "*", "1-2,3", "0-0", "-"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		h, err := DecodeHidden(s)
		if err != nil {
			return
		}
		for _, r := range h {
			if r[0] < 1 || r[1] <= r[0] {
				t.Fatalf("%q decoded to the empty range %v", s, r)
			}
		}
		if back, err := DecodeHidden(EncodeHidden(h)); err != nil || !slices.Equal(back, h) {
			t.Fatalf("%q: round trip %v %v", s, back, err)
		}
	})
}
