-- One owner per upgrade job (issue 11).
--
-- A runner claims a job before it touches the cluster: one statement moves
-- the job to 'running' and writes the runner's id here, and only while the
-- job is pending or running. Every later write of the job is made in a
-- transaction that first checks this owner (and refreshes the heartbeat),
-- so a runner that lost its claim, or whose job was cancelled or finished,
-- can no longer write to it, nor go on to touch the cluster.

-- Which runner drives the job: `<pid>-<random>` of one drover process.
-- Null while nobody does (a new job, or after a restart released it).
alter table upgrade_jobs add column owner text;

-- When the owner last showed it is alive. A claim older than the staleness
-- limit may be taken over; a restart releases every claim at once, since
-- the data directory's lock proves that no other drover process runs.
alter table upgrade_jobs add column heartbeat_at text;
