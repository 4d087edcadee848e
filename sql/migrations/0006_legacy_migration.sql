-- The migration of a tenant from the legacy single table into month tables
-- (docs/migration.md). One row per tenant database: its state, the
-- backfill's cursor and counts, and the verification's outcome.
CREATE TABLE IF NOT EXISTS im_migration (
  id TINYINT NOT NULL DEFAULT 1 COMMENT 'always 1: one migration per tenant database',
  state VARCHAR(16) NOT NULL COMMENT 'planned/cutover/backfilling/paused/verifying/done/finished',
  version BIGINT NOT NULL DEFAULT 1 COMMENT 'bumped by every state change',
  legacy_rows BIGINT NOT NULL DEFAULT 0,
  legacy_min_id BIGINT NOT NULL DEFAULT 0,
  legacy_max_id BIGINT NOT NULL DEFAULT 0,
  min_month CHAR(6) NULL,
  max_month CHAR(6) NULL,
  cursor_id BIGINT NOT NULL DEFAULT 0 COMMENT 'message_id of the last row of the last committed batch',
  rows_read BIGINT NOT NULL DEFAULT 0,
  rows_inserted BIGINT NOT NULL DEFAULT 0,
  rows_present BIGINT NOT NULL DEFAULT 0,
  rows_skewed BIGINT NOT NULL DEFAULT 0 COMMENT 'rows whose created_at month differs from the month their seq range goes to',
  batches BIGINT NOT NULL DEFAULT 0,
  batch_failures BIGINT NOT NULL DEFAULT 0,
  last_error VARCHAR(512) NULL,
  routes_done TINYINT NOT NULL DEFAULT 0 COMMENT 'route mirror and Redis routes rebuilt after the copy',
  verify_pending TINYINT NOT NULL DEFAULT 0 COMMENT '1: the migrate module is to (re)run the verification',
  verify_runs INT NOT NULL DEFAULT 0,
  redo_rounds INT NOT NULL DEFAULT 0,
  verify_diffs INT NOT NULL DEFAULT 0,
  planned_at DATETIME(3) NOT NULL,
  cutover_at DATETIME(3) NULL COMMENT 'cutover_time: from here on imshard takes the tenant''s writes',
  opened_at DATETIME(3) NULL COMMENT 'when writes opened (state backfilling first reached)',
  backfilled_at DATETIME(3) NULL,
  verified_at DATETIME(3) NULL,
  finished_at DATETIME(3) NULL,
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
    ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
;
-- Every topic of the legacy table at cutover: its cutover_seq (the highest
-- legacy seq; imshard's own seqs start above it) and row count.
CREATE TABLE IF NOT EXISTS im_migration_topics (
  topic VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  cutover_seq BIGINT NOT NULL,
  legacy_rows BIGINT NOT NULL,
  PRIMARY KEY (topic)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
;
-- Where each topic's legacy rows are split into months: month M holds the
-- seqs from its first_seq up to next_seq - 1. Ranges are contiguous per topic.
CREATE TABLE IF NOT EXISTS im_migration_splits (
  topic VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  shard_month CHAR(6) NOT NULL,
  first_seq BIGINT NOT NULL,
  next_seq BIGINT NULL COMMENT 'the next month''s first_seq (NULL: the topic''s last month)',
  PRIMARY KEY (topic, shard_month)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
;
-- One row per committed backfill batch (and per failed attempt): cursors
-- and counts.
CREATE TABLE IF NOT EXISTS im_migration_batches (
  id BIGINT NOT NULL AUTO_INCREMENT,
  from_id BIGINT NOT NULL COMMENT 'exclusive: the cursor the batch started after',
  to_id BIGINT NOT NULL COMMENT 'inclusive: the last message_id it copied',
  rows_read INT NOT NULL,
  rows_inserted INT NOT NULL,
  rows_present INT NOT NULL,
  rows_skewed INT NOT NULL,
  error VARCHAR(512) NULL,
  started_at DATETIME(3) NOT NULL,
  finished_at DATETIME(3) NOT NULL,
  PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
;
-- The differences the last verification found, per topic and month.
CREATE TABLE IF NOT EXISTS im_migration_diffs (
  topic VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  shard_month CHAR(6) NOT NULL,
  min_seq BIGINT NOT NULL,
  max_seq BIGINT NOT NULL,
  legacy_rows BIGINT NOT NULL,
  month_rows BIGINT NOT NULL,
  legacy_hash CHAR(64) NOT NULL,
  month_hash CHAR(64) NOT NULL,
  PRIMARY KEY (topic, shard_month)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
