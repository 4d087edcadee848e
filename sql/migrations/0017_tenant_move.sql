-- A tenant move's state, kept on the tenant database it concerns: the
-- source holds the move in progress (role 'source', its steps and
-- counters, and one row per copied chunk), and the switch leaves a row of
-- role 'target' on the target naming the source, which `finish` drops. So
-- the state always sits on the database the tenant's placement names, the
-- one the move must not lose, and dies with the copy it describes.
CREATE TABLE IF NOT EXISTS im_tenant_move (
  id TINYINT UNSIGNED NOT NULL,
  role VARCHAR(8) NOT NULL,
  peer_dsn VARCHAR(2048) NOT NULL,
  step VARCHAR(16) NOT NULL,
  from_epoch BIGINT NOT NULL,
  paused TINYINT(1) NOT NULL DEFAULT 0,
  rows_copied BIGINT NOT NULL DEFAULT 0,
  bytes_copied BIGINT NOT NULL DEFAULT 0,
  switch_ms BIGINT NOT NULL DEFAULT 0,
  note VARCHAR(1024) NOT NULL DEFAULT '',
  started_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
;
CREATE TABLE IF NOT EXISTS im_tenant_move_chunks (
  table_name VARCHAR(64) NOT NULL,
  chunk_no INT NOT NULL,
  lo_key TEXT NULL,
  hi_key TEXT NULL,
  checksum VARCHAR(96) NOT NULL DEFAULT '',
  copied TINYINT(1) NOT NULL DEFAULT 0,
  PRIMARY KEY (table_name, chunk_no)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
