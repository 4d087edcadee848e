package routing

import (
	"bytes"
	"encoding/hex"
	"math/rand/v2"
	"testing"
	"time"
)

// pinnedRows are month-table rows (LegacyColumns' values as the driver
// returns them) whose canonical hashes archived manifests already hold.
func pinnedRows() [][]any {
	at := time.Date(2026, 11, 3, 4, 5, 6, 789_654_000, time.FixedZone("X", 3600))
	return [][]any{
		{int64(1), []byte("g1"), int64(7), int64(1), int64(42), nil, []byte("text"), []byte("normal"),
			[]byte(`{"text":"bench message 1"}`), nil, nil, int64(0), nil, nil, int64(0), int64(26), int64(0),
			[]byte("pass"), int64(1), nil, nil, nil, nil, at, at},
		{int64(-9), []byte("中文"), int64(0), int64(1 << 40), int64(-1), []byte(""), []byte("image"), []byte("recalled"),
			[]byte(" {\"b\" : [1, 2.50, {\"z\":null,\"a\":\"<&>\"}], \"a\":\"x\\u0041\"} "), []byte(""), []byte("[3, 1]"),
			int64(1), int64(5), int64(2), int64(3), int64(1024), int64(1), []byte("reject"), int64(4), at,
			int64(42), at.Add(time.Hour), at.Add(-time.Microsecond), at, at.Add(time.Second)},
		{int64(3), []byte("t"), int64(3), int64(3), int64(3), "cmid", "text", "normal", `not json`, `{"a":1,"a":2}`,
			"[]", int64(0), nil, nil, int64(0), int64(0), int64(0), "pass", int64(0), nil, nil, nil, nil, at, at},
	}
}

// TestRowSumPinned: the canonical form and its hash do not change (an
// archive's manifest holds the hashes its months were verified with, and
// a restore and the cold reader compare against them).
func TestRowSumPinned(t *testing.T) {
	want := []string{
		"0a677b49ce82b0516f99f7718849507be2725ea4d293574078153355e13f40c4",
		"8c420f20bc39df449cc69cbc5dc1c8bc778d4a3a3996cd445f1d0f964196071d",
		"6d43d956fc1f8aa82fc978e6f01f18507d3c4c0e0e1b296310b552c426287be0",
	}
	var buf bytes.Buffer
	for i, vals := range pinnedRows() {
		sum, err := RowSum(&buf, vals)
		if err != nil {
			t.Fatal(err)
		}
		if got := hex.EncodeToString(sum); got != want[i] {
			t.Errorf("row %d: %s, want %s (canonical %q)", i, got, want[i], buf.String())
		}
	}
}

// TestCanonicalTime: the digits spelled by hand are the layout's, for any
// instant and zone (years outside 0–9999 go through the layout itself).
func TestCanonicalTime(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	times := []time.Time{{}, time.Unix(0, 0), time.Date(9999, 12, 31, 23, 59, 59, 999_999_999, time.UTC),
		time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 12, 31, 23, 30, 0, 999_000, time.FixedZone("E", -3600))}
	for range 10_000 {
		times = append(times, time.Unix(rng.Int64N(400_000_000_000)-62_135_596_800, rng.Int64N(1e9)).In(time.FixedZone("Z", rng.IntN(86400)-43200)))
	}
	for _, at := range times {
		if got, want := appendCanonicalTime(nil, at), at.UTC().Format(canonicalTimeLayout); string(got) != want {
			t.Fatalf("%v: %s, want %s", at, got, want)
		}
	}
}
