-- Engines: the Docker engines a pool's machines may run on, beside the one
-- of --docker-host (named `local`, defined by the server's settings and not
-- stored here). Each engine is a failure domain.

create table engines (
    -- DNS-1123 label; `local` is reserved for the server's own engine.
    name        text primary key not null,
    -- unix:///path, tcp://host:port or (simulated servers only) sim://name.
    endpoint    text not null,
    -- JSON object of Kubernetes-style labels, for pools' engine selectors.
    labels      text not null default '{}',
    -- PEM documents for tcp:// with TLS; write-only: never returned by the
    -- API, written to files of mode 0600 under the data directory for the
    -- engine client, which reads them from paths.
    tls_cert    text,
    tls_key     text,
    tls_ca      text,
    -- Set by POST /v1/engines/{name}/drain: no new machine goes there, and
    -- its machines move away within each pool's rollout bounds.
    draining    integer not null default 0 check (draining in (0, 1)),
    created_at  text not null,
    updated_at  text not null
) strict;

-- Events may now be about an engine too (it stopped answering, came back,
-- was given up for lost, drained). SQLite cannot change a check constraint
-- in place, so the table is rebuilt with the same rows and ids.
create table events_new (
    id            integer primary key autoincrement,
    -- What the event is about: a pool name, an upgrade job id or an engine name.
    subject_kind  text not null check (subject_kind in ('pool', 'job', 'engine')),
    subject       text not null,
    time          text not null,
    type          text not null check (type in ('Normal', 'Warning')),
    reason        text not null,
    message       text not null
) strict;
insert into events_new (id, subject_kind, subject, time, type, reason, message)
    select id, subject_kind, subject, time, type, reason, message from events;
drop table events;
alter table events_new rename to events;
create index events_by_subject on events (subject_kind, subject, id desc);
