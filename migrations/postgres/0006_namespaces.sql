-- Namespaces and tokens' grants: the same tables and columns as
-- migrations/sqlite/0013_namespaces.sql, which says what each is for.
-- PostgreSQL changes primary keys in place.

create table namespaces (
    name             text primary key,
    engine_selector  text not null default '{}' check (engine_selector::jsonb is not null),
    created_at       timestamptz not null,
    updated_at       timestamptz not null
);
insert into namespaces (name, created_at, updated_at) values ('default', now(), now());

-- Children let go of their parents' keys while those change.
alter table machines drop constraint machines_pool_fkey;
alter table pool_revisions drop constraint pool_revisions_pool_fkey;
alter table upgrade_jobs drop constraint upgrade_jobs_cluster_fkey;
alter table apply_objects drop constraint apply_objects_apply_set_fkey;

alter table pools add column namespace text not null default 'default' references namespaces (name);
alter table pools drop constraint pools_pkey;
alter table pools add primary key (namespace, name);

alter table machines add column namespace text not null default 'default';
alter table machines add foreign key (namespace, pool) references pools (namespace, name) on delete cascade;
drop index machines_by_pool;
create index machines_by_pool on machines (namespace, pool, name);

alter table pool_revisions add column namespace text not null default 'default';
alter table pool_revisions drop constraint pool_revisions_pkey;
alter table pool_revisions add primary key (namespace, pool, revision);
alter table pool_revisions add foreign key (namespace, pool) references pools (namespace, name) on delete cascade;

alter table clusters add column namespace text not null default 'default' references namespaces (name);
alter table clusters drop constraint clusters_pkey;
alter table clusters add primary key (namespace, name);

alter table upgrade_jobs add column namespace text not null default 'default';
alter table upgrade_jobs add foreign key (namespace, cluster) references clusters (namespace, name) on delete cascade;
drop index upgrade_jobs_one_active_per_cluster;
create unique index upgrade_jobs_one_active_per_cluster on upgrade_jobs (namespace, cluster)
    where state in ('pending', 'running');
drop index upgrade_jobs_by_cluster;
create index upgrade_jobs_by_cluster on upgrade_jobs (namespace, cluster, id desc);

alter table apply_sets add column namespace text not null default 'default' references namespaces (name);
alter table apply_sets drop constraint apply_sets_pkey;
alter table apply_sets add primary key (namespace, name);

alter table apply_objects add column namespace text not null default '';
update apply_objects set namespace = 'default' where kind <> 'Engine';
alter table apply_objects alter column namespace drop default;
alter table apply_objects add column set_namespace text not null default 'default';
alter table apply_objects drop constraint apply_objects_pkey;
alter table apply_objects add primary key (kind, namespace, name);
alter table apply_objects add foreign key (set_namespace, apply_set) references apply_sets (namespace, name)
    on delete cascade;
drop index apply_objects_by_set;
create index apply_objects_by_set on apply_objects (set_namespace, apply_set, kind, name);

alter table tokens add column namespace text references namespaces (name);
create table token_grants (
    token_name  text not null references tokens (name) on delete cascade,
    namespace   text not null,
    role        text not null check (role in ('viewer', 'operator', 'admin')),
    primary key (token_name, namespace)
);
insert into token_grants (token_name, namespace, role) select name, '*', role from tokens;
alter table tokens drop column role;
create index tokens_by_namespace on tokens (namespace, name);

alter table events add column namespace text not null default '';
update events set namespace = 'default' where subject_kind = 'pool';
drop index events_by_subject;
create index events_by_subject on events (subject_kind, namespace, subject, id desc);

alter table audit add column namespace text;
alter table audit add column action text;

-- A pool's lease names its namespace too ('' for a job's).
alter table leases add column namespace text not null default '';
update leases set namespace = 'default' where kind = 'pool';
alter table leases drop constraint leases_pkey;
alter table leases add primary key (kind, namespace, name);
