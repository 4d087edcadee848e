package app

import "github.com/imshard/imshard/modules/archive"

// NewArchiver builds the month archiver from the shared clients, once
// (`imshard shard archive` and the shard manager's patrol).
func (a *App) NewArchiver() *archive.Archiver {
	c := &a.clients
	if c.archiver != nil {
		return c.archiver
	}
	c.archiver = archive.New(archive.Params{
		Config: archive.Config{URL: a.Config.Archive.URL, RowsPerSecond: a.Config.Archive.RowsPerSecond,
			SortDir: a.Config.Archive.SortDir, SortBytes: a.Config.Archive.SortBytes, KeepTable: a.Config.Archive.KeepTable,
			IdempotencyTTL: a.Config.Send.IdempotencyTTL},
		DBs:            c.pools,
		Catalog:        c.catalog,
		Redis:          c.redis,
		KeySpace:       c.keys,
		ProduceTimeout: a.Config.Send.ProduceTimeout,
		AfterMonths:    a.tenants.archiveAfterOf,
		Log:            a.Log.With().Str("module", "archive").Logger(),
		Registerer:     a.Registry,
	})
	return c.archiver
}

// NewColdReader builds the reader of archived months the read path serves
// them with (readpath.ColdMonths), once.
func (a *App) NewColdReader() *archive.Cold {
	c := &a.clients
	if c.cold == nil {
		c.cold = archive.NewCold(a.Config.Archive.URL, a.Config.Archive.CacheBytes, a.Registry)
	}
	return c.cold
}
