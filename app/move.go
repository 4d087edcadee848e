package app

import "github.com/imshard/imshard/modules/placement"

// PlacementStore is the placement records' store (a move writes them).
func (a *App) PlacementStore() *placement.Store { return a.clients.placed }
