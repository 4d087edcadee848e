-- A tenant move's change marks: while a table is being moved, triggers on
-- the source (created when the move plans the table, dropped when it ends)
-- add the primary key of every row a write inserts, updates or deletes,
-- in the writer's own transaction. The switch copies and verifies behind
-- the fence only the rows marked since the verification before it, and
-- the chunks that verification did not prove (verified = 0).
CREATE TABLE IF NOT EXISTS im_tenant_move_marks (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  table_name VARCHAR(64) NOT NULL,
  key_text TEXT NOT NULL,
  PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
;
ALTER TABLE im_tenant_move_chunks ADD COLUMN IF NOT EXISTS verified TINYINT(1) NOT NULL DEFAULT 0 AFTER copied
