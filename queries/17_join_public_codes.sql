-- Answered: the private table joined with a public code list (config/pums.toml: educ_levels, public = true) on a
-- column unique in it. Each person's rows gain their education level; the bounds apply to the joined rows; every
-- level of the public table is released, with noise.
SELECT l.level, COUNT(*) AS n, AVG(p.income) AS avg_income
FROM pums p JOIN educ_levels l ON p.educ = l.educ
GROUP BY l.level
ORDER BY l.level;
