-- Correlation and a regression line of income on age. Only rows where both values are present count; the query
-- measures a noisy count and noisy sums of the centred values, their squares and their product (split of ρ
-- 1 : 2 : 1 : 2 : 1 : 4), and the statistics are computed from them at no further cost. Each comes with an interval
-- from a parametric bootstrap of the noise (the noise only), and is NULL when the noisy sums leave it undefined.
-- The noise grows with the bounds: income's [0, 500000] is wide against its spread (at the default ρ = 0.05 the
-- correlation's interval is all of [-1, 1]), so incomes are capped at 150000 (a computed value: its bounds are
-- [0, 150000]; the few higher incomes count as 150000) and this query spends ρ = 0.25.
-- See docs/queries.md#correlation-covariance-and-regression.
SET dp.rho = 0.25;
SELECT CORR(age, LEAST(income, 150000)) AS r,
       REGR_SLOPE(LEAST(income, 150000), age) AS income_per_year_of_age,
       REGR_INTERCEPT(LEAST(income, 150000), age) AS income_at_age_0,
       REGR_COUNT(LEAST(income, 150000), age) AS n
FROM pums
WHERE age >= 18;
