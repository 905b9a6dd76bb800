-- Refused: raw rows of a private table are never released.
SELECT age, income FROM pums LIMIT 5;
