-- Correlation and a regression line of income on age. Only rows where both values are present count; the query
-- measures a noisy count and noisy sums of the centred values, their squares and their product (split of ρ
-- 1 : 2 : 1 : 2 : 1 : 4), and the statistics are computed from them at no further cost. Each comes with an interval
-- from a parametric bootstrap of the noise (the noise only), and is NULL when the noisy sums leave it undefined.
-- See docs/queries.md#correlation-covariance-and-regression.
SELECT CORR(age, income) AS r,
       REGR_SLOPE(income, age) AS income_per_year_of_age,
       REGR_INTERCEPT(income, age) AS income_at_age_0,
       REGR_COUNT(income, age) AS n
FROM pums
WHERE age >= 18;
