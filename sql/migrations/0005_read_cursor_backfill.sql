-- Members who joined before read cursors existed start with everything
-- stored read (their cursor at the topic's last stored seq), as a join does
-- now: the upgrade does not turn a group's whole history into unread. A
-- member who already has a cursor row keeps it.
INSERT IGNORE INTO im_user_read_cursors (user_id, topic, read_seq)
SELECT m.user_id, m.topic, COALESCE(s.last_seq, 0)
FROM im_group_members AS m
LEFT JOIN (
  SELECT topic, MAX(max_seq) AS last_seq FROM im_group_message_topic_shards GROUP BY topic
) AS s ON s.topic = m.topic
