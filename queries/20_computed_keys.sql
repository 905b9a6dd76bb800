-- Computed GROUP BY keys: the domain of age / 10 * 10 is the image of age's bounds [0, 100], eleven decades,
-- every one released (with noise) whatever the data holds.
SELECT age / 10 * 10 AS decade, COUNT(*) AS n, AVG(income) AS mean_income FROM pums GROUP BY age / 10 * 10 ORDER BY decade;
