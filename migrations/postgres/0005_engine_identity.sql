-- Which Docker daemon each engine reaches: the same columns as
-- migrations/sqlite/0012_engine_identity.sql, which says what each is for.

alter table engines add column daemon_id text;
alter table engines add column daemon_told text;
create unique index engines_by_daemon on engines (daemon_id) where daemon_id is not null;
