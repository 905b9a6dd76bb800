-- Refused: age has bounds but no public domain, so its keys would reveal which ages occur.
SELECT age, COUNT(*) FROM pums GROUP BY age;
