-- Declarative fleets (`POST /v1/apply`, docs/apply.md): the same tables as
-- migrations/sqlite/0011_apply_sets.sql, which says what each column is for.
-- With several replicas, the update of `apply_sets.revision` is what makes
-- two applies of one set at once exclusive: the second waits for the first
-- one's row lock, then finds the revision moved and changes nothing.

create table apply_sets (
    name        text primary key,
    revision    bigint not null check (revision >= 1),
    updated_at  timestamptz not null,
    updated_by  text
);

create table apply_objects (
    kind        text not null check (kind in ('Pool', 'Engine', 'Cluster')),
    name        text not null,
    apply_set   text not null references apply_sets (name) on delete cascade,
    stamp       text not null,
    applied_at  timestamptz not null,
    primary key (kind, name)
);
create index apply_objects_by_set on apply_objects (apply_set, kind, name);
