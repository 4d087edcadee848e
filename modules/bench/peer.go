package bench

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"time"
)

// peerLine is what a peer prints for its measured run:
// "minimal HTTP send: N ok, F failed, R/s, p50 D, p99 D".
var peerLine = regexp.MustCompile(`(\d+) ok, (\d+) failed, ([0-9.]+)/s, p50 ([0-9.a-zµ]+), p99 ([0-9.a-zµ]+)`)

// ParsePeerLine reads a peer's figures from its output.
func ParsePeerLine(out []byte) (RoundResult, error) {
	m := peerLine.FindSubmatch(out)
	if m == nil {
		return RoundResult{}, fmt.Errorf("bench: the peer printed no line like \"N ok, F failed, R/s, p50 D, p99 D\": %q", tail(out))
	}
	res := RoundResult{Side: SidePeer}
	var errs [5]error
	res.Sends, errs[0] = strconv.ParseInt(string(m[1]), 10, 64)
	res.Errors, errs[1] = strconv.ParseInt(string(m[2]), 10, 64)
	res.Rate, errs[2] = strconv.ParseFloat(string(m[3]), 64)
	res.P50, errs[3] = time.ParseDuration(string(m[4]))
	res.P99, errs[4] = time.ParseDuration(string(m[5]))
	for _, err := range errs {
		if err != nil {
			return RoundResult{}, fmt.Errorf("bench: peer line %q: %w", m[0], err)
		}
	}
	if res.Rate <= 0 || res.Sends <= 0 {
		return RoundResult{}, fmt.Errorf("bench: the peer sent nothing: %q", m[0])
	}
	res.Elapsed = time.Duration(float64(res.Sends) / res.Rate * float64(time.Second))
	return res, nil
}

func tail(b []byte) []byte {
	b = bytes.TrimSpace(b)
	if len(b) > 400 {
		b = b[len(b)-400:]
	}
	return b
}

// peerRound runs the peer command once (it measures itself) with the Redis
// command time around it. Its process is not this one: no allocations or
// RSS, and its warm-up falls into the Redis CPU, so only the command µs
// per send (per-call averages) is reported for it.
func (b *sendBench) peerRound(ctx context.Context) (RoundResult, error) {
	before, err := readRedisStats(ctx, b.p.Redis)
	if err != nil {
		return RoundResult{}, err
	}
	cmd := exec.CommandContext(ctx, "sh", "-c", b.p.Peer)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return RoundResult{}, fmt.Errorf("bench: peer %q: %w: %s", b.p.Peer, err, tail(out.Bytes()))
	}
	res, err := ParsePeerLine(out.Bytes())
	if err != nil {
		return res, err
	}
	after, err := readRedisStats(ctx, b.p.Redis)
	if err != nil {
		return res, err
	}
	res.RedisUS, _ = after.perSend(before, topLevel[SidePeer], res.Sends)
	return res, nil
}
