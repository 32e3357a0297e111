-- drover's schema on PostgreSQL: the same tables, columns and rules as the
-- SQLite migrations (migrations/sqlite/0001-0009) leave, written once for
-- PostgreSQL's types. Times are timestamptz, flags boolean, counts and ids
-- bigint; JSON documents (specs, statuses, credentials, labels) stay text,
-- read and written by drover exactly as on SQLite, so that both stores hold
-- the same bytes. Later changes are new files, never edits of this one.

create table pools (
    name              text primary key,
    generation        bigint not null default 1 check (generation >= 1),
    -- The spec as the API shows it (every default filled in), and the
    -- status of the last pass: JSON documents.
    spec              text not null check (spec::jsonb is not null),
    status            text not null default '{}' check (status::jsonb is not null),
    deleting          boolean not null default false,
    -- The revision of the desired image, and the batches of its rollout
    -- approved so far.
    revision          bigint not null default 1,
    batches_approved  bigint not null default 1,
    created_at        timestamptz not null,
    updated_at        timestamptz not null
);

create table events (
    id            bigserial primary key,
    subject_kind  text not null check (subject_kind in ('pool', 'job', 'engine')),
    subject       text not null,
    time          timestamptz not null,
    type          text not null check (type in ('Normal', 'Warning')),
    reason        text not null,
    message       text not null
);
create index events_by_subject on events (subject_kind, subject, id desc);
create index events_by_time on events (time);

create table machines (
    name                text primary key,
    pool                text not null references pools (name) on delete cascade,
    engine              text not null default 'local',
    container_id        text not null,
    image               text not null,
    failure_domain      text,
    phase               text not null default 'running',
    state               text not null,
    health              text not null,
    exit_code           bigint,
    oom_killed          boolean not null default false,
    ready               boolean not null,
    delete_requested    boolean not null default false,
    ready_since         timestamptz,
    started_at          timestamptz,
    finished_at         timestamptz,
    restarts            bigint not null default 0,
    failed_restarts     bigint not null default 0,
    last_restart_at     timestamptz,
    terminating_since   timestamptz,
    terminating_reason  text,
    created_at          timestamptz not null,
    updated_at          timestamptz not null
);
create index machines_by_pool on machines (pool, name);

create table clusters (
    name         text primary key,
    server       text not null,
    auth_kind    text not null check (auth_kind in ('kubeconfig', 'token')),
    credentials  text not null check (credentials::jsonb is not null),
    created_at   timestamptz not null,
    updated_at   timestamptz not null
);

create table upgrade_jobs (
    id                bigserial primary key,
    cluster           text not null references clusters (name) on delete cascade,
    version           text not null,
    components        text not null check (components::jsonb is not null),
    image_repository  text not null,
    force             boolean not null,
    from_version      text,
    state             text not null check (state in ('pending', 'running', 'succeeded', 'failed', 'cancelled')),
    component_index   bigint not null default 0 check (component_index >= 0),
    step              bigint not null default 0 check (step between 0 and 7),
    cancel_requested  boolean not null default false,
    wind_down         text check (wind_down in ('rollback', 'cleanup')),
    wind_down_state   text check (wind_down_state in ('failed', 'cancelled')),
    error             text,
    -- The runner that drives the job (a replica), and when it last showed
    -- it is alive: the job's lease (docs/ha.md).
    owner             text,
    heartbeat_at      timestamptz,
    created_at        timestamptz not null,
    started_at        timestamptz,
    finished_at       timestamptz,
    updated_at        timestamptz not null
);
-- One active job per cluster: a second insert fails with a unique violation.
create unique index upgrade_jobs_one_active_per_cluster on upgrade_jobs (cluster)
    where state in ('pending', 'running');
create index upgrade_jobs_by_state on upgrade_jobs (state, id);
create index upgrade_jobs_by_cluster on upgrade_jobs (cluster, id desc);
create index upgrade_jobs_by_finished_at on upgrade_jobs (finished_at) where finished_at is not null;

create table upgrade_components (
    job_id              bigint not null references upgrade_jobs (id) on delete cascade,
    position            bigint not null check (position >= 0),
    component           text not null,
    state               text not null,
    old_pod             text,
    old_image           text,
    new_image           text not null,
    original_daemonset  text check (original_daemonset is null or original_daemonset::jsonb is not null),
    primary key (job_id, position)
);

create table upgrade_steps (
    job_id       bigint not null references upgrade_jobs (id) on delete cascade,
    position     bigint not null check (position >= 0),
    step         bigint not null check (step between 0 and 9),
    name         text not null,
    state        text not null check (state in ('running', 'succeeded', 'failed')),
    attempts     bigint not null default 0,
    api_retries  bigint not null default 0,
    started_at   timestamptz not null,
    finished_at  timestamptz,
    error        text,
    primary key (job_id, position, step)
);

create table pool_revisions (
    pool           text not null references pools (name) on delete cascade,
    revision       bigint not null check (revision >= 1),
    version        text not null,
    image          text,
    desired_image  text not null,
    created_at     timestamptz not null,
    primary key (pool, revision)
);

create table tokens (
    name          text primary key,
    role          text not null check (role in ('viewer', 'operator', 'admin')),
    hash          text not null unique,
    created_at    timestamptz not null,
    last_used_at  timestamptz
);

create table audit (
    id          bigserial primary key,
    time        timestamptz not null,
    token_name  text,
    role        text,
    method      text not null,
    path        text not null,
    resource    text,
    status      bigint not null,
    outcome     text not null check (outcome in ('allowed', 'unauthenticated', 'forbidden')),
    repeats     bigint not null default 1 check (repeats >= 1)
);
create index audit_by_time on audit (id desc);
create index audit_by_time_column on audit (time);

create table idempotency (
    token_name    text not null,
    key           text not null,
    method        text not null,
    path          text not null,
    body_hash     text not null,
    status        bigint,
    content_type  text,
    location      text,
    etag          text,
    body          bytea,
    created_at    timestamptz not null,
    primary key (token_name, key)
);
create index idempotency_by_created_at on idempotency (created_at);

create table engines (
    name        text primary key,
    endpoint    text not null,
    labels      text not null default '{}',
    tls_cert    text,
    tls_key     text,
    tls_ca      text,
    draining    boolean not null default false,
    created_at  timestamptz not null,
    updated_at  timestamptz not null
);
