-- Every write of a pool's row bumps its version (generation only moves
-- with the spec; status, deletion and approvals move the version too).
-- The version rides on the change notices replicas send each other, so
-- that a replica's cache of pools can tell a notice it has already
-- applied from one it has not (docs/ha.md, "Reads").
alter table pools add column version bigint not null default 1 check (version >= 1);

-- Upgrade jobs are claimed with leases like pools: the database's clock,
-- and a token that grows at each hand-over (docs/ha.md, "Upgrade jobs").
alter table leases drop constraint leases_kind_check;
alter table leases add constraint leases_kind_check check (kind in ('pool', 'job'));
