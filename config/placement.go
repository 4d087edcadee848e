package config

import (
	"fmt"
	"strings"
	"time"
)

// Placement: where a tenant's database is. The configured DSN (tenants[].dsn
// or mysql.dsn_template) is the tenant's initial placement, epoch 0. A move
// (`imshard tenant move`) writes a placement record with a higher epoch to
// every server of mysql.placement_dsns; every process reads the records each
// mysql.placement_poll and follows the highest epoch any reachable server
// holds. A record always takes precedence over the configured DSN: editing a
// moved tenant's DSN in the configuration does not move it back (a reverse
// move does).
//
// mysql.placement_dsns lists go-sql-driver DSNs naming a database (created
// if missing) that holds only the records; empty means one per server the
// tenants' DSNs name, database imshard_placement. Several servers are the
// point: the records must outlive the loss of any one server, so a move
// refuses to switch unless every placement server took its record.

// PlacementDatabase is the database of the default placement servers.
const PlacementDatabase = "imshard_placement"

// minPlacementPoll bounds the poll: each poll is one small query per
// placement server per process.
const minPlacementPoll = 100 * time.Millisecond

func (c *Config) validatePlacement(p *problems) {
	m := c.MySQL
	p.durRange("mysql.placement_poll", m.PlacementPoll, minPlacementPoll, time.Minute)
	seen := map[string]bool{}
	for i, dsn := range m.PlacementDSNs {
		key := fmt.Sprintf("mysql.placement_dsns[%d]", i)
		slash := strings.LastIndexByte(dsn, '/')
		db, _, _ := strings.Cut(dsn[slash+1:], "?")
		switch {
		case slash < 0 || db == "":
			p.add(key, "must name a database (user@tcp(host:port)/imshard_placement)")
		case seen[dsn]:
			p.add(key, "is listed twice")
		}
		seen[dsn] = true
	}
}
