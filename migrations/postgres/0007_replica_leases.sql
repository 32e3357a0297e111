-- Pool leases whose upkeep is per replica, not per pool (docs/ha.md,
-- "Ownership"). A replica's row now carries the lease of everything it
-- holds: `expires_at`, renewed every third of the lease, and an
-- `incarnation`, drawn from a sequence each time the replica (re)joins.
-- A pool lease names its holder and the holder's incarnation, and lasts
-- as long as that incarnation's row lives; its own `expires_at` is
-- 'infinity' while held, and `now()` once given up. A renewal while
-- nothing changes writes one row per replica, whatever the pool count.
--
-- Rows written before this change (incarnation 0) keep their old meaning:
-- held until their own `expires_at`.

create sequence replica_incarnations;
alter table replicas add column incarnation bigint;
alter table replicas add column expires_at timestamptz;
alter table leases add column incarnation bigint not null default 0;
