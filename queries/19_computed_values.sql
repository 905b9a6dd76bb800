-- Aggregates of expressions: each column is clamped to its declared bounds, and the expression's bounds follow
-- (income * 2 is in [0, 1000000]); FILTER gives each aggregate its own condition, and counts persons too
-- (COUNT(DISTINCT pid) FILTER: the persons with a row where it holds). See docs/queries.md.
SELECT SUM(income * 2) AS doubled,
       SUM(CASE WHEN income > 50000 THEN 1 ELSE 0 END) AS above_50k,
       COUNT(*) FILTER (WHERE sex = 1) AS sex_1,
       AVG(income) FILTER (WHERE age > 30) AS mean_income_over_30,
       COUNT(DISTINCT pid) FILTER (WHERE income > 50000) AS persons_above_50k
FROM pums;
