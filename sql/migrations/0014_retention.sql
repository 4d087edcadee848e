-- Retention: a group may keep its history for fewer (or more) months than
-- its tenant (NULL: the tenant's retention_months; 0: forever).
ALTER TABLE im_groups
  ADD COLUMN IF NOT EXISTS retention_months INT NULL AFTER status
;
-- The retention floor of a topic: every seq below floor_seq is past
-- retention. The retention run raises it before it removes a row, so a
-- reader that sees a row missing also sees the floor that explains it, and
-- a walk ends at the floor instead of looking for what was removed.
CREATE TABLE IF NOT EXISTS im_topic_floors (
  topic VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  floor_seq BIGINT NOT NULL,
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
    ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (topic)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
;
-- When the catalog's row_count and min/max_created_at were computed (at
-- seal); NULL while the month may still take rows, whose counts come from
-- the route mirror instead.
ALTER TABLE im_group_message_shards
  ADD COLUMN IF NOT EXISTS stats_at DATETIME(3) NULL AFTER max_created_at
;
-- A month's revisions go with it.
ALTER TABLE im_message_revisions
  ADD KEY IF NOT EXISTS idx_month (shard_month)
