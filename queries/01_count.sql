-- How many rows (at most 2 per person, pums_dup has up to 4) are in the sample? One noisy count.
SELECT COUNT(*) AS people FROM pums;
