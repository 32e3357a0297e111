-- The machine lifecycle: where a machine runs, its phase as last observed,
-- and what drover intends for it.
--
-- The engines remain the truth about which containers exist and in what
-- state; these columns mirror it for the API, except three that only drover
-- can know:
--   * terminating_since: set (in the same transaction as its event) before
--     drover asks the engine to stop the container, so that a deletion
--     interrupted by a crash or an outage is finished off by the next pass,
--     never mistaken for a machine that merely exited;
--   * restarts, failed_restarts, last_restart_at: restarts in place, which
--     set the backoff and decide when a broken machine is replaced instead.

-- Name of the engine the container runs on; `local` is the engine of
-- --docker-host (the only one before engines could be registered).
alter table machines add column engine text not null default 'local';
-- creating, starting, running, exited, paused, dead, terminating or unknown.
alter table machines add column phase text not null default 'running';
-- Exit code and OOM flag of the last run, once it has ended.
alter table machines add column exit_code integer;
alter table machines add column oom_killed integer not null default 0 check (oom_killed in (0, 1));
-- Start and end of the current (or last) run, as the engine reports them.
alter table machines add column started_at text;
alter table machines add column finished_at text;
-- Restarts in place, in all.
alter table machines add column restarts integer not null default 0;
-- Restarts in place since the machine was last ready; reset when it is.
alter table machines add column failed_restarts integer not null default 0;
alter table machines add column last_restart_at text;
alter table machines add column terminating_since text;
-- Why the deletion began: outdated, excess, broken, ...
alter table machines add column terminating_reason text;
