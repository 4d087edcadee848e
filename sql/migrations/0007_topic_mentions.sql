-- The per-topic mention index: one row per (topic, mentioned user, seq)
-- of a stored message, user_id 0 for a mention of everyone. persist writes
-- it in the transaction that stores the message rows (ON DUPLICATE KEY:
-- a replayed batch adds nothing), the legacy migration's backfill in the
-- statement batch that copies them; a recall or delete for everyone
-- removes the message's rows in the change's transaction. Nothing is
-- written per member: a message costs one row per mention, whatever the
-- group's size. The key puts a user's mentions in a topic next to each
-- other, so "mentions of me or everyone above my cursor" is two short
-- index ranges per topic.
--
-- Messages stored before this step have no rows: their mentions count in
-- unread but not in mention_unread (docs/operations.md, "Read state").
CREATE TABLE IF NOT EXISTS im_topic_mentions (
  topic VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  user_id BIGINT NOT NULL COMMENT '0: the message mentions everyone',
  seq BIGINT NOT NULL,
  PRIMARY KEY (topic, user_id, seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
