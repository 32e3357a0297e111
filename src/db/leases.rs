//! The `replicas` and `leases` tables (PostgreSQL only; see docs/ha.md).
//!
//! Every time here is the database's (`now()`): replicas on different
//! hosts agree on it, whatever their own clocks say. A lease is renewed
//! and a heartbeat stamped in one transaction, so a replica counts as alive
//! exactly as long as the leases it renewed last.

use std::time::Duration;

use sqlx::PgPool;

use super::exec::Exec;
use super::gate::WriteTx;
use crate::domain::object::{Namespace, PoolRef};

/// What a lease is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Pool,
    Job,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Pool => "pool",
            Kind::Job => "job",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "pool" => Some(Kind::Pool),
            "job" => Some(Kind::Job),
            _ => None,
        }
    }
}

/// One lease: of a pool, or of an upgrade job.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    Pool(PoolRef),
    Job(i64),
}

impl Key {
    pub fn pool(pool: &PoolRef) -> Self {
        Key::Pool(pool.clone())
    }

    pub fn job(id: i64) -> Self {
        Key::Job(id)
    }

    pub fn kind(&self) -> Kind {
        match self {
            Key::Pool(_) => Kind::Pool,
            Key::Job(_) => Kind::Job,
        }
    }

    /// How the store keeps it: kind, namespace (`''` for a job, whose id
    /// is unique across namespaces) and name.
    fn columns(&self) -> (&'static str, &str, String) {
        match self {
            Key::Pool(p) => ("pool", p.namespace.as_str(), p.name.clone()),
            Key::Job(id) => ("job", "", id.to_string()),
        }
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Key::Pool(p) => write!(f, "pool {p}"),
            Key::Job(id) => write!(f, "upgrade job {id}"),
        }
    }
}

/// A lease as its holder knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub key: Key,
    pub token: i64,
}

#[derive(sqlx::FromRow)]
struct Row {
    kind: String,
    namespace: String,
    name: String,
    token: i64,
}

impl Row {
    fn held(self) -> Option<Held> {
        let key = match self.kind.as_str() {
            "pool" => Key::Pool(PoolRef::new(Namespace::stored(self.namespace), self.name)),
            "job" => Key::Job(self.name.parse().ok()?),
            _ => return None,
        };
        Some(Held { key, token: self.token })
    }
}

/// Pools as two arrays (namespaces, names) for `unnest`.
fn arrays(pools: &[PoolRef]) -> (Vec<&str>, Vec<&str>) {
    pools.iter().map(|p| (p.namespace.as_str(), p.name.as_str())).unzip()
}

fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// A replica alive now, and how long it stays so unless it renews.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Alive {
    pub id: String,
    pub remaining: f64,
}

/// What a renewal renewed: the pool leases, in full or summed up, and
/// the job leases in full.
#[derive(Debug, Default)]
pub struct Renewal {
    /// Every pool lease renewed, when asked for.
    pub pools: Option<Vec<Held>>,
    /// How many pool leases were renewed, and the sum of their tokens: a
    /// holder that knows which it holds can tell that none was lost
    /// without reading them all.
    pub pool_count: i64,
    pub pool_tokens: i64,
    pub jobs: Vec<Held>,
}

/// Stamps `me` alive and renews every pool lease it still holds
/// (unexpired) and its leases of the upgrade jobs in `jobs`, in one
/// transaction. Returns what was renewed (the pool leases listed only
/// with `list_pools`) and the replicas alive now (`me` among them), in id
/// order. A job's lease whose run has ended without giving it up is not
/// renewed: it runs out.
pub async fn renew(
    db: &PgPool,
    me: &str,
    lease: Duration,
    jobs: &[i64],
    list_pools: bool,
) -> sqlx::Result<(Renewal, Vec<Alive>)> {
    let jobs: Vec<String> = jobs.iter().map(i64::to_string).collect();
    let mut tx = db.begin().await?;
    sqlx::query(
        "insert into replicas (id, started_at, heartbeat_at) values ($1, now(), now())
         on conflict (id) do update set heartbeat_at = now()",
    )
    .bind(me)
    .execute(&mut *tx)
    .await?;
    let renewed: Vec<Row> = sqlx::query_as(
        "with renewed as (
            update leases set expires_at = now() + make_interval(secs => $2)
            where holder = $1 and expires_at > now() and (kind = 'pool' or name = any($3))
            returning kind, namespace, name, token
         )
         select kind, namespace, name, token from renewed where kind = 'job' or $4
         union all
         select 'pools', '', '', count(*) from renewed where kind = 'pool'
         union all
         select 'tokens', '', '', coalesce(sum(token), 0)::bigint from renewed where kind = 'pool'",
    )
    .bind(me)
    .bind(seconds(lease))
    .bind(&jobs)
    .bind(list_pools)
    .fetch_all(&mut *tx)
    .await?;
    let mut held = Renewal { pools: list_pools.then(Vec::new), ..Renewal::default() };
    for r in renewed {
        match r.kind.as_str() {
            "pools" => held.pool_count = r.token,
            "tokens" => held.pool_tokens = r.token,
            "job" => held.jobs.extend(r.held()),
            _ => held.pools.get_or_insert_with(Vec::new).extend(r.held()),
        }
    }
    let alive: Vec<Alive> = sqlx::query_as(
        "select id, extract(epoch from heartbeat_at + make_interval(secs => $1) - now())::double precision as remaining
         from replicas where heartbeat_at > now() - make_interval(secs => $1) order by id",
    )
    .bind(seconds(lease))
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok((held, alive))
}

/// Takes the leases of `names` that nobody holds (never taken, released,
/// or expired) for `me`; each taken lease's token is one more than the
/// last. Returns the leases taken, and how long until the first of the
/// others (held by someone else) expires, if any of them does.
pub async fn acquire(
    db: &PgPool,
    me: &str,
    pools: &[PoolRef],
    lease: Duration,
) -> sqlx::Result<(Vec<Held>, Option<Duration>)> {
    if pools.is_empty() {
        return Ok((Vec::new(), None));
    }
    let (namespaces, names) = arrays(pools);
    let mut tx = db.begin().await?;
    // New rows for leases never taken; released or expired ones change
    // hands. A row locked by another transaction is skipped, never waited
    // for: its holder may be frozen inside a write that proved the lease
    // (until the server ends that session), and one such pool must not
    // hold up this round, whose next step is renewing every other lease.
    let taken: Vec<Row> = sqlx::query_as(
        "with wanted as (select * from unnest($4::text[], $1::text[]) as w(namespace, name)),
         fresh as (
            insert into leases (kind, namespace, name, holder, token, expires_at)
            select 'pool', namespace, name, $2, 1, now() + make_interval(secs => $3) from wanted
            on conflict (kind, namespace, name) do nothing
            returning kind, namespace, name, token
         ), freed as (
            update leases set holder = $2, token = token + 1, expires_at = now() + make_interval(secs => $3)
            where (kind, namespace, name) in (
                select l.kind, l.namespace, l.name from leases l join wanted w
                    on l.namespace = w.namespace and l.name = w.name
                where l.kind = 'pool' and l.expires_at <= now()
                for update of l skip locked)
            returning kind, namespace, name, token
         )
         select * from fresh union all select * from freed",
    )
    .bind(&names)
    .bind(me)
    .bind(seconds(lease))
    .bind(&namespaces)
    .fetch_all(&mut *tx)
    .await?;
    let next: Option<f64> = sqlx::query_scalar(
        "select extract(epoch from min(expires_at) - now())::double precision
         from leases l join unnest($3::text[], $1::text[]) as w(namespace, name)
            on l.namespace = w.namespace and l.name = w.name
         where l.kind = 'pool' and l.holder != $2 and l.expires_at > now()",
    )
    .bind(&names)
    .bind(me)
    .bind(&namespaces)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok((taken.into_iter().filter_map(Row::held).collect(), next.map(|s| Duration::from_secs_f64(s.max(0.0)))))
}

/// Gives up `me`'s leases of `pools` at once: they expire now and keep
/// their token, so the next holder's is higher.
pub async fn release(db: &PgPool, me: &str, pools: &[PoolRef]) -> sqlx::Result<u64> {
    let (namespaces, names) = arrays(pools);
    let done = sqlx::query(
        "update leases l set expires_at = now()
         from unnest($3::text[], $1::text[]) as w(namespace, name)
         where l.kind = 'pool' and l.namespace = w.namespace and l.name = w.name
           and l.holder = $2 and l.expires_at > now()",
    )
    .bind(&names)
    .bind(me)
    .bind(&namespaces)
    .execute(db)
    .await?;
    Ok(done.rows_affected())
}

/// Inside a write transaction: takes the lease of `key` for `me` unless
/// another holds it unexpired (by the database's clock); its token grows
/// by one. `None`: held by another. A row locked by another transaction
/// (a write proving the lease) is waited for, not skipped: the lease may
/// be free once it ends.
pub async fn take(tx: &mut WriteTx, key: &Key, me: &str, lease: Duration) -> sqlx::Result<Option<i64>> {
    let Exec::Pg(tx) = tx.exec() else { return Ok(Some(1)) };
    let (kind, namespace, name) = key.columns();
    sqlx::query_scalar(
        "insert into leases (kind, namespace, name, holder, token, expires_at)
         values ($1, $5, $2, $3, 1, now() + make_interval(secs => $4))
         on conflict (kind, namespace, name) do update
            set holder = $3, token = leases.token + 1, expires_at = now() + make_interval(secs => $4)
            where leases.expires_at <= now() or leases.holder = $3
         returning token",
    )
    .bind(kind)
    .bind(&name)
    .bind(me)
    .bind(seconds(lease))
    .bind(namespace)
    .fetch_optional(tx)
    .await
}

/// Inside a write transaction: `me`'s lease of `key` with `token` expires
/// now (its row and token stay, so the next holder's token is higher).
pub async fn give_up(tx: &mut WriteTx, key: &Key, me: &str, token: i64) -> sqlx::Result<()> {
    let Exec::Pg(tx) = tx.exec() else { return Ok(()) };
    let (kind, namespace, name) = key.columns();
    sqlx::query(
        "update leases set expires_at = now()
         where kind = $1 and namespace = $5 and name = $2 and holder = $3 and token = $4 and expires_at > now()",
    )
    .bind(kind)
    .bind(&name)
    .bind(me)
    .bind(token)
    .bind(namespace)
    .execute(tx)
    .await
    .map(drop)
}

/// `me` stops: every lease it holds expires now and it is no longer alive,
/// so the others take its pools at their next look instead of a lease
/// duration later.
pub async fn leave(db: &PgPool, me: &str) -> sqlx::Result<()> {
    let mut tx = db.begin().await?;
    sqlx::query("update leases set expires_at = now() where holder = $1 and expires_at > now()")
        .bind(me)
        .execute(&mut *tx)
        .await?;
    sqlx::query("delete from replicas where id = $1").bind(me).execute(&mut *tx).await?;
    tx.commit().await
}

/// Those of `pools` that exist (by their keys: one index probe each).
pub async fn existing(db: &PgPool, pools: &[PoolRef]) -> sqlx::Result<Vec<PoolRef>> {
    let (namespaces, names) = arrays(pools);
    let rows: Vec<(String, String)> = sqlx::query_as(
        "select p.namespace, p.name from unnest($1::text[], $2::text[]) as w(namespace, name)
         join pools p on p.namespace = w.namespace and p.name = w.name",
    )
    .bind(&namespaces)
    .bind(&names)
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(|(ns, name)| PoolRef::new(Namespace::stored(ns), name)).collect())
}

/// Every pool, for spreading them over the replicas.
pub async fn pools(db: &PgPool) -> sqlx::Result<Vec<PoolRef>> {
    let rows: Vec<(String, String)> =
        sqlx::query_as("select namespace, name from pools order by namespace, name").fetch_all(db).await?;
    Ok(rows.into_iter().map(|(ns, name)| PoolRef::new(Namespace::stored(ns), name)).collect())
}

/// Inside a write transaction: whether `holder` still holds the lease of
/// `key` with `token`, unexpired. The row is locked for share until the
/// transaction ends, so no other replica can take the lease over before
/// this transaction's writes are committed. (SQLite has no leases: one
/// process holds the store.)
pub async fn prove(tx: &mut WriteTx, key: &Key, holder: &str, token: i64) -> sqlx::Result<bool> {
    let Exec::Pg(tx) = tx.exec() else { return Ok(true) };
    let (kind, namespace, name) = key.columns();
    let row: Option<i32> = sqlx::query_scalar(
        "select 1 from leases where kind = $4 and namespace = $5 and name = $1 and holder = $2 and token = $3
            and expires_at > now() for share",
    )
    .bind(&name)
    .bind(holder)
    .bind(token)
    .bind(kind)
    .bind(namespace)
    .fetch_optional(tx)
    .await?;
    Ok(row.is_some())
}

/// Pool leases held now by each replica alive (those holding none
/// included), in id order.
pub async fn counts(db: &PgPool, lease: Duration) -> sqlx::Result<Vec<(String, i64)>> {
    sqlx::query_as(
        "select r.id, count(l.name) from replicas r
         left join leases l on l.holder = r.id and l.kind = 'pool' and l.expires_at > now()
         where r.heartbeat_at > now() - make_interval(secs => $1)
         group by r.id order by r.id",
    )
    .bind(seconds(lease))
    .fetch_all(db)
    .await
}

/// Forgets the leases of pools deleted over an hour ago (a pool created
/// again within the hour keeps counting tokens up) and of jobs that ended
/// (nobody claims them again).
pub async fn forget_deleted(db: &PgPool) -> sqlx::Result<u64> {
    let done = sqlx::query(
        "delete from leases where expires_at < now() - interval '1 hour' and (
            (kind = 'pool' and not exists (select 1 from pools
                where pools.namespace = leases.namespace and pools.name = leases.name))
            or (kind = 'job' and not exists (select 1 from upgrade_jobs j
                where cast(j.id as text) = leases.name and j.state in ('pending', 'running'))))",
    )
    .execute(db)
    .await?;
    Ok(done.rows_affected())
}
