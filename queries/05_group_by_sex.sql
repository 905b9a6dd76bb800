-- GROUP BY a column with a public domain: both keys (0 and 1) always appear, with noise.
SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY sex;
