-- Refused: statements that reach outside the read-only view (COPY, CREATE, INSERT, DROP).
COPY (SELECT * FROM pums) TO '/tmp/pums.csv';
