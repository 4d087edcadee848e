-- The tenants a move was begun for, beside the placement records on every
-- placement server: the shard manager reads the move state (kept in each
-- tenant's own database) of these tenants only, instead of opening every
-- tenant's pool to find none. A move notes its tenant on every placement
-- server before it records its first step; readers take the union of the
-- servers that answer.
CREATE TABLE IF NOT EXISTS im_tenant_moves (
  tenant VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  noted_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (tenant)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
