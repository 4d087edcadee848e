-- The change feed's outbox: one row per recall, edit or delete for
-- everyone (and any later kind of change), written in the change's own
-- transaction, holding the change event exactly as the relay produces it
-- to kafka.changes_topic. A row lives only until the broker acknowledged
-- its event: the table is the relay's durable cursor, and whatever it
-- holds is still to be sent. Within a topic, change_seq is allocated under
-- the topic's im_topic_changes row lock, so a topic's rows commit in
-- change_seq order and their ids grow with it.
CREATE TABLE IF NOT EXISTS im_change_outbox (
  id BIGINT NOT NULL AUTO_INCREMENT,
  topic VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  change_seq BIGINT NOT NULL,
  event MEDIUMBLOB NOT NULL,
  created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  UNIQUE KEY uk_topic_change (topic, change_seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
