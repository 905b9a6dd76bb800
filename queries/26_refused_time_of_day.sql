-- Refused, for free: the hour of a visit (date_trunc('hour', at)) has no public domain. A period lists the days of
-- the timestamp, but not its instants; the demo's budget has no δ to select hours by their noisy counts. Group by
-- EXTRACT(HOUR FROM at) instead: its domain is 0..23.
SELECT date_trunc('hour', at) AS hour, COUNT(*) FROM visits GROUP BY 1;
