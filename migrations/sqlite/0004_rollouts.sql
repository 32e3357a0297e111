-- Rollouts: revisions of a pool's desired image, and batch approval.
--
-- Every change of the image a pool's machines should run (its `image`, or
-- the node image of its `version`) is a revision. Rollback returns the spec
-- to a revision's version and image, which makes a new revision: history
-- only grows, like Kubernetes' ReplicaSet revisions.

create table pool_revisions (
    pool           text not null references pools (name) on delete cascade,
    -- 1, 2, 3... per pool, in order of creation.
    revision       integer not null check (revision >= 1),
    version        text not null,
    -- The spec's custom image, null when the version's node image is used.
    image          text,
    -- What machines of this revision run.
    desired_image  text not null,
    created_at     text not null,
    primary key (pool, revision)
) strict;

-- The pool's current revision.
alter table pools add column revision integer not null default 1;
-- Batches the current rollout may run before it waits for approval
-- (strategy.batch_approval); the first is approved by the change itself.
alter table pools add column batches_approved integer not null default 1;

-- Pools that existed before revisions start at revision 1.
insert into pool_revisions (pool, revision, version, image, desired_image, created_at)
select name, 1, json_extract(spec, '$.version'), json_extract(spec, '$.image'),
       coalesce(json_extract(spec, '$.image'), 'kindest/node:' || json_extract(spec, '$.version')),
       created_at
from pools;
