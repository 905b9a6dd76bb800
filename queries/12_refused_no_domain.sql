-- Refused: age has bounds but no public domain, so its keys would reveal which ages occur. With a δ budget for key
-- selection ([session] delta_budget = 1e-6) it is answered: only the ages whose noisy count passes a threshold.
SELECT age, COUNT(*) FROM pums GROUP BY age;
