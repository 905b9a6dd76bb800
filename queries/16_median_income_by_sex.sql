-- Quantiles: MEDIAN (and PERCENTILE_CONT, MIN, MAX) are drawn by the exponential mechanism among a public grid of
-- candidates between the column's bounds. The accuracy line is a rank interval: how many values the released
-- median's rank may be off, beyond the best candidate's. MIN/MAX answer the 0.01/0.99 quantiles: an exact minimum
-- is not private.
SELECT sex, MEDIAN(income) AS median_income, MAX(age) AS oldest FROM pums GROUP BY sex;
