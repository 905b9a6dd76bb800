-- Answered exactly and for free: a query that reads only a public table (no noise, no charge).
SELECT educ, label FROM educ_levels WHERE level = 'graduate' ORDER BY educ;
