-- The placement records, kept in the placement database of every server
-- mysql.placement_dsns names (by default each server the tenants' own
-- DSNs name). A record overrides the tenant's configured DSN from its
-- epoch on; a tenant without a record is placed by the configuration, at
-- epoch 0. A move writes its switch to every placement server, only ever
-- raising a tenant's epoch; readers take the highest epoch any reachable
-- server holds, so the records outlive the loss of any one of them.
CREATE TABLE IF NOT EXISTS im_tenant_placement (
  tenant VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  dsn VARCHAR(2048) NOT NULL,
  epoch BIGINT NOT NULL,
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (tenant)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
