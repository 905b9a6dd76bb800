-- Adults only: WHERE runs before bounding, on any column; the count is noised as usual.
SELECT COUNT(*) AS adults FROM pums WHERE age >= 18;
