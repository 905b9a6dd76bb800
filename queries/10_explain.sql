-- EXPLAIN DP shows the bounded plan, each sensitivity, the noise and the cost, and spends nothing.
EXPLAIN DP SELECT sex, AVG(income) FROM pums WHERE age BETWEEN 25 AND 65 GROUP BY sex;
