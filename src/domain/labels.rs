//! Kubernetes-style labels, as pools put them on containers and engines
//! carry them for selectors: `[prefix/]name` keys, short safe values.

use std::collections::BTreeMap;

use super::ValidationErrors;
use super::names::check_dns_label;

/// Label prefix reserved for drover's own labels on containers.
pub const RESERVED_LABEL_PREFIX: &str = "drover.dev/";
const MAX_LABEL_PART: usize = 63;
const MAX_LABEL_PREFIX: usize = 253;
const MAX_LABELS: usize = 64;

/// Checks every label of a map named `field` (`labels`, `engine_selector`).
pub fn check(labels: &BTreeMap<String, String>, field: &str, errs: &mut ValidationErrors) {
    if labels.len() > MAX_LABELS {
        errs.push(field, "max_items", format!("at most {MAX_LABELS} labels"));
    }
    for (k, v) in labels {
        let at = format!("{field}.{k}");
        if k.starts_with(RESERVED_LABEL_PREFIX) {
            errs.push(at, "reserved_label", format!("keys under {RESERVED_LABEL_PREFIX} are reserved for drover"));
            continue;
        }
        let (prefix, name) = match k.rsplit_once('/') {
            Some((p, n)) => (Some(p), n),
            None => (None, k.as_str()),
        };
        let prefix_ok = prefix.is_none_or(|p| {
            !p.is_empty() && p.len() <= MAX_LABEL_PREFIX && p.split('.').all(|l| check_dns_label(l).is_ok())
        });
        if !prefix_ok || name.is_empty() || !is_label_value(name) {
            errs.push(
                at,
                "label_key",
                "must be [prefix/]name: a DNS prefix and a name of at most 63 letters, digits, '-', '_' or '.'",
            );
        } else if !v.is_empty() && !is_label_value(v) {
            errs.push(
                at,
                "label_value",
                "value must be empty or at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
            );
        }
    }
}

/// Kubernetes' label-value rule, which also keeps values safe in Docker labels.
pub fn is_label_value(s: &str) -> bool {
    let bytes = s.as_bytes();
    let edge = |b: &u8| b.is_ascii_alphanumeric();
    !s.is_empty()
        && s.len() <= MAX_LABEL_PART
        && bytes.first().is_some_and(edge)
        && bytes.last().is_some_and(edge)
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Does `labels` carry every pair of `selector`?
pub fn matches(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}
