//! Exponential backoff, the one formula every retry in drover uses: a
//! failing pass, a Kubernetes call, an engine's reconnect, a deletion, a
//! restart in place, a placement breaker.

use std::time::Duration;

use rand::RngExt;

/// `base` for the first failure, doubled for each one after it, at most `cap`.
pub fn exponential(base: Duration, failures: u32, cap: Duration) -> Duration {
    base.saturating_mul(1u32 << failures.saturating_sub(1).min(20)).min(cap)
}

/// [`exponential`], then a random point in its upper half, so that many
/// retriers that failed together do not retry in lockstep.
pub fn jittered(base: Duration, failures: u32, cap: Duration) -> Duration {
    let d = exponential(base, failures, cap);
    d / 2 + (d / 2).mul_f64(rand::rng().random::<f64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_doubles_from_the_base_to_the_cap() {
        let s = Duration::from_secs;
        let got: Vec<Duration> = (0..=7).map(|n| exponential(s(1), n, s(30))).collect();
        assert_eq!(got, [s(1), s(1), s(2), s(4), s(8), s(16), s(30), s(30)]);
        assert_eq!(exponential(s(1), u32::MAX, s(30)), s(30));
    }

    #[test]
    fn jitter_stays_in_the_upper_half() {
        for n in 1..10 {
            let d = exponential(Duration::from_millis(500), n, Duration::from_secs(60));
            for _ in 0..50 {
                let j = jittered(Duration::from_millis(500), n, Duration::from_secs(60));
                assert!(j >= d / 2 && j <= d, "{j:?} not in [{:?}, {d:?}]", d / 2);
            }
        }
    }
}
