-- The month tables a migration plan created (docs/migration.md): abort
-- drops those that are still empty and older than the active month.
CREATE TABLE IF NOT EXISTS im_migration_months (
  shard_month CHAR(6) NOT NULL,
  PRIMARY KEY (shard_month)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
;
-- How far the migration's route-mirror pass got: the last topic (in byte
-- order) whose legacy rows widened the mirror, so an interrupted pass
-- resumes without counting a topic twice.
CREATE TABLE IF NOT EXISTS im_migration_mirror (
  id TINYINT NOT NULL DEFAULT 1 COMMENT 'always 1',
  topic VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
