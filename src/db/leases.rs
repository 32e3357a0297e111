//! The `replicas` and `leases` tables (PostgreSQL only; see docs/ha.md).
//!
//! Every time here is the database's (`now()`): replicas on different
//! hosts agree on it, whatever their own clocks say.
//!
//! A replica's row is the lease of every pool it holds: it carries an
//! `incarnation` (drawn when the replica joins) and an `expires_at` that
//! the replica renews. A pool's lease row names the holder and its
//! incarnation and lasts as long as that row lives unexpired; the pool
//! row itself changes only when the pool changes hands (taken, given up).
//! So a renewal writes one row, whatever the number of pools held.
//!
//! A replica whose row expired is dead for good: its renewal no longer
//! matches (a row found expired is never renewed), and the first replica
//! to look deletes the row ([`bury`]), which frees its pools. A row that a
//! write transaction proving one of its leases holds ([`prove`] locks it)
//! is skipped and buried at a later look; a renewal and a deletion are
//! ordered by the row's lock: either the renewal lands first and the
//! holder lives on, or the row is gone and the renewal finds nothing. The
//! replica then joins again with a new incarnation and takes its share
//! anew, with new tokens.
//!
//! A pool lease row of a drover older than incarnations (written during a
//! rolling upgrade, by either version's older replicas) has a finite
//! `expires_at` and keeps its old meaning, held until then; a newer
//! drover's held rows are the only ones at `'infinity'`.
//!
//! Upgrade jobs' leases keep their own `expires_at`, renewed row by row
//! (a replica runs few jobs).

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

/// SQL: when replica row `r` expires: its own `expires_at`, or (a row of
/// a drover older than the replica leases, during a rolling upgrade) its
/// heartbeat and a lease, the lease's seconds being parameter `$<lease>`.
macro_rules! replica_expires {
    ($lease:literal) => {
        concat!("coalesce(r.expires_at, r.heartbeat_at + make_interval(secs => $", $lease, "))")
    };
}

/// SQL: whether a pool lease row `l` is taken: by its holder's incarnation
/// until that replica's row is buried (`'infinity'` until given up), or
/// (a row of an older drover, finite) until its own `expires_at`. An expired
/// replica's pools stay taken until [`bury`] has deleted its row: the
/// deletion, not the clock, is what a renewal in flight is ordered with.
macro_rules! taken {
    () => {
        "(l.expires_at > now() and (l.expires_at <> 'infinity' or exists (
            select 1 from replicas r where r.id = l.holder and r.incarnation = l.incarnation)))"
    };
}

/// `me` joins (again): its row gets a new incarnation and a fresh lease.
/// What it held under an earlier incarnation is lost (others may take it
/// as soon as they look; this replica takes its share anew).
pub async fn join(db: &PgPool, me: &str, lease: Duration) -> sqlx::Result<i64> {
    sqlx::query_scalar(
        "insert into replicas (id, started_at, heartbeat_at, incarnation, expires_at)
         values ($1, now(), now(), nextval('replica_incarnations'), now() + make_interval(secs => $2))
         on conflict (id) do update set heartbeat_at = now(), incarnation = excluded.incarnation,
            expires_at = excluded.expires_at
         returning incarnation",
    )
    .bind(me)
    .bind(seconds(lease))
    .fetch_one(db)
    .await
}

/// What a renewal renewed.
#[derive(Debug, Default)]
pub struct Renewal {
    /// Whether `me`'s incarnation was renewed, and with it every pool
    /// lease it holds; `false`: it had expired (or was buried), and those
    /// leases are lost.
    pub alive: bool,
    /// Every pool lease held, when asked for (read, not written).
    pub pools: Option<Vec<Held>>,
    /// How many pool leases are held, and the sum of their tokens (read,
    /// not written): a holder that knows which it holds can tell that none
    /// was lost without reading them all.
    pub pool_count: i64,
    pub pool_tokens: i64,
    /// The upgrade jobs' leases renewed.
    pub jobs: Vec<Held>,
}

/// Renews `me`'s incarnation (one row: every pool lease it holds lives on
/// with it) unless it has expired, and its leases of the upgrade jobs in
/// `jobs`, in one transaction. Returns what was renewed (the pool leases
/// listed only with `list_pools`) and the replicas alive now (`me` among
/// them when renewed), in id order. A job's lease whose run has ended
/// without giving it up is not renewed: it runs out.
pub async fn renew(
    db: &PgPool,
    me: &str,
    incarnation: i64,
    lease: Duration,
    jobs: &[i64],
    list_pools: bool,
) -> sqlx::Result<(Renewal, Vec<Alive>)> {
    let jobs: Vec<String> = jobs.iter().map(i64::to_string).collect();
    let mut tx = db.begin().await?;
    // Never a row that has expired: another replica may be taking its
    // pools over (and `bury` waits for this update, or this one for it).
    let renewed = sqlx::query(
        "update replicas set heartbeat_at = now(), expires_at = now() + make_interval(secs => $3)
         where id = $1 and incarnation = $2 and expires_at > now()",
    )
    .bind(me)
    .bind(incarnation)
    .bind(seconds(lease))
    .execute(&mut *tx)
    .await?;
    let mut held = Renewal { alive: renewed.rows_affected() == 1, ..Renewal::default() };
    held.jobs = sqlx::query_as::<_, Row>(
        "update leases set expires_at = now() + make_interval(secs => $2)
         where kind = 'job' and holder = $1 and expires_at > now() and name = any($3)
         returning kind, namespace, name, token",
    )
    .bind(me)
    .bind(seconds(lease))
    .bind(&jobs)
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .filter_map(Row::held)
    .collect();
    if list_pools && held.alive {
        let pools: Vec<Row> = sqlx::query_as(
            "select kind, namespace, name, token from leases
             where holder = $1 and kind = 'pool' and incarnation = $2 and expires_at > now()",
        )
        .bind(me)
        .bind(incarnation)
        .fetch_all(&mut *tx)
        .await?;
        held.pools = Some(pools.into_iter().filter_map(Row::held).collect());
    } else if held.alive {
        (held.pool_count, held.pool_tokens) = sqlx::query_as(
            "select count(*), coalesce(sum(token), 0)::bigint from leases
             where holder = $1 and kind = 'pool' and incarnation = $2 and expires_at > now()",
        )
        .bind(me)
        .bind(incarnation)
        .fetch_one(&mut *tx)
        .await?;
    }
    let alive: Vec<Alive> = sqlx::query_as(concat!(
        "select id, extract(epoch from ",
        replica_expires!("1"),
        " - now())::double precision as remaining from replicas r where ",
        replica_expires!("1"),
        " > now() order by id"
    ))
    .bind(seconds(lease))
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok((held, alive))
}

/// Deletes the rows of replicas that have expired: their pools are free
/// from then on. A row a write transaction holds (it proved a lease of
/// that replica, and may still commit) is skipped, not waited for: a later
/// look buries it.
pub async fn bury(db: &PgPool, lease: Duration) -> sqlx::Result<u64> {
    let done = sqlx::query(concat!(
        "delete from replicas where id in (select id from replicas r where ",
        replica_expires!("1"),
        " <= now() for update skip locked)"
    ))
    .bind(seconds(lease))
    .execute(db)
    .await?;
    Ok(done.rows_affected())
}

/// Takes the leases of `pools` that nobody holds (never taken, given up,
/// or of a buried replica) for `me`'s `incarnation`; each taken lease's
/// token is one more than the last. Returns the leases taken, and how long
/// until the first holder of the others expires, if any of them does.
pub async fn acquire(
    db: &PgPool,
    me: &str,
    incarnation: i64,
    pools: &[PoolRef],
    lease: Duration,
) -> sqlx::Result<(Vec<Held>, Option<Duration>)> {
    if pools.is_empty() {
        return Ok((Vec::new(), None));
    }
    let (namespaces, names) = arrays(pools);
    let mut tx = db.begin().await?;
    // Only while this incarnation lives (its row locked against a burial
    // until this transaction ends): a replica paused between its renewal
    // and here, and buried meanwhile, must not take pools back under it.
    let alive: Option<i32> = sqlx::query_scalar(
        "select 1 from replicas where id = $1 and incarnation = $2 and expires_at > now() for key share",
    )
    .bind(me)
    .bind(incarnation)
    .fetch_optional(&mut *tx)
    .await?;
    if alive.is_none() {
        return Ok((Vec::new(), None));
    }
    // New rows for leases never taken; free ones change hands, each only
    // if its token is still the one seen free (a row taken by another
    // since this statement's snapshot has a new token, which the re-check
    // of the locked row sees, whereas the liveness of its holder is read
    // from the snapshot). A row locked by another transaction is skipped,
    // never waited for: its holder may be frozen inside a write that
    // proved the lease (until the server ends that session), and one such
    // pool must not hold up this round.
    let taken: Vec<Row> = sqlx::query_as(concat!(
        "with wanted as (select * from unnest($4::text[], $1::text[]) as w(namespace, name)),
         fresh as (
            insert into leases (kind, namespace, name, holder, token, expires_at, incarnation)
            select 'pool', namespace, name, $2, 1, 'infinity', $3 from wanted
            on conflict (kind, namespace, name) do nothing
            returning kind, namespace, name, token
         ), loose as materialized (
            select l.kind, l.namespace, l.name, l.token from leases l join wanted w
                on l.namespace = w.namespace and l.name = w.name
            where l.kind = 'pool' and not ",
        taken!(),
        "
         ), freed as (
            update leases set holder = $2, token = token + 1, expires_at = 'infinity', incarnation = $3
            where (kind, namespace, name) in (
                select l.kind, l.namespace, l.name from leases l join loose f
                    on l.kind = f.kind and l.namespace = f.namespace and l.name = f.name and l.token = f.token
                for update of l skip locked)
            returning kind, namespace, name, token
         )
         select * from fresh union all select * from freed"
    ))
    .bind(&names)
    .bind(me)
    .bind(incarnation)
    .bind(&namespaces)
    .fetch_all(&mut *tx)
    .await?;
    // When the first of the other holders expires: its row is buried at
    // the next look after that, and its pools are free.
    // (A holder expired but not buried yet, its row held by a write in
    // flight, is left to the next tick rather than looked at again at once.)
    let next: Option<f64> = sqlx::query_scalar(concat!(
        "select extract(epoch from min(ends) - now())::double precision from (
            select case when l.expires_at <> 'infinity' then l.expires_at else ",
        replica_expires!("4"),
        " end as ends
            from leases l join unnest($3::text[], $1::text[]) as w(namespace, name)
                on l.namespace = w.namespace and l.name = w.name
            left join replicas r on r.id = l.holder and r.incarnation = l.incarnation
            where l.kind = 'pool' and l.holder != $2 and l.expires_at > now()) as held
         where ends > now()"
    ))
    .bind(&names)
    .bind(me)
    .bind(&namespaces)
    .bind(seconds(lease))
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
/// `key` with `token`, unexpired. The rows are locked until the
/// transaction ends, so no other replica can take the lease over before
/// this transaction's writes are committed: the lease's row for share,
/// and, for a pool, the holder's replica row for key share ([`bury`] waits
/// for it; the holder's renewal does not). (SQLite has no leases: one
/// process holds the store.)
pub async fn prove(tx: &mut WriteTx, key: &Key, holder: &str, token: i64) -> sqlx::Result<bool> {
    let Exec::Pg(tx) = tx.exec() else { return Ok(true) };
    let (kind, namespace, name) = key.columns();
    let sql = match key {
        Key::Pool(_) => {
            "select 1 from leases l join replicas r on r.id = l.holder and r.incarnation = l.incarnation
             where l.kind = $4 and l.namespace = $5 and l.name = $1 and l.holder = $2 and l.token = $3
                and l.expires_at > now() and r.expires_at > now()
             for share of l for key share of r"
        }
        Key::Job(_) => {
            "select 1 from leases where kind = $4 and namespace = $5 and name = $1 and holder = $2 and token = $3
                and expires_at > now() for share"
        }
    };
    let row: Option<i32> = sqlx::query_scalar(sql)
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
    sqlx::query_as(concat!(
        "select r.id, count(l.name) from replicas r
         left join leases l on l.holder = r.id and l.kind = 'pool' and l.expires_at > now()
            and (l.incarnation = r.incarnation or l.expires_at <> 'infinity')
         where ",
        replica_expires!("1"),
        " > now() group by r.id order by r.id"
    ))
    .bind(seconds(lease))
    .fetch_all(db)
    .await
}

/// Forgets the leases of pools deleted over an hour ago (a pool created
/// again within the hour keeps counting tokens up), or whose holder is
/// buried, and of jobs that ended (nobody claims them again).
pub async fn forget_deleted(db: &PgPool) -> sqlx::Result<u64> {
    let done = sqlx::query(
        "delete from leases where (
            kind = 'pool' and not exists (select 1 from pools
                where pools.namespace = leases.namespace and pools.name = leases.name)
            and (expires_at < now() - interval '1 hour' or (expires_at = 'infinity' and not exists (select 1 from replicas r
                where r.id = leases.holder and r.incarnation = leases.incarnation))))
         or (kind = 'job' and expires_at < now() - interval '1 hour' and not exists (select 1 from upgrade_jobs j
                where cast(j.id as text) = leases.name and j.state in ('pending', 'running')))",
    )
    .execute(db)
    .await?;
    Ok(done.rows_affected())
}
