-- Read state: one row per (user, topic) the user ever read, joined or left.
-- The primary key starts with the user, so everything a user's devices ask
-- for (the topic list, the unread badges, a sync) is one index range.
-- read_seq only moves forward (GREATEST upserts); pinned and
-- notify_muted_until are the user's own preferences for the topic (the
-- notification mute, not the membership's muted_until, which forbids
-- posting). updated_at moves with every real change — a new cursor, a
-- preference, a join or a leave — and is what a device sync compares with.
CREATE TABLE IF NOT EXISTS im_user_read_cursors (
  user_id BIGINT NOT NULL,
  topic VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  read_seq BIGINT NOT NULL DEFAULT 0,
  pinned TINYINT(1) NOT NULL DEFAULT 0,
  notify_muted_until DATETIME(3) NULL,
  created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
    ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (user_id, topic),
  KEY idx_user_updated (user_id, updated_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
