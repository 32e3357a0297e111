-- Machines: one row per container of a pool.
--
-- The containers' labels in Docker are the truth about which machines
-- exist; these rows mirror them for the API and carry what Docker cannot:
-- the delete request and when the machine first became ready.

create table machines (
    -- Same as the container name; unique within one Docker engine.
    name              text primary key not null,
    pool              text not null references pools (name) on delete cascade,
    container_id      text not null,
    image             text not null,
    failure_domain    text,
    -- Container state as Docker reports it: running, exited, ...
    state             text not null,
    -- none, starting, healthy or unhealthy.
    health            text not null,
    ready             integer not null check (ready in (0, 1)),
    -- The seed's delete-machine annotation: removed first on scale-down.
    delete_requested  integer not null default 0 check (delete_requested in (0, 1)),
    -- First time the machine was seen ready; null while it is not.
    ready_since       text,
    created_at        text not null,
    updated_at        text not null
) strict;

create index machines_by_pool on machines (pool, name);
