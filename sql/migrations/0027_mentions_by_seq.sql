-- The mention index by message: a user erase removes the entries of a
-- batch's messages by (topic, seq) without reading the message rows for
-- their mentioned users first. The primary key (topic, user_id, seq) would
-- serve that delete only as a range over the topic's every entry (a scan,
-- and locks on the entries persist inserts next to). Online: sends,
-- persist and changes go on while a tenant's existing table gets it.
ALTER TABLE im_topic_mentions ADD INDEX IF NOT EXISTS idx_topic_seq (topic, seq), ALGORITHM=INPLACE, LOCK=NONE
