-- A reverse move (`imshard tenant move reverse`) is a move back onto the
-- copy a done move left on its source: the target database is not empty,
-- only the chunks that differ are copied, and a cancel must give the tenant
-- back to the move it reverses instead of dropping that copy.
ALTER TABLE im_tenant_move ADD COLUMN IF NOT EXISTS reverse TINYINT(1) NOT NULL DEFAULT 0 AFTER from_epoch
