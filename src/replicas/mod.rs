//! Several drover replicas on one PostgreSQL store (docs/ha.md).
//!
//! Every replica serves the whole API; each pool is driven, and each
//! upgrade job run, by exactly one of them, the holder of its lease:
//!
//! - [`lease`]: the one lease type of pools and jobs alike: what this
//!   replica holds, and the [`Fence`] a pass or a job's run carries, which
//!   checks the lease locally before every engine operation or Kubernetes
//!   call and proves it in the store in every write.
//! - [`keeper`]: every third of `--lease-duration`, a replica stamps its
//!   heartbeat and renews its leases (one transaction, the database's
//!   clock), spreads the pools over the replicas alive by rendezvous
//!   hashing ([`owner`]), takes the leases of its share that nobody holds
//!   and hands over, a few at a time, those that are now another's share.
//!   Jobs are not spread: whichever replica's runner finds one free takes
//!   it ([`Leases::claim_job`]).
//! - [`notices`]: the listener of the other replicas' change notices
//!   (LISTEN/NOTIFY): it keeps the cache of pools current, and wakes event
//!   streams and the pools' drivers.
//!
//! With SQLite there is one process: no leases, and the fence is
//! [`Fence::Sole`].

pub mod keeper;
pub mod lease;
pub mod listener;

pub use lease::{Claimed, Fence, FenceError, Key, Kind, LeaseFence, Leases, Lost};

use crate::domain::object::PoolRef;

/// This process's name among the replicas: its host, its pid and a random
/// part, so that a restarted process is a new replica (its predecessor's
/// leases are taken over, not silently continued).
pub fn replica_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty() && h.len() <= 64)
        .unwrap_or_else(|| "drover".to_owned());
    format!("{host}-{}-{:04x}", std::process::id(), rand::random::<u16>())
}

/// The gauges of `/metrics` about replicas: leases held by each replica
/// alive, and how many are alive (read from the store, so every replica
/// shows all of them).
pub async fn gauges(db: &crate::db::Db, leases: &Leases) -> sqlx::Result<crate::metrics::ScrapeGauges> {
    let mut g = crate::metrics::ScrapeGauges::default();
    let Some(store) = db.shared_store() else { return Ok(g) };
    let counts = crate::db::leases::counts(store, leases.duration).await?;
    let alive = counts.len() as f64;
    let samples: Vec<_> = counts.into_iter().map(|(r, n)| (vec![r], n as f64)).collect();
    g.family("drover_leases_held", "Pool leases held now, by replica", &["replica"], &samples);
    g.family("drover_replicas_alive", "drover replicas alive on the store", &[], &[(vec![], alive)]);
    Ok(g)
}

/// The replica that should drive `pool` among `alive`: the one with the
/// highest score for it (rendezvous hashing). Every replica computes the
/// same answer from the same list, and when a replica joins or leaves only
/// the pools it gains or held move.
pub fn owner<'a>(alive: &'a [String], pool: &PoolRef) -> Option<&'a str> {
    alive.iter().max_by_key(|r| (score(r, pool), r.as_str())).map(String::as_str)
}

/// A well-spread 64-bit score of (replica, pool): FNV-1a over both names,
/// then SplitMix64's finaliser. Defined here, not by the standard library's
/// hasher, so that replicas of different builds agree.
fn score(replica: &str, pool: &PoolRef) -> u64 {
    // A pool of `default` hashes by its name alone, as before namespaces,
    // so that upgrading moves no pool; others by namespace and name.
    let namespace = (!pool.namespace.is_default()).then(|| pool.namespace.as_str().bytes().chain([0xfe]));
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in replica.bytes().chain([0xff]).chain(namespace.into_iter().flatten()).chain(pool.name.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn replicas(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("host-{i}-1234-ab{i:02x}")).collect()
    }

    #[test]
    fn three_replicas_share_300_pools_with_none_above_half() {
        let alive = replicas(3);
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for p in 0..300 {
            *counts.entry(owner(&alive, &PoolRef::in_default(format!("pool-{p}"))).unwrap()).or_default() += 1;
        }
        assert_eq!(counts.len(), 3, "{counts:?}");
        assert!(counts.values().all(|&n| (70..=130).contains(&n)), "{counts:?}");
    }

    #[test]
    fn a_replica_leaving_moves_only_its_pools_and_joining_takes_only_a_share() {
        let three = replicas(3);
        let two: Vec<String> = three[..2].to_vec();
        let pools: Vec<PoolRef> = (0..1000).map(|p| PoolRef::in_default(format!("p{p}"))).collect();
        for p in &pools {
            let before = owner(&three, p).unwrap();
            let after = owner(&two, p).unwrap();
            if before != three[2] {
                assert_eq!(before, after, "{p} moved although its replica stayed");
            }
        }
        let moved = pools.iter().filter(|p| owner(&three, p) != owner(&two, p)).count();
        assert!((250..=420).contains(&moved), "about a third moves when the third replica joins: {moved}");
    }

    #[test]
    fn every_replica_agrees_whatever_order_it_lists_the_others_in() {
        let alive = replicas(4);
        let mut reversed = alive.clone();
        reversed.reverse();
        for p in 0..200 {
            let pool = PoolRef::in_default(format!("x{p}"));
            assert_eq!(owner(&alive, &pool), owner(&reversed, &pool));
        }
        assert_eq!(owner(&[], &PoolRef::in_default("p")), None);
    }
}
