-- One row per month the archive has touched: the step it reached, so an
-- archive run killed at any point resumes from there (each step is
-- idempotent), and what the run measured and wrote. step: prechecked →
-- exported → verified. The object key names the Parquet file and its
-- manifest under archive.url; the manifest column keeps the manifest as
-- written, for the verify step and `shard list`.
CREATE TABLE IF NOT EXISTS im_archives (
  shard_month CHAR(6) NOT NULL,
  step VARCHAR(16) NOT NULL,
  object_key VARCHAR(255) NOT NULL,
  row_count BIGINT NOT NULL DEFAULT 0,
  rows_done BIGINT NOT NULL DEFAULT 0,
  bytes BIGINT NOT NULL DEFAULT 0,
  table_hash CHAR(64) NOT NULL DEFAULT '',
  manifest MEDIUMTEXT NULL,
  last_error VARCHAR(1024) NULL,
  started_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
    ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (shard_month)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
