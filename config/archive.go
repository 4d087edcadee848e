package config

import (
	"net/url"
	"time"
)

// Archive is where sealed months go when they leave MySQL, and how fast.
// URL is a gocloud.dev/blob bucket URL: file:// (relative to the working
// directory when it starts with file://./), s3:// (S3, MinIO, Ceph: add
// endpoint and use_path_style), gs://, azblob://. KeepTable is how long an
// archived month's table stays after the mark before it is dropped (the
// shard manager's patrol, or `shard archive` of the month run again; never
// within routing.RestoreSettle of the mark): no read of an archived month
// — the API, the inbox, the route check, retention's holds — goes to its
// table;
// RowsPerSecond throttles an archive's reads of the month table and a
// restore's writes back into it (0: no limit). CacheBytes bounds each
// process's cache of archived months' manifests and Parquet footers (the
// cold read path's metadata). SortDir and SortBytes: an export reads the
// month table in its clustered order and sorts the rows into the
// archive's (topic, seqid) order, in SortBytes of memory, writing sorted
// runs of the rest to SortDir (about the month table's data size at
// most; never a tmpfs).
type Archive struct {
	URL           string        `mapstructure:"url"`
	KeepTable     time.Duration `mapstructure:"keep_table"`
	RowsPerSecond int           `mapstructure:"rows_per_second"`
	CacheBytes    int64         `mapstructure:"cache_bytes"`
	SortDir       string        `mapstructure:"sort_dir"`
	SortBytes     int64         `mapstructure:"sort_bytes"`
}

// DefaultArchive is the archive section's defaults: a directory under the
// data directory, no keep time, no throttle, 64 MiB of cached archive
// metadata, a 256 MiB sort buffer whose runs go under the data directory.
func DefaultArchive() Archive {
	return Archive{URL: "file://./data/archive", KeepTable: 0, RowsPerSecond: 0, CacheBytes: 64 << 20,
		SortDir: "./data/sort", SortBytes: 256 << 20}
}

// archiveSchemes are the bucket schemes the binary registers.
var archiveSchemes = []string{"file", "s3", "gs", "azblob", "mem"}

func (c *Config) validateArchive(p *problems) {
	a := c.Archive
	u, err := url.Parse(a.URL)
	switch {
	case a.URL == "":
		p.add("archive.url", "is required (a bucket URL: file://, s3://, gs://, azblob://)")
	case err != nil:
		p.add("archive.url", "is not a URL: %v", err)
	default:
		p.oneOf("archive.url", u.Scheme, archiveSchemes...)
	}
	p.durRange("archive.keep_table", a.KeepTable, 0, 24*365*time.Hour)
	p.intRange("archive.rows_per_second", int64(a.RowsPerSecond), 0, 1<<31-1)
	p.intRange("archive.cache_bytes", a.CacheBytes, 1<<20, 1<<40)
	p.intRange("archive.sort_bytes", a.SortBytes, 1<<20, 1<<40)
	if a.SortDir == "" {
		p.add("archive.sort_dir", "is required (a directory for the export's sort runs)")
	}
}

// tenantArchive checks a tenant's archive_after_months (0: never automatic).
func (p *problems) tenantArchive(key string, t Tenant) {
	p.intRange(key+".archive_after_months", int64(t.ArchiveAfterMonths), 0, 1200)
}
