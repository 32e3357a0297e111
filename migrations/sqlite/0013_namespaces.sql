-- no-transaction
-- Namespaces (docs/access.md): every pool, cluster, upgrade job and apply
-- set belongs to one; names are unique within a namespace, so two teams may
-- each have a pool `web`. What exists moves into `default`. Tokens get
-- grants (a namespace, or `*`, and a role) instead of one global role.
--
-- A primary key changes, so tables are rebuilt; SQLite applies a rebuild
-- only with foreign keys off (dropping a table with them on would cascade
-- to its children), which a transaction cannot switch: this migration runs
-- outside sqlx's transaction and opens its own.
pragma foreign_keys = off;
begin;

-- A namespace, and the engines its pools may use (labels every engine of
-- theirs must carry; empty: any engine).
create table namespaces (
    name             text primary key not null,
    engine_selector  text not null default '{}' check (json_valid(engine_selector)),
    created_at       text not null,
    updated_at       text not null
) strict;
insert into namespaces (name, created_at, updated_at)
    values ('default', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), strftime('%Y-%m-%dT%H:%M:%fZ', 'now'));

create table pools_new (
    namespace         text not null default 'default' references namespaces (name),
    name              text not null,
    generation        integer not null default 1 check (generation >= 1),
    spec              text not null check (json_valid(spec)),
    status            text not null default '{}' check (json_valid(status)),
    deleting          integer not null default 0 check (deleting in (0, 1)),
    created_at        text not null,
    updated_at        text not null,
    revision          integer not null default 1,
    batches_approved  integer not null default 1,
    version           integer not null default 1 check (version >= 1),
    primary key (namespace, name)
) strict;
insert into pools_new (namespace, name, generation, spec, status, deleting, created_at, updated_at, revision,
                       batches_approved, version)
    select 'default', name, generation, spec, status, deleting, created_at, updated_at, revision, batches_approved,
           version
    from pools;

create table machines_new (
    name                text primary key not null,
    namespace           text not null default 'default',
    pool                text not null,
    container_id        text not null,
    image               text not null,
    failure_domain      text,
    state               text not null,
    health              text not null,
    ready               integer not null check (ready in (0, 1)),
    delete_requested    integer not null default 0 check (delete_requested in (0, 1)),
    ready_since         text,
    created_at          text not null,
    updated_at          text not null,
    engine              text not null default 'local',
    phase               text not null default 'running',
    exit_code           integer,
    oom_killed          integer not null default 0 check (oom_killed in (0, 1)),
    started_at          text,
    finished_at         text,
    restarts            integer not null default 0,
    failed_restarts     integer not null default 0,
    last_restart_at     text,
    terminating_since   text,
    terminating_reason  text,
    foreign key (namespace, pool) references pools (namespace, name) on delete cascade
) strict;
insert into machines_new (name, namespace, pool, container_id, image, failure_domain, state, health, ready,
                          delete_requested, ready_since, created_at, updated_at, engine, phase, exit_code,
                          oom_killed, started_at, finished_at, restarts, failed_restarts, last_restart_at,
                          terminating_since, terminating_reason)
    select name, 'default', pool, container_id, image, failure_domain, state, health, ready, delete_requested,
           ready_since, created_at, updated_at, engine, phase, exit_code, oom_killed, started_at, finished_at,
           restarts, failed_restarts, last_restart_at, terminating_since, terminating_reason
    from machines;

create table pool_revisions_new (
    namespace      text not null default 'default',
    pool           text not null,
    revision       integer not null check (revision >= 1),
    version        text not null,
    image          text,
    desired_image  text not null,
    created_at     text not null,
    primary key (namespace, pool, revision),
    foreign key (namespace, pool) references pools (namespace, name) on delete cascade
) strict;
insert into pool_revisions_new (namespace, pool, revision, version, image, desired_image, created_at)
    select 'default', pool, revision, version, image, desired_image, created_at from pool_revisions;

create table clusters_new (
    namespace    text not null default 'default' references namespaces (name),
    name         text not null,
    server       text not null,
    auth_kind    text not null check (auth_kind in ('kubeconfig', 'token')),
    -- WRITE-ONLY, as before (0003).
    credentials  text not null check (json_valid(credentials)),
    created_at   text not null,
    updated_at   text not null,
    primary key (namespace, name)
) strict;
insert into clusters_new (namespace, name, server, auth_kind, credentials, created_at, updated_at)
    select 'default', name, server, auth_kind, credentials, created_at, updated_at from clusters;

create table upgrade_jobs_new (
    id                integer primary key autoincrement,
    namespace         text not null default 'default',
    cluster           text not null,
    version           text not null,
    components        text not null check (json_valid(components)),
    image_repository  text not null,
    force             integer not null check (force in (0, 1)),
    from_version      text,
    state             text not null check (state in ('pending', 'running', 'succeeded', 'failed', 'cancelled')),
    component_index   integer not null default 0 check (component_index >= 0),
    step              integer not null default 0 check (step between 0 and 7),
    cancel_requested  integer not null default 0 check (cancel_requested in (0, 1)),
    wind_down         text check (wind_down in ('rollback', 'cleanup')),
    wind_down_state   text check (wind_down_state in ('failed', 'cancelled')),
    error             text,
    created_at        text not null,
    started_at        text,
    finished_at       text,
    updated_at        text not null,
    owner             text,
    heartbeat_at      text,
    foreign key (namespace, cluster) references clusters (namespace, name) on delete cascade
) strict;
insert into upgrade_jobs_new (id, namespace, cluster, version, components, image_repository, force, from_version,
                              state, component_index, step, cancel_requested, wind_down, wind_down_state, error,
                              created_at, started_at, finished_at, updated_at, owner, heartbeat_at)
    select id, 'default', cluster, version, components, image_repository, force, from_version, state,
           component_index, step, cancel_requested, wind_down, wind_down_state, error, created_at, started_at,
           finished_at, updated_at, owner, heartbeat_at
    from upgrade_jobs;

create table apply_sets_new (
    namespace   text not null default 'default' references namespaces (name),
    name        text not null,
    revision    integer not null check (revision >= 1),
    updated_at  text not null,
    updated_by  text,
    primary key (namespace, name)
) strict;
insert into apply_sets_new (namespace, name, revision, updated_at, updated_by)
    select 'default', name, revision, updated_at, updated_by from apply_sets;

-- An object's namespace is its set's for pools and clusters; engines
-- belong to no namespace (''), whichever set owns them.
create table apply_objects_new (
    kind           text not null check (kind in ('Pool', 'Engine', 'Cluster')),
    namespace      text not null,
    name           text not null,
    set_namespace  text not null default 'default',
    apply_set      text not null,
    stamp          text not null,
    applied_at     text not null,
    primary key (kind, namespace, name),
    foreign key (set_namespace, apply_set) references apply_sets (namespace, name) on delete cascade
) strict;
insert into apply_objects_new (kind, namespace, name, set_namespace, apply_set, stamp, applied_at)
    select kind, case kind when 'Engine' then '' else 'default' end, name, 'default', apply_set, stamp, applied_at
    from apply_objects;

-- A token's grants replace its one role: what it had becomes a grant on
-- every namespace (`*`). `namespace`: the namespace whose admins manage
-- the token; null for a global token (managed by admins of `*`).
create table tokens_new (
    name          text primary key not null,
    namespace     text references namespaces (name),
    hash          text not null unique,
    created_at    text not null,
    last_used_at  text
) strict;
insert into tokens_new (name, namespace, hash, created_at, last_used_at)
    select name, null, hash, created_at, last_used_at from tokens;
create table token_grants (
    token_name  text not null references tokens (name) on delete cascade,
    -- A namespace's name, or `*` for every namespace.
    namespace   text not null,
    role        text not null check (role in ('viewer', 'operator', 'admin')),
    primary key (token_name, namespace)
) strict;
insert into token_grants (token_name, namespace, role) select name, '*', role from tokens;

drop table machines;
drop table pool_revisions;
drop table upgrade_jobs;
drop table pools;
drop table clusters;
drop table apply_objects;
drop table apply_sets;
drop table tokens;
alter table pools_new rename to pools;
alter table machines_new rename to machines;
alter table pool_revisions_new rename to pool_revisions;
alter table clusters_new rename to clusters;
alter table upgrade_jobs_new rename to upgrade_jobs;
alter table apply_sets_new rename to apply_sets;
alter table apply_objects_new rename to apply_objects;
alter table tokens_new rename to tokens;

create index machines_by_pool on machines (namespace, pool, name);
create unique index upgrade_jobs_one_active_per_cluster on upgrade_jobs (namespace, cluster)
    where state in ('pending', 'running');
create index upgrade_jobs_by_state on upgrade_jobs (state, id);
create index upgrade_jobs_by_cluster on upgrade_jobs (namespace, cluster, id desc);
create index upgrade_jobs_by_finished_at on upgrade_jobs (finished_at) where finished_at is not null;
create index apply_objects_by_set on apply_objects (set_namespace, apply_set, kind, name);
create index tokens_by_namespace on tokens (namespace, name);

-- A pool's events name its namespace too ('' for a job's, whose id is
-- unique across namespaces, and an engine's).
alter table events add column namespace text not null default '';
update events set namespace = 'default' where subject_kind = 'pool';
drop index events_by_subject;
create index events_by_subject on events (subject_kind, namespace, subject, id desc);

-- Who was refused what, where (the authorizer's refusals name them).
alter table audit add column namespace text;
alter table audit add column action text;

commit;
pragma foreign_keys = on;
