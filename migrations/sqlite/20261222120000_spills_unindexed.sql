-- SQLite's spill table is appended in the order jtis spill and purged from its head
-- (store/sql/replay.rs): it needs no index on the expiry, whose entries each round that
-- spilled wrote a page or two for, besides the table's own.
DROP INDEX seen_jtis_by_expiry;
