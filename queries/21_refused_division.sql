-- Refused, free: age - 50 can be 0 (age is in [0, 100]), and a division by zero after the debit would reveal that
-- some row has age 50. Write income / NULLIF(age - 50, 0) instead.
SELECT SUM(income / (age - 50)) FROM pums;
