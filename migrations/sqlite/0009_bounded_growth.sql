-- Issue 12: nothing grows without bound, and what expires is found through
-- an index rather than by scanning.

-- Refusals of requests without a valid token are audited once per burst:
-- the row of the burst's first refusal counts the whole burst. Every other
-- row stands for one request.
alter table audit add column repeats integer not null default 1 check (repeats >= 1);

-- The retention pruner deletes by age: audit records, events, idempotency
-- keys and finished upgrade jobs older than their settings.
create index audit_by_time_column on audit (time);
create index events_by_time on events (time);
create index idempotency_by_created_at on idempotency (created_at);
create index upgrade_jobs_by_finished_at on upgrade_jobs (finished_at) where finished_at is not null;
