-- Refused: a join of private tables on anything but their privacy unit could pair one person's rows with another
-- person's (here people of the same age), so one person could change many others' rows. Joins on the unit are
-- answered (SELECT COUNT(*) FROM pums a JOIN pums b ON a.pid = b.pid), and so are joins with public tables
-- (17_join_public_codes.sql).
SELECT COUNT(*) FROM pums a JOIN pums b ON a.age = b.age;
