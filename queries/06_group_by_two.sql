-- Two keys: the cross product of their domains (2 x 6 = 12 cells), every cell present.
SELECT sex, race, COUNT(*) AS n FROM pums GROUP BY sex, race ORDER BY sex, race;
