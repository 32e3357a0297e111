-- Declarative fleets (`POST /v1/apply`, docs/apply.md): which apply set owns
-- which object, and what the object looked like when its set last wrote it.

-- An apply set: a name a pipeline applies its documents under. `revision`
-- grows by one with every apply that writes: an apply writes only if the
-- revision is still the one it planned from, so of two applies of one set
-- at once, one commits and the other changes nothing (on PostgreSQL too:
-- the update takes the row's lock, and the loser sees the new revision).
create table apply_sets (
    name        text primary key not null,
    revision    integer not null check (revision >= 1),
    updated_at  text not null,
    -- Who applied it last (a token's name, oidc:<subject>, cert:<subject>).
    updated_by  text
) strict;

-- The objects an apply set owns. An object has at most one owner; prune
-- deletes only its set's. `stamp` is what the object was when the set
-- last wrote it (a pool's creation time and generation, an engine's or a
-- cluster's creation and update times): a different stamp now means that
-- another hand changed it since, which an apply reports as a conflict.
-- Rows are not tied to the objects by keys: an object deleted by another
-- hand leaves its row, which is how the set knows it was deleted.
create table apply_objects (
    kind        text not null check (kind in ('Pool', 'Engine', 'Cluster')),
    name        text not null,
    apply_set   text not null references apply_sets (name) on delete cascade,
    stamp       text not null,
    applied_at  text not null,
    primary key (kind, name)
) strict;
create index apply_objects_by_set on apply_objects (apply_set, kind, name);
