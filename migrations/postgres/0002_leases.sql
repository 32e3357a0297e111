-- Several drover replicas on one database (docs/ha.md).

-- Each replica, as long as it runs: it stamps `heartbeat_at` every few
-- seconds; one that has not for the lease duration is gone. Pools are
-- spread over the replicas alive now.
create table replicas (
    id            text primary key,
    started_at    timestamptz not null,
    heartbeat_at  timestamptz not null
);

-- Which replica drives a pool: the holder, until `expires_at` (the
-- database's clock), renewed by the holder while it lives. `token` grows
-- by one each time the lease changes hands; every write the holder makes
-- for the pool checks holder and token in the same transaction (fencing),
-- so a replica that lost the lease (paused, cut off) writes nothing more.
-- A released lease keeps its row (expired), so that tokens never repeat.
create table leases (
    kind        text not null check (kind in ('pool')),
    name        text not null,
    holder      text not null,
    token       bigint not null check (token >= 1),
    expires_at  timestamptz not null,
    primary key (kind, name)
);
create index leases_by_holder on leases (holder);
