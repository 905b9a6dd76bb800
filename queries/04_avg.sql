-- AVG is post-processing of a noisy SUM and a noisy COUNT (the query's rho is split between them).
SELECT AVG(age) AS mean_age FROM pums;
