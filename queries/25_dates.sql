-- Dates: the visits table (synthetic, config/pums.toml) declares day in ["2019-01-01", "2023-12-31"], so each year
-- of the period and each quarter (date_trunc of the date) is a public key, every one released (zeros included).
SELECT EXTRACT(YEAR FROM day) AS year, COUNT(*) AS visits, AVG(cost) AS mean_cost FROM visits GROUP BY 1 ORDER BY 1;
SELECT date_trunc('quarter', at) AS quarter, COUNT(*) AS visits FROM visits GROUP BY 1 ORDER BY 1;
