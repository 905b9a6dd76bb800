-- Refused: a join of two private tables (here the table with itself) could multiply a person's rows beyond the
-- policy's bound; joins of private tables are not answered yet (joins with public tables are: 17_join_public_codes.sql).
SELECT COUNT(*) FROM pums a JOIN pums b ON a.pid = b.pid;
