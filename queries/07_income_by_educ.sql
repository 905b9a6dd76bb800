-- Several aggregates share the query's rho; arithmetic on the noisy results is free.
SELECT educ, COUNT(*) AS n, SUM(income) / 1000 AS income_thousands FROM pums GROUP BY educ ORDER BY educ;
