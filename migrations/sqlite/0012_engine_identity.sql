-- Which Docker daemon each engine reaches (the `ID` of Docker's GET /info).
-- One daemon is one failure domain: a daemon registered as two engines
-- would let a pool's spread put "two" failure domains on one host. An
-- engine whose endpoint starts reaching another daemon (a host rebuilt,
-- an address reused) takes no new machine until an admin confirms it.

-- The daemon the engine is registered as: set at registration when the
-- engine answered, else at its first answer; changed only by
-- POST /v1/engines/{name}/confirm-identity. Unique: one engine per daemon.
alter table engines add column daemon_id text;
-- What the engine's events last told of its daemon (the ID its endpoint
-- reports, and whether that is another engine's or not the one
-- registered), so that each change is told once, by whichever replica
-- saw it first.
alter table engines add column daemon_told text;
create unique index engines_by_daemon on engines (daemon_id) where daemon_id is not null;
