-- Narrow the next queries: less rho each, the Laplace mechanism, 90% intervals.
SET dp.rho = 0.02;
SET dp.mechanism = 'laplace';
SET dp.confidence = 0.9;
SELECT married, COUNT(*) AS n FROM pums GROUP BY married;
