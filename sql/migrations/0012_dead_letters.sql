-- Events of a served tenant that persist sent to the dead-letter topic, one
-- row per (topic, seqid), so that sealing a month can prove none of its
-- events is missing: a month with a pending row here waits unsealed. The
-- Kafka dead-letter topic keeps the event itself (for `imshard dlq replay`);
-- a row turns resolved once the seal check finds the event stored.
CREATE TABLE IF NOT EXISTS im_group_message_dead_letters (
  id BIGINT NOT NULL AUTO_INCREMENT,
  topic VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  seqid BIGINT NOT NULL,
  shard_month CHAR(6) NOT NULL,
  reason VARCHAR(64) NOT NULL,
  status VARCHAR(16) NOT NULL DEFAULT 'pending' COMMENT 'pending/resolved',
  created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
    ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  UNIQUE KEY uk_topic_seq (topic, seqid),
  KEY idx_month_status (shard_month, status)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
;
-- The seal check counts a month's compensation entries still pending.
ALTER TABLE im_group_message_compensation
  ADD KEY IF NOT EXISTS idx_month_status (shard_month, status)
