package routing

import (
	"github.com/redis/rueidis"

	"github.com/imshard/imshard/lua"
)

// Scripts are the embedded Lua scripts, run with EVALSHA; rueidis falls back
// to EVAL (which loads the script) when a server answers NOSCRIPT, e.g. after
// a restart or a failover. Fenced is the one Function library (FCALL,
// loaded on "not found"), for the operations fenced by the server
// incarnation.
type Scripts struct {
	Fenced       *FencedLib
	Activate     *rueidis.Lua
	CacheFill    *rueidis.Lua
	Unlock       *rueidis.Lua
	Refresh      *rueidis.Lua
	PendingAck   *rueidis.Lua
	RouteMerge   *rueidis.Lua
	RouteReplace *rueidis.Lua
	IdemDone     *rueidis.Lua
	IdemEvent    *rueidis.Lua
	IdemAck      *rueidis.Lua
	IdemFail     *rueidis.Lua
	IdemRelease  *rueidis.Lua
	IdemRetry    *rueidis.Lua
}

// NewScripts prepares every script once per process.
func NewScripts() *Scripts {
	return &Scripts{
		Fenced:       newFencedLib(),
		Activate:     rueidis.NewLuaScript(lua.Activate),
		CacheFill:    rueidis.NewLuaScript(lua.CacheFill),
		Unlock:       rueidis.NewLuaScript(lua.Unlock),
		Refresh:      rueidis.NewLuaScript(lua.Refresh),
		PendingAck:   rueidis.NewLuaScript(lua.PendingAck),
		RouteMerge:   rueidis.NewLuaScript(lua.RouteMerge),
		RouteReplace: rueidis.NewLuaScript(lua.RouteReplace),
		IdemDone:     rueidis.NewLuaScript(lua.IdemDone),
		IdemEvent:    rueidis.NewLuaScript(lua.IdemEvent),
		IdemAck:      rueidis.NewLuaScript(lua.IdemAck),
		IdemFail:     rueidis.NewLuaScript(lua.IdemFail),
		IdemRelease:  rueidis.NewLuaScript(lua.IdemRelease),
		IdemRetry:    rueidis.NewLuaScript(lua.IdemRetry),
	}
}
