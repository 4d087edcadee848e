-- A user's deletion ranges of a topic become disjoint: ranges that overlap
-- or touch are merged into one row (the hide path keeps them so from now
-- on, and the read condition relies on it: the only range that can hold a
-- seq is the one starting last at or below it). In place, so a hide
-- written meanwhile is never lost: each island of overlapping ranges is
-- widened into its oldest row, then its other rows are deleted. Every
-- statement may run again after a crash.
DELETE FROM im_dellog WHERE hi <= low
;
UPDATE im_dellog AS d
JOIN (
  SELECT MIN(id) AS keep, MIN(low) AS low, MAX(hi) AS hi
  FROM (
    SELECT id, topic, deletedfor, low, hi,
      SUM(fresh) OVER (PARTITION BY topic, deletedfor ORDER BY low, hi, id ROWS UNBOUNDED PRECEDING) AS island
    FROM (
      SELECT id, topic, deletedfor, low, hi,
        CASE WHEN low <= MAX(hi) OVER (PARTITION BY topic, deletedfor ORDER BY low, hi, id
          ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) THEN 0 ELSE 1 END AS fresh
      FROM im_dellog
    ) AS ranked
  ) AS islands
  GROUP BY topic, deletedfor, island
  HAVING COUNT(*) > 1
) AS merged ON d.id = merged.keep
SET d.low = merged.low, d.hi = merged.hi
;
DELETE d FROM im_dellog AS d
JOIN (
  SELECT id, MIN(id) OVER (PARTITION BY topic, deletedfor, island) AS keep
  FROM (
    SELECT id, topic, deletedfor,
      SUM(fresh) OVER (PARTITION BY topic, deletedfor ORDER BY low, hi, id ROWS UNBOUNDED PRECEDING) AS island
    FROM (
      SELECT id, topic, deletedfor, low, hi,
        CASE WHEN low <= MAX(hi) OVER (PARTITION BY topic, deletedfor ORDER BY low, hi, id
          ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) THEN 0 ELSE 1 END AS fresh
      FROM im_dellog
    ) AS ranked
  ) AS islands
) AS members ON d.id = members.id
WHERE d.id <> members.keep
;
