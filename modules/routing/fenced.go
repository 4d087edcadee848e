package routing

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/redis/rueidis"

	"github.com/imshard/imshard/lua"
)

// FencedLib runs the fenced library (lua/fenced.lua) with FCALL. The
// library's name and function names carry a hash of its text, so processes
// of two versions can run side by side during a deploy, each with its own
// code; a server that lacks the library (new, restarted without persistence,
// failed over to a fresh node) gets it loaded on the first "not found", on
// every node, then the call is retried.
type FencedLib struct {
	code      string
	alloc     string
	seed      string
	extend    string
	idemSince string
	send      string
	sent      string
	gateGet   string
	gateSet   string
}

func newFencedLib() *FencedLib {
	sum := sha1.Sum([]byte(lua.Fenced))
	v := hex.EncodeToString(sum[:6])
	return &FencedLib{
		code:      strings.ReplaceAll(lua.Fenced, "{{version}}", v),
		alloc:     "imshard_alloc_" + v,
		seed:      "imshard_seed_" + v,
		extend:    "imshard_extend_" + v,
		idemSince: "imshard_idem_since_" + v,
		send:      "imshard_send_" + v,
		sent:      "imshard_sent_" + v,
		gateGet:   "imshard_gate_get_" + v,
		gateSet:   "imshard_gate_set_" + v,
	}
}

// Alloc, Seed, Extend and IdemSince call the library's functions
// (see lua/fenced.lua for keys, arguments and replies).
func (l *FencedLib) Alloc(ctx context.Context, rdb rueidis.Client, keys, args []string) rueidis.RedisResult {
	return l.call(ctx, rdb, l.alloc, keys, args)
}

func (l *FencedLib) Seed(ctx context.Context, rdb rueidis.Client, keys, args []string) rueidis.RedisResult {
	return l.call(ctx, rdb, l.seed, keys, args)
}

func (l *FencedLib) Extend(ctx context.Context, rdb rueidis.Client, keys, args []string) rueidis.RedisResult {
	return l.call(ctx, rdb, l.extend, keys, args)
}

func (l *FencedLib) IdemSince(ctx context.Context, rdb rueidis.Client, keys, args []string) rueidis.RedisResult {
	return l.call(ctx, rdb, l.idemSince, keys, args)
}

// Send is the one call of a send before its produce (claim, membership,
// allocation, stored event).
func (l *FencedLib) Send(ctx context.Context, rdb rueidis.Client, keys, args []string) rueidis.RedisResult {
	return l.call(ctx, rdb, l.send, keys, args)
}

// Sent is the one call after a send's broker ack (record acked, pending
// entry, hot cache, realtime publish).
func (l *FencedLib) Sent(ctx context.Context, rdb rueidis.Client, keys, args []string) rueidis.RedisResult {
	return l.call(ctx, rdb, l.sent, keys, args)
}

// GateGet and GateSet read and replace a tenant's migration gate
// (ConvergeMigrationGate).
func (l *FencedLib) GateGet(ctx context.Context, rdb rueidis.Client, keys []string) rueidis.RedisResult {
	return l.call(ctx, rdb, l.gateGet, keys, nil)
}

func (l *FencedLib) GateSet(ctx context.Context, rdb rueidis.Client, keys, args []string) rueidis.RedisResult {
	return l.call(ctx, rdb, l.gateSet, keys, args)
}

func notFound(res rueidis.RedisResult) bool {
	err, ok := rueidis.IsRedisErr(res.Error())
	return ok && strings.Contains(err.Error(), "Function not found")
}

func (l *FencedLib) call(ctx context.Context, rdb rueidis.Client, fn string, keys, args []string) rueidis.RedisResult {
	cmd := func() rueidis.Completed {
		return rdb.B().Fcall().Function(fn).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
	}
	res := rdb.Do(ctx, cmd())
	if !notFound(res) {
		return res
	}
	if err := l.Load(ctx, rdb); err != nil {
		return res
	}
	return rdb.Do(ctx, cmd())
}

// Load puts the library on every node the client knows; a node that has it
// already keeps it (no REPLACE: replacing would not change the code, and it
// would reset nothing worth resetting).
func (l *FencedLib) Load(ctx context.Context, rdb rueidis.Client) error {
	for addr, node := range rdb.Nodes() {
		err := node.Do(ctx, node.B().FunctionLoad().FunctionCode(l.code).Build()).Error()
		if err != nil && !strings.Contains(err.Error(), "already exists") {
			return fmt.Errorf("load seq library on %s: %w", addr, err)
		}
	}
	return nil
}
