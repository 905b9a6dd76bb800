-- Total income, each value clamped to the policy's bounds [0, 500000] before summing.
SELECT SUM(income) AS total_income FROM pums;
