-- Registered Kubernetes clusters and the control-plane upgrade jobs run
-- against them.
--
-- An upgrade job is a long, multi-step operation on a remote system that
-- must survive a drover restart at any moment. So everything the runner
-- needs to resume is here: where the job is (component and step), what it
-- observed before changing anything (the old pod, the DaemonSet's original
-- spec), and one row per step it ran. The runner re-reads these rows after
-- a restart and runs the current step again; every step is written to be
-- safe to repeat.

create table clusters (
    -- DNS-1123 label, chosen by the user; the primary key.
    name         text primary key not null,
    -- The API server URL. Not a secret: it is shown by the API.
    server       text not null,
    -- How drover authenticates: 'kubeconfig' or 'token'. Shown by the API.
    auth_kind    text not null check (auth_kind in ('kubeconfig', 'token')),
    -- The credentials as a JSON document (a kubeconfig, or token and CA).
    -- WRITE-ONLY: no query that feeds an API response selects this column,
    -- and it is never logged. The data directory is readable by its owner
    -- only; this is the only protection at rest.
    credentials  text not null check (json_valid(credentials)),
    created_at   text not null,
    updated_at   text not null
) strict;

create table upgrade_jobs (
    id                integer primary key autoincrement,
    -- Deleting a cluster deletes its job history (refused while a job runs).
    cluster           text not null references clusters (name) on delete cascade,
    -- Target version, vMAJOR.MINOR.PATCH.
    version           text not null,
    -- JSON array of component names, in the order they are upgraded.
    components        text not null check (json_valid(components)),
    image_repository  text not null,
    -- The version policy was bypassed on the user's request.
    force             integer not null check (force in (0, 1)),
    -- The version the cluster ran when the job was accepted (for the record).
    from_version      text,
    state             text not null check (state in ('pending', 'running', 'succeeded', 'failed', 'cancelled')),
    -- Where the job is: the index into `components` and the step (0-7) that
    -- runs next or is running. Step 0 (the pod check) runs for every
    -- component before any component is changed.
    component_index   integer not null default 0 check (component_index >= 0),
    step              integer not null default 0 check (step between 0 and 7),
    -- Set by POST /cancel; the runner honours it at the next safe point.
    cancel_requested  integer not null default 0 check (cancel_requested in (0, 1)),
    -- When the job is winding down after a failure or a cancel, what is
    -- left to do: 'rollback' (restore the saved spec, then remove the
    -- temporary DaemonSet) or 'cleanup' (remove the temporary DaemonSet).
    -- Persisted so that a restart in the middle of it finishes the job.
    wind_down         text check (wind_down in ('rollback', 'cleanup')),
    -- The state the job ends in once the wind-down is done.
    wind_down_state   text check (wind_down_state in ('failed', 'cancelled')),
    -- Why the job failed (or what cancelling left behind), for people.
    error             text,
    created_at        text not null,
    started_at        text,
    finished_at       text,
    updated_at        text not null
) strict;

-- At most one unfinished job per cluster: two jobs moving the same control
-- plane at once could leave it with no working API server. The insert
-- fails with a unique violation, which the API answers 409.
create unique index upgrade_jobs_one_active_per_cluster on upgrade_jobs (cluster)
    where state in ('pending', 'running');
create index upgrade_jobs_by_state on upgrade_jobs (state, id);
create index upgrade_jobs_by_cluster on upgrade_jobs (cluster, id desc);

-- One row per component of a job: what step 0 observed, and how it ended.
create table upgrade_components (
    job_id        integer not null references upgrade_jobs (id) on delete cascade,
    -- Position in the job's `components` array.
    position      integer not null check (position >= 0),
    component     text not null,
    -- pending, upgrading, upgraded, rolled_back, failed, skipped.
    state         text not null,
    -- The component's only pod before the upgrade, found by step 0. Step 4
    -- waits for this pod (by name) to disappear.
    old_pod       text,
    old_image     text,
    new_image     text not null,
    -- The real DaemonSet as step 0 read it (JSON), saved before step 3
    -- changes it, so that a rollback can restore exactly this spec.
    original_daemonset text check (original_daemonset is null or json_valid(original_daemonset)),
    primary key (job_id, position)
) strict;

-- One row per step of a component that has started, with its history.
create table upgrade_steps (
    job_id       integer not null references upgrade_jobs (id) on delete cascade,
    position     integer not null check (position >= 0),
    -- 0-7 are the upgrade steps; 8 is a rollback, 9 a cleanup.
    step         integer not null check (step between 0 and 9),
    name         text not null,
    state        text not null check (state in ('running', 'succeeded', 'failed')),
    -- How many times the step was started: more than one after a restart
    -- resumed it, since an interrupted step runs again from its beginning.
    attempts     integer not null default 0,
    -- API calls of this step that failed and were tried again.
    api_retries  integer not null default 0,
    started_at   text not null,
    finished_at  text,
    error        text,
    primary key (job_id, position, step)
) strict;
