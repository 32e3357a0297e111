-- Pools and their event log.
--
-- A pool's spec and status are JSON documents (domain::pool::PoolSpec and
-- domain::status::PoolStatus). They are always read and written whole, and
-- keeping them as JSON lets a merge patch apply to exactly what the API
-- shows. Columns that queries filter or order on are real columns.

create table pools (
    -- DNS-1123 label; also the primary key, so names are unique.
    name        text primary key not null,
    -- Bumped by every spec change; the API's ETag. The reconciler copies it
    -- into status.observed_generation once it has acted on it.
    generation  integer not null default 1 check (generation >= 1),
    spec        text not null check (json_valid(spec)),
    status      text not null default '{}' check (json_valid(status)),
    -- Set by DELETE: the reconciler removes the machines, then the row.
    deleting    integer not null default 0 check (deleting in (0, 1)),
    created_at  text not null,
    updated_at  text not null
) strict;

-- Append-only record of what drover did, per subject.
create table events (
    id            integer primary key autoincrement,
    -- What the event is about: a pool name or an upgrade job id.
    subject_kind  text not null check (subject_kind in ('pool', 'job')),
    subject       text not null,
    time          text not null,
    type          text not null check (type in ('Normal', 'Warning')),
    -- CamelCase, stable: clients may match on it.
    reason        text not null,
    message       text not null
) strict;

-- Events are read per subject, newest first, a page at a time.
create index events_by_subject on events (subject_kind, subject, id desc);
