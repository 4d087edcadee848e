ALTER TABLE {{table}} ADD INDEX IF NOT EXISTS idx_from_topic_seq (from_user, topic, seqid), ALGORITHM=INPLACE, LOCK=NONE
