//! The change notices replicas send each other through PostgreSQL's
//! `NOTIFY` (docs/ha.md): what they say, how they are written, and the
//! statements that send them. The listener that receives them is
//! [`crate::replicas::listener`].
//!
//! - A **row** notice (`origin`, pool, row version, and the W3C trace
//!   context of the work that wrote it) is sent inside every transaction
//!   that writes a pool's row, so it is delivered when, and in the order,
//!   the write commits: what keeps every replica's cache of pools current
//!   ([`super::freshness`]), and what links the pass of the replica that
//!   drives the pool to the request another replica accepted.
//! - **Hints** (pool X, job Y changed: a machine, an event, a step) are
//!   sent after the fact, batched: they wake event streams and the pool's
//!   driver; losing one costs latency, never correctness.
//! - A **barrier** (a number, on the replica's own channel) marks a point
//!   in the commit order for that replica's reads.

use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
use sqlx::postgres::PgConnection;

use crate::domain::object::{Namespace, PoolRef};

/// The channel every replica listens on.
pub const CHANNEL: &str = "drover_changes";

/// One notice on [`CHANNEL`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// The pool's row was written, now at `version` (`None`: deleted), by
    /// the work of span `by` (a request's, a pass's), when it was traced.
    Row { pool: PoolRef, version: Option<i64>, by: Option<SpanContext> },
    /// Something about the pool changed (a hint).
    Pool(PoolRef),
    /// Something about upgrade job `id` changed (a hint).
    Job(i64),
}

/// The wire form of notices between replicas: `origin` TAB kind TAB
/// subject [TAB version [TAB traceparent]], a pool's subject being
/// namespace TAB name. (The row notice is also written by [`rows`]'
/// statement, in the store.)
pub fn format(origin: &str, notice: &Notice) -> String {
    match notice {
        Notice::Row { pool, version, by } => {
            let version = version.map_or_else(|| "-".to_owned(), |v| v.to_string());
            let by = by.as_ref().map(|sc| format!("\t{}", traceparent(sc))).unwrap_or_default();
            format!("{origin}\trow\t{}\t{}\t{version}{by}", pool.namespace, pool.name)
        }
        Notice::Pool(pool) => format!("{origin}\tpool\t{}\t{}", pool.namespace, pool.name),
        Notice::Job(id) => format!("{origin}\tjob\t{id}"),
    }
}

/// The origin and the notice, decoded from the wire form [`format`]
/// writes; `None` for a payload of another format (a newer drover, a
/// person with `psql`), which is ignored. A row notice whose trace context
/// does not read is still a row notice (the cache must hear it).
pub fn parse(payload: &str) -> Option<(&str, Notice)> {
    let fields: Vec<&str> = payload.split('\t').collect();
    let pool = |namespace: &str, name: &str| PoolRef::new(Namespace::stored(namespace.to_owned()), name);
    let version = |v: &str| if v == "-" { Some(None) } else { v.parse().ok().map(Some) };
    let notice = match fields.as_slice() {
        [_, "row", namespace, name, v] => Notice::Row { pool: pool(namespace, name), version: version(v)?, by: None },
        [_, "row", namespace, name, v, by] => {
            Notice::Row { pool: pool(namespace, name), version: version(v)?, by: parse_traceparent(by) }
        }
        [_, "pool", namespace, name] => Notice::Pool(pool(namespace, name)),
        [_, "job", id] => Notice::Job(id.parse().ok()?),
        _ => return None,
    };
    Some((fields[0], notice))
}

/// `sc` as a W3C `traceparent` value: `00-<trace id>-<span id>-<flags>`.
fn traceparent(sc: &SpanContext) -> String {
    format!("00-{:032x}-{:016x}-{:02x}", sc.trace_id(), sc.span_id(), sc.trace_flags().to_u8())
}

/// A W3C `traceparent` of version 00, as the remote span context it
/// names; `None` for anything else (or the all-zero ids it forbids).
fn parse_traceparent(text: &str) -> Option<SpanContext> {
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let ["00", trace, span, flags] = text.split('-').collect::<Vec<_>>()[..] else { return None };
    if !(hex(trace, 32) && hex(span, 16) && hex(flags, 2)) {
        return None;
    }
    let sc = SpanContext::new(
        TraceId::from_hex(trace).ok()?,
        SpanId::from_hex(span).ok()?,
        TraceFlags::new(u8::from_str_radix(flags, 16).ok()?),
        true,
        TraceState::default(),
    );
    sc.is_valid().then_some(sc)
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
/// each pool in `pools`, with the version the transaction leaves it at
/// and the span (`by`) whose work the transaction is.
pub(super) async fn rows(
    tx: &mut PgConnection,
    origin: &str,
    pools: &[PoolRef],
    by: Option<&SpanContext>,
) -> sqlx::Result<()> {
    let namespaces: Vec<&str> = pools.iter().map(|p| p.namespace.as_str()).collect();
    let names: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
    sqlx::query(
        "select pg_notify($1, $2 || E'\\trow\\t' || n.namespace || E'\\t' || n.name || E'\\t'
                              || coalesce(p.version::text, '-') || $5)
         from unnest($3::text[], $4::text[]) as n(namespace, name)
         left join pools p on p.namespace = n.namespace and p.name = n.name",
    )
    .bind(CHANNEL)
    .bind(origin)
    .bind(namespaces)
    .bind(names)
    .bind(by.map(|sc| format!("\t{}", traceparent(sc))).unwrap_or_default())
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
        let by = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        assert!(by.as_ref().is_some_and(|sc| sc.is_remote() && sc.is_sampled()), "{by:?}");
        let all = [
            Notice::Row { pool: web.clone(), version: Some(7), by: None },
            Notice::Row { pool: web.clone(), version: None, by: None },
            Notice::Row { pool: web.clone(), version: Some(8), by: by.clone() },
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
        // A trace context that does not read leaves a row notice all the same.
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        ] {
            let payload = format!("r1\trow\tdefault\tweb\t7\t{bad}");
            assert!(matches!(parse(&payload), Some((_, Notice::Row { version: Some(7), by: None, .. }))), "{bad:?}");
        }
    }

    #[test]
    fn each_replica_has_a_barrier_channel_of_its_own() {
        let a = barrier_channel("host-1-12-ab01");
        assert_eq!(a, barrier_channel("host-1-12-ab01"));
        assert_ne!(a, barrier_channel("host-1-12-ab02"));
        assert!(a.len() <= 63 && a.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "{a}");
    }
}
