-- The placement fence: the epoch of the tenant's placement this database
-- serves. Every write transaction of the tenant (a persist batch, a change,
-- a deletion range) reads this row with a shared lock as its first
-- statement and writes nothing unless the row's epoch is the epoch its
-- connection was opened for (the session variable @imshard_epoch). A move's
-- switch raises it with an UPDATE, whose exclusive lock waits for every
-- writer still inside its transaction; from that commit on, no writer of
-- the old placement changes this database. One row, id 1; epoch 0 is the
-- configured placement.
CREATE TABLE IF NOT EXISTS im_tenant_fence (
  id TINYINT UNSIGNED NOT NULL,
  epoch BIGINT NOT NULL,
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
;
INSERT IGNORE INTO im_tenant_fence (id, epoch) VALUES (1, 0)
