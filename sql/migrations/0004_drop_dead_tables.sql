-- Two tables of the base schema that nothing ever wrote: the cross-month
-- idempotency table (cross-month duplicates are caught by probing the
-- neighbouring month tables' unique key, in persist and in send) and the
-- consume log (a redelivered insert is a no-op under uk_topic_seq). They
-- were only ever empty; reading them answered nothing.
DROP TABLE IF EXISTS im_group_message_dedup
;
DROP TABLE IF EXISTS im_group_message_consume_log
