package routing

import (
	"context"
	"crypto/sha1"
	"encoding/hex"

	"github.com/redis/rueidis"

	"github.com/imshard/imshard/lua"
)

// Scripts are the embedded Lua scripts, run with EVALSHA; rueidis falls back
// to EVAL (which loads the script) when a server answers NOSCRIPT, e.g. after
// a restart or a failover. Fenced is the one Function library (FCALL,
// loaded on "not found"), for the operations fenced by the server
// incarnation.
type Scripts struct {
	Fenced         *FencedLib
	Activate       *rueidis.Lua
	CacheFill      *rueidis.Lua
	Unlock         *rueidis.Lua
	Refresh        *rueidis.Lua
	PendingAck     *rueidis.Lua
	PendingAbandon *rueidis.Lua
	PersistClaim   *rueidis.Lua
	Persisted      *rueidis.Lua
	RouteReplace   *rueidis.Lua
	IdemAck        *rueidis.Lua
	IdemFail       *rueidis.Lua
	IdemRelease    *rueidis.Lua
	IdemRetry      *rueidis.Lua
	FenceLift      *rueidis.Lua
	CursorFill     *rueidis.Lua
	// CursorPut, VersionBump, MsgChange, HotPut and FloorRaise run inside
	// a pipeline of other commands (a batch of changes tells every topic's
	// caches in one round trip)
	CursorPut   *Pipelined
	VersionBump *Pipelined
	MsgChange   *Pipelined
	HotPut      *Pipelined
	FloorRaise  *Pipelined
}

// NewScripts prepares every script once per process.
func NewScripts() *Scripts {
	return &Scripts{
		Fenced:         newFencedLib(),
		Activate:       rueidis.NewLuaScript(lua.Activate),
		CacheFill:      rueidis.NewLuaScript(lua.CacheFill),
		Unlock:         rueidis.NewLuaScript(lua.Unlock),
		Refresh:        rueidis.NewLuaScript(lua.Refresh),
		PendingAck:     rueidis.NewLuaScript(lua.PendingAck),
		PendingAbandon: rueidis.NewLuaScript(lua.PendingAbandon),
		PersistClaim:   rueidis.NewLuaScript(lua.PersistClaim),
		Persisted:      rueidis.NewLuaScript(lua.Persisted),
		RouteReplace:   rueidis.NewLuaScript(lua.RouteReplace),
		IdemAck:        rueidis.NewLuaScript(lua.IdemAck),
		IdemFail:       rueidis.NewLuaScript(lua.IdemFail),
		IdemRelease:    rueidis.NewLuaScript(lua.IdemRelease),
		IdemRetry:      rueidis.NewLuaScript(lua.IdemRetry),
		FenceLift:      rueidis.NewLuaScript(lua.FenceLift),
		CursorFill:     rueidis.NewLuaScript(lua.CursorFill),
		CursorPut:      NewPipelined(lua.CursorPut),
		VersionBump:    NewPipelined(lua.VersionBump),
		MsgChange:      NewPipelined(lua.MsgChange),
		HotPut:         NewPipelined(lua.HotPut),
		FloorRaise:     NewPipelined(lua.FloorRaise),
	}
}

// CacheVersion reads the version counter of a read-through cache (ACL,
// deletion ranges) after a miss and before the source is read: a fill
// (CacheFill) carrying it is refused once a change bumped it, so a lookup
// that raced a change never puts the old answer back. A hit needs no
// version, so lookups read it only here; an error means: do not fill.
func CacheVersion(ctx context.Context, rdb rueidis.Client, key string) (version string, err error) {
	version, err = rdb.Do(ctx, rdb.B().Get().Key(key).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return "", nil
	}
	return version, err
}

// Pipelined is a script sent within a pipeline of other commands (so a
// request keeps to one round trip): EVALSHA, and only when the server
// answers NOSCRIPT (restarted, failed over) once more as EVAL, which loads
// it.
type Pipelined struct {
	src, sha string
}

// NewPipelined prepares a script for Cmd.
func NewPipelined(src string) *Pipelined {
	sum := sha1.Sum([]byte(src))
	return &Pipelined{src: src, sha: hex.EncodeToString(sum[:])}
}

// Cmd is the EVALSHA of the script with keys and args.
func (p *Pipelined) Cmd(rdb rueidis.Client, keys, args []string) rueidis.Completed {
	return rdb.B().Evalsha().Sha1(p.sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
}

// Result is res, Cmd's result, or on NOSCRIPT the script's result run as
// EVAL now.
func (p *Pipelined) Result(ctx context.Context, rdb rueidis.Client, res rueidis.RedisResult, keys, args []string) rueidis.RedisResult {
	if err, ok := rueidis.IsRedisErr(res.Error()); ok && err.IsNoScript() {
		return rdb.Do(ctx, rdb.B().Eval().Script(p.src).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	}
	return res
}

// Exec runs the script alone: one round trip, and a second only on
// NOSCRIPT.
func (p *Pipelined) Exec(ctx context.Context, rdb rueidis.Client, keys, args []string) rueidis.RedisResult {
	return p.Result(ctx, rdb, rdb.Do(ctx, p.Cmd(rdb, keys, args)), keys, args)
}
