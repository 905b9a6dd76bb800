-- Refused: grouping by the privacy unit would release one group per person.
SELECT pid, COUNT(*) FROM pums GROUP BY pid;
