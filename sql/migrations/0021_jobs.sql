-- Background jobs of the tenant (a group purge), run by the shard managers:
-- one runner at a time holds a job's lease (lease_owner until lease_until)
-- and renews it after every batch; a job whose lease expired (its runner
-- killed) is taken over by another. report is the job's JSON report: rows
-- removed per month, months left to the archive. Owned by
-- modules/retention.
CREATE TABLE IF NOT EXISTS im_jobs (
  job_id BIGINT NOT NULL AUTO_INCREMENT,
  kind VARCHAR(16) NOT NULL,
  target VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  state VARCHAR(16) NOT NULL,
  rows_removed BIGINT NOT NULL DEFAULT 0,
  report TEXT NOT NULL,
  last_error VARCHAR(1024) NOT NULL DEFAULT '',
  lease_owner VARCHAR(128) NOT NULL DEFAULT '',
  lease_until DATETIME(3) NULL,
  created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (job_id),
  KEY idx_state (state, job_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
