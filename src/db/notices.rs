//! The change notices replicas send each other through PostgreSQL's
//! `NOTIFY` (docs/ha.md): what they say, how they are written, and the
//! statements that send them. The listener that receives them is
//! [`crate::replicas::notices`].
//!
//! - A **row** notice (`origin`, pool, row version) is sent inside every
//!   transaction that writes a pool's row, so it is delivered when, and in
//!   the order, the write commits: what keeps every replica's cache of
//!   pools current ([`super::freshness`]).
//! - **Hints** (pool X, job Y changed: a machine, an event, a step) are
//!   sent after the fact, batched: they wake event streams and the pool's
//!   driver; losing one costs latency, never correctness.
//! - A **barrier** (a number, on the replica's own channel) marks a point
//!   in the commit order for that replica's reads.

use sqlx::postgres::PgConnection;

use crate::domain::object::{Namespace, PoolRef};

/// The channel every replica listens on.
pub const CHANNEL: &str = "drover_changes";

/// One notice on [`CHANNEL`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// The pool's row was written, now at `version`; `None`: deleted.
    Row { pool: PoolRef, version: Option<i64> },
    /// Something about the pool changed (a hint).
    Pool(PoolRef),
    /// Something about upgrade job `id` changed (a hint).
    Job(i64),
}

/// The wire form of notices between replicas: `origin` TAB kind TAB
/// subject [TAB version], a pool's subject being namespace TAB name.
/// (The row notice is also written by [`rows`]' statement, in the store.)
pub fn format(origin: &str, notice: &Notice) -> String {
    match notice {
        Notice::Row { pool, version: Some(v) } => format!("{origin}\trow\t{}\t{}\t{v}", pool.namespace, pool.name),
        Notice::Row { pool, version: None } => format!("{origin}\trow\t{}\t{}\t-", pool.namespace, pool.name),
        Notice::Pool(pool) => format!("{origin}\tpool\t{}\t{}", pool.namespace, pool.name),
        Notice::Job(id) => format!("{origin}\tjob\t{id}"),
    }
}

/// The origin and the notice, decoded from the wire form [`format`]
/// writes; `None` for a payload of another format (a newer drover, a
/// person with `psql`), which is ignored.
pub fn parse(payload: &str) -> Option<(&str, Notice)> {
    let fields: Vec<&str> = payload.split('\t').collect();
    let pool = |namespace: &str, name: &str| PoolRef::new(Namespace::stored(namespace.to_owned()), name);
    let notice = match fields.as_slice() {
        [_, "row", namespace, name, "-"] => Notice::Row { pool: pool(namespace, name), version: None },
        [_, "row", namespace, name, v] => Notice::Row { pool: pool(namespace, name), version: Some(v.parse().ok()?) },
        [_, "pool", namespace, name] => Notice::Pool(pool(namespace, name)),
        [_, "job", id] => Notice::Job(id.parse().ok()?),
        _ => return None,
    };
    Some((fields[0], notice))
}

/// The channel of `replica`'s barriers: its own, so that no replica
/// receives another's. A hash keeps the name a valid identifier of any
/// replica id; stable across builds (FNV-1a).
pub fn barrier_channel(replica: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in replica.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("drover_barrier_{h:016x}")
}

/// Inside a write transaction, last before its commit: a row notice for
/// each pool in `pools`, with the version the transaction leaves it at.
pub(super) async fn rows(tx: &mut PgConnection, origin: &str, pools: &[PoolRef]) -> sqlx::Result<()> {
    let namespaces: Vec<&str> = pools.iter().map(|p| p.namespace.as_str()).collect();
    let names: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
    sqlx::query(
        "select pg_notify($1, $2 || E'\\trow\\t' || n.namespace || E'\\t' || n.name || E'\\t'
                              || coalesce(p.version::text, '-'))
         from unnest($3::text[], $4::text[]) as n(namespace, name)
         left join pools p on p.namespace = n.namespace and p.name = n.name",
    )
    .bind(CHANNEL)
    .bind(origin)
    .bind(namespaces)
    .bind(names)
    .execute(tx)
    .await
    .map(drop)
}

/// Hints, each one payload (see [`format`]), sent on [`CHANNEL`] at once.
pub async fn send_hints(store: &sqlx::PgPool, payloads: &[String]) -> sqlx::Result<()> {
    sqlx::query("select pg_notify($1, p) from unnest($2::text[]) as p")
        .bind(CHANNEL)
        .bind(payloads)
        .execute(store)
        .await
        .map(drop)
}

/// Barrier `n` on `channel`, on the barriers' own connection.
pub async fn send_barrier(conn: &mut PgConnection, channel: &str, n: u64) -> sqlx::Result<()> {
    sqlx::query("select pg_notify($1, $2)").bind(channel).bind(n.to_string()).execute(conn).await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_name_their_origin_and_subject_and_read_back() {
        let web = PoolRef::new(Namespace::parse("team-a").unwrap(), "web");
        let all = [
            Notice::Row { pool: web.clone(), version: Some(7) },
            Notice::Row { pool: web.clone(), version: None },
            Notice::Pool(web),
            Notice::Job(42),
        ];
        for n in all {
            assert_eq!(parse(&format("r1", &n)), Some(("r1", n.clone())), "{n:?}");
        }
        assert_eq!(parse("r1\tjob\tx"), None);
        assert_eq!(parse("r1\trow\tdefault\tweb\tseven"), None);
        assert_eq!(parse("r1\tpool\tdefault\tweb\t3"), None, "a hint has no version");
        assert_eq!(parse("r1\trow\tweb\t7"), None, "a notice of a pool names its namespace");
        assert_eq!(parse("garbage"), None);
    }

    #[test]
    fn each_replica_has_a_barrier_channel_of_its_own() {
        let a = barrier_channel("host-1-12-ab01");
        assert_eq!(a, barrier_channel("host-1-12-ab01"));
        assert_ne!(a, barrier_channel("host-1-12-ab02"));
        assert!(a.len() <= 63 && a.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "{a}");
    }
}
