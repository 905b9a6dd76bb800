-- HAVING, ORDER BY and LIMIT run on the noisy counts (post-processing), never on exact ones.
SELECT race, COUNT(*) AS n FROM pums GROUP BY race HAVING COUNT(*) > 40 ORDER BY n DESC LIMIT 3;
