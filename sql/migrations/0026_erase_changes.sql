-- A user erase records one change per topic and batch (action 'erase'),
-- not one per message: its revision row names the batch's seqs of the
-- topic here (a JSON array, ascending), seqid the last of them and
-- message_id 0. NULL on every other revision: those name one message.
ALTER TABLE im_message_revisions
  ADD COLUMN IF NOT EXISTS seq_ids LONGTEXT NULL AFTER change_seq
