-- Every write of a pool's row bumps its version (generation only moves
-- with the spec; status, deletion and approvals move the version too).
-- The version rides on the change notices replicas send each other, so
-- that a replica's cache of pools can tell a notice it has already
-- applied from one it has not (docs/ha.md, "Reads").
alter table pools add column version integer not null default 1 check (version >= 1);
