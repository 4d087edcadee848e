-- When a restore last flipped the month from archived back to sealed. A
-- process's catalog cache may still read the month from its archive for up
-- to the cache's lifetime after that; a change of the month is refused
-- (409, retried) until that lifetime has passed, so no reader is served
-- the archive's copy of a message the table has already changed.
ALTER TABLE im_group_message_shards
  ADD COLUMN IF NOT EXISTS unarchived_at DATETIME(3) NULL AFTER deactivated_at
