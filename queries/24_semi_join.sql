-- Filter by each person's own rows: the rows of people who have at least one row with an income above 100 000,
-- and the average income of people never recorded above age 60. A semi-join on the privacy unit keeps or drops a
-- person's rows by that person's rows alone, so the limits and sensitivities are those of the table.
SELECT COUNT(*) AS rows_of_earners FROM pums WHERE pid IN (SELECT pid FROM pums WHERE income > 100000);
SELECT sex, AVG(income) AS mean_income FROM pums p WHERE NOT EXISTS (SELECT 1 FROM pums q WHERE q.pid = p.pid AND q.age > 60) GROUP BY sex;
