-- Refused: a join of two private tables (here the table with itself) could multiply a person's rows beyond the
-- policy's bound; joins are not answered yet.
SELECT COUNT(*) FROM pums a JOIN pums b ON a.pid = b.pid;
