package app

import "github.com/imshard/imshard/modules/archive"

// NewArchiver builds the month archiver from the shared clients (`imshard
// shard archive`).
func (a *App) NewArchiver() *archive.Archiver {
	c := &a.clients
	return archive.New(archive.Params{
		Config:         archive.Config{URL: a.Config.Archive.URL, RowsPerSecond: a.Config.Archive.RowsPerSecond},
		DBs:            c.pools,
		Catalog:        c.catalog,
		Redis:          c.redis,
		KeySpace:       c.keys,
		ProduceTimeout: a.Config.Send.ProduceTimeout,
		Log:            a.Log.With().Str("module", "archive").Logger(),
		Registerer:     a.Registry,
	})
}
