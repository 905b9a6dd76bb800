-- Questions about each person: the distribution of the number of rows per person (a histogram of per-person
-- counts, every count from 1 to max_rows_per_unit released with noise), and the people whose total income is
-- above 100 000. Each person is one row of the subquery, so each count moves by at most 1 for one person.
SELECT n AS rows_per_person, COUNT(*) AS people FROM (SELECT pid, COUNT(*) AS n FROM pums GROUP BY pid) t GROUP BY n ORDER BY n;
WITH totals AS (SELECT pid, SUM(income) AS s FROM pums GROUP BY pid) SELECT COUNT(*) AS rich FROM totals WHERE s > 100000;
