-- The message-change path (recall, edit, delete for everyone): every change
-- leaves a revision row holding the content and head as they were before
-- it, who changed it, why, and the topic's change sequence number.
ALTER TABLE im_message_revisions
  ADD COLUMN IF NOT EXISTS reason VARCHAR(255) NULL AFTER actor,
  ADD COLUMN IF NOT EXISTS change_seq BIGINT NOT NULL DEFAULT 0 AFTER reason,
  ADD KEY IF NOT EXISTS idx_topic_change (topic, change_seq)
;
-- Per-topic change sequence: the last change_seq handed out, allocated in
-- the change's own transaction, so it survives the loss of Redis and never
-- repeats.
CREATE TABLE IF NOT EXISTS im_topic_changes (
  topic VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  change_seq BIGINT NOT NULL,
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
    ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (topic)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
