-- The changes of archived messages. An archive object is never rewritten:
-- a recall, an edit or a delete for everyone of a message whose month is
-- archived writes the message's changed columns here instead (the row is
-- first copied from the archive, then changed as a month table's row would
-- be), reads of the archived month put them over the archive's row, and a
-- restore writes them into the month table and deletes them in the
-- transaction that sets the month back to sealed. recalled_at, recalled_by
-- and deleted_at stay NULL where the change did not set them: the
-- archive's values stand.
CREATE TABLE IF NOT EXISTS im_archive_overlay (
  topic VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  seqid BIGINT NOT NULL,
  shard_month CHAR(6) NOT NULL,
  message_id BIGINT NOT NULL,
  status VARCHAR(32) NOT NULL,
  content JSON NULL,
  head JSON NULL,
  version INT NOT NULL,
  recalled_at DATETIME(3) NULL,
  recalled_by BIGINT NULL,
  deleted_at DATETIME(3) NULL,
  updated_at DATETIME(3) NOT NULL,
  PRIMARY KEY (topic, seqid),
  KEY idx_month (shard_month)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
