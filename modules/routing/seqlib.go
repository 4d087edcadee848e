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

// SeqLib runs the seq allocator library (lua/seq.lua) with FCALL. The
// library's name and function names carry a hash of its text, so processes
// of two versions can run side by side during a deploy, each with its own
// code; a server that lacks the library (new, restarted without persistence,
// failed over to a fresh node) gets it loaded on the first "not found", on
// every node, then the call is retried.
type SeqLib struct {
	code    string
	alloc   string
	seed    string
	extend  string
	version string
}

func newSeqLib() *SeqLib {
	sum := sha1.Sum([]byte(lua.Seq))
	v := hex.EncodeToString(sum[:6])
	return &SeqLib{
		code:    strings.ReplaceAll(lua.Seq, "{{version}}", v),
		alloc:   "imshard_alloc_" + v,
		seed:    "imshard_seed_" + v,
		extend:  "imshard_extend_" + v,
		version: v,
	}
}

// Alloc, Seed and Extend call the library's functions (see lua/seq.lua for
// keys, arguments and replies).
func (l *SeqLib) Alloc(ctx context.Context, rdb rueidis.Client, keys, args []string) rueidis.RedisResult {
	return l.call(ctx, rdb, l.alloc, keys, args)
}

func (l *SeqLib) Seed(ctx context.Context, rdb rueidis.Client, keys, args []string) rueidis.RedisResult {
	return l.call(ctx, rdb, l.seed, keys, args)
}

func (l *SeqLib) Extend(ctx context.Context, rdb rueidis.Client, keys, args []string) rueidis.RedisResult {
	return l.call(ctx, rdb, l.extend, keys, args)
}

func (l *SeqLib) call(ctx context.Context, rdb rueidis.Client, fn string, keys, args []string) rueidis.RedisResult {
	cmd := func() rueidis.Completed {
		return rdb.B().Fcall().Function(fn).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
	}
	res := rdb.Do(ctx, cmd())
	if err, ok := rueidis.IsRedisErr(res.Error()); !ok || !strings.Contains(err.Error(), "Function not found") {
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
func (l *SeqLib) Load(ctx context.Context, rdb rueidis.Client) error {
	for addr, node := range rdb.Nodes() {
		err := node.Do(ctx, node.B().FunctionLoad().FunctionCode(l.code).Build()).Error()
		if err != nil && !strings.Contains(err.Error(), "already exists") {
			return fmt.Errorf("load seq library on %s: %w", addr, err)
		}
	}
	return nil
}
