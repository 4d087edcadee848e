-- Catalog of month tables. activated_at / deactivated_at are
-- ours: the sealing grace starts when a month stops being active (invariant 3, docs/invariants.md).
CREATE TABLE IF NOT EXISTS im_group_message_shards (
  shard_month CHAR(6) NOT NULL COMMENT 'UTC 月份 YYYYMM',
  table_name VARCHAR(64) NOT NULL,
  shard_start DATETIME(3) NOT NULL,
  shard_end DATETIME(3) NOT NULL,
  status VARCHAR(16) NOT NULL DEFAULT 'prepared'
    COMMENT 'prepared/writable/sealing/sealed/archived',
  row_count BIGINT NOT NULL DEFAULT 0,
  min_created_at DATETIME(3) NULL,
  max_created_at DATETIME(3) NULL,
  activated_at DATETIME(3) NULL,
  deactivated_at DATETIME(3) NULL,
  created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
    ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (shard_month),
  UNIQUE KEY uk_table_name (table_name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
;
-- Every activation of a month, written before Redis is told (invariant 3, docs/invariants.md):
-- the newest row is the month a lost Redis recovers.
CREATE TABLE IF NOT EXISTS im_group_message_activations (
  shard_month CHAR(6) NOT NULL,
  activated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  source VARCHAR(32) NOT NULL,
  PRIMARY KEY (shard_month)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
;
-- MySQL mirror of topic month routes.
CREATE TABLE IF NOT EXISTS im_group_message_topic_shards (
  topic VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  shard_month CHAR(6) NOT NULL,
  min_seq BIGINT NOT NULL,
  max_seq BIGINT NOT NULL,
  message_count BIGINT NOT NULL DEFAULT 0,
  min_created_at DATETIME(3) NOT NULL,
  max_created_at DATETIME(3) NOT NULL,
  created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
    ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (topic, shard_month),
  KEY idx_topic_max_seq (topic, max_seq),
  KEY idx_month_topic (shard_month, topic)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
;
-- Per-user deleted seq ranges [low, hi).
CREATE TABLE IF NOT EXISTS im_dellog (
  id BIGINT NOT NULL AUTO_INCREMENT,
  topic VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  deletedfor BIGINT NOT NULL,
  low BIGINT NOT NULL,
  hi BIGINT NOT NULL,
  created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  KEY idx_topic_user_low (topic, deletedfor, low)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
;
-- Edit / recall history, with the month the message lives in.
CREATE TABLE IF NOT EXISTS im_message_revisions (
  id BIGINT NOT NULL AUTO_INCREMENT,
  topic VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  shard_month CHAR(6) NULL,
  seqid BIGINT NOT NULL,
  message_id BIGINT NOT NULL,
  action VARCHAR(16) NOT NULL COMMENT 'edit/recall/delete',
  version INT NOT NULL,
  content JSON NULL,
  head JSON NULL,
  actor BIGINT NOT NULL,
  created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  KEY idx_topic_seq (topic, seqid),
  KEY idx_message (message_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
;
-- Groups: topic <-> group_id and the group's status, for the ACL.
CREATE TABLE IF NOT EXISTS im_groups (
  topic VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  group_id BIGINT NOT NULL,
  name VARCHAR(255) NOT NULL DEFAULT '',
  status VARCHAR(16) NOT NULL DEFAULT 'active' COMMENT 'active/muted/dissolved',
  created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
    ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (topic),
  KEY idx_group (group_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
;
CREATE TABLE IF NOT EXISTS im_group_members (
  topic VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  user_id BIGINT NOT NULL,
  role VARCHAR(16) NOT NULL DEFAULT 'member' COMMENT 'member/admin/owner',
  muted_until DATETIME(3) NULL,
  created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
    ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (topic, user_id),
  KEY idx_user (user_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
;
-- Durable per-topic seq high-water: Redis may hand out seqs only up to
-- reserved_hi, so a lost Redis resumes above anything ever issued.
CREATE TABLE IF NOT EXISTS im_seq_reservations (
  topic VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  reserved_hi BIGINT NOT NULL,
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
    ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (topic)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
