-- A tenant move's early proofs: right after the copy step copied a table
-- that no write marked since its mark triggers exist (a sealed month, an
-- archived month's references), it compares the table on both servers
-- (CHECKSUM TABLE) and flags its chunks proven. The verification step keeps
-- a proven chunk verified without reading it unless a mark fell in it
-- since (clearMarks takes the flag back before it removes that mark).
ALTER TABLE im_tenant_move_chunks ADD COLUMN IF NOT EXISTS proven TINYINT(1) NOT NULL DEFAULT 0 AFTER verified
