-- Refused: MIN/MAX are not supported yet (they need a different mechanism).
SELECT MAX(income) FROM pums;
