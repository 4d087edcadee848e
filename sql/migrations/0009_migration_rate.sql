-- The backfill's pace as the process copying records it with each batch
-- (docs/migration.md): the limit it applies (migrate.rows_per_second, 0 =
-- unthrottled), the rate it achieved over the last seconds (throttle waits
-- included) and the rate of its last batch alone (what the database gave
-- it). `imshard migrate status` shows them side by side.
ALTER TABLE im_migration
  ADD COLUMN rate_limit INT NOT NULL DEFAULT 0 COMMENT 'rows/s the copying process allows (0: unthrottled)',
  ADD COLUMN rate_achieved INT NOT NULL DEFAULT 0 COMMENT 'rows/s copied over the last seconds, throttle waits included',
  ADD COLUMN rate_batch INT NOT NULL DEFAULT 0 COMMENT 'rows/s of the last batch alone'
