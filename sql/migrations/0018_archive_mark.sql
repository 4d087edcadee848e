-- The archive's last steps: verified → marked (the catalog row archived,
-- in the same transaction) → dropped (the month table gone, after
-- archive.keep_table and the catalog cache's TTL). stamp is the month
-- table's row count, version sum and newest updated_at taken before the
-- verify step read the table: the mark compares it with the table under
-- the catalog row's exclusive lock, so a change that landed after the
-- verification refuses the mark. marked_at starts keep_table.
ALTER TABLE im_archives
  ADD COLUMN IF NOT EXISTS stamp VARCHAR(96) NOT NULL DEFAULT '' AFTER table_hash,
  ADD COLUMN IF NOT EXISTS marked_at DATETIME(3) NULL AFTER stamp,
  ADD COLUMN IF NOT EXISTS dropped_at DATETIME(3) NULL AFTER marked_at
