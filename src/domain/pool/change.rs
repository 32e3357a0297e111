//! Who may change a pool: the one rule every path that changes a spec
//! asks (PATCH, scale, rollback, `drover apply`).
//!
//! An operator changes a pool's size, version, image and pause; the rest
//! (labels, mounts, placement, strategy, cluster...) is an admin's. On a
//! pool with host mounts, choosing the image is an admin's decision too,
//! since the image gets what the mounts expose (SECURITY.md, "Roles").

use std::collections::BTreeSet;

use serde_json::Value;

use super::PoolSpec;
use crate::domain::role::Role;

/// Spec fields an operator may change; the rest need an admin.
pub const OPERATOR_FIELDS: &[&str] = &["replicas", "version", "image", "paused"];

/// The least role that may change `current` into `next`.
pub fn change_role(current: &PoolSpec, next: &PoolSpec) -> Role {
    let (before, after) = (current.view().to_json(), next.view().to_json());
    let changed = changed_fields(&before, &after);
    let admin_field = changed.iter().any(|f| !OPERATOR_FIELDS.contains(&f.as_str()));
    let mounted_image = changed.contains("image") && !current.extra_mounts().is_empty();
    if admin_field || mounted_image { Role::Admin } else { Role::Operator }
}

/// The top-level fields whose values differ.
fn changed_fields(before: &Value, after: &Value) -> BTreeSet<String> {
    let (Some(before), Some(after)) = (before.as_object(), after.as_object()) else { return BTreeSet::new() };
    before.keys().chain(after.keys()).filter(|k| before.get(*k) != after.get(*k)).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::pool::{PoolSpecInput, SpecLimits};
    use serde_json::json;

    fn spec(v: Value) -> PoolSpec {
        let input: PoolSpecInput = serde_json::from_value(v).expect("input");
        PoolSpec::parse(input, &SpecLimits::unrestricted()).expect("spec")
    }

    #[test]
    fn size_version_image_and_pause_are_an_operators_the_rest_an_admins() {
        let base = spec(json!({"replicas": 2, "version": "v1.29.2"}));
        let op = |v: Value| change_role(&base, &spec(v));
        assert_eq!(op(json!({"replicas": 5, "version": "v1.30.0", "paused": true})), Role::Operator);
        assert_eq!(op(json!({"replicas": 2, "version": "v1.29.2", "image": "img:2"})), Role::Operator);
        assert_eq!(op(json!({"replicas": 2, "version": "v1.29.2", "labels": {"a": "b"}})), Role::Admin);
        assert_eq!(change_role(&base, &base), Role::Operator, "no change needs no more than an operator");
    }

    #[test]
    fn the_image_of_a_pool_with_host_mounts_is_an_admins() {
        let limits = SpecLimits::unrestricted();
        let mounted = |image: &str| {
            let input: PoolSpecInput = serde_json::from_value(json!({"replicas": 1, "version": "v1.29.2",
                "image": image, "extra_mounts": [{"host_path": "/srv/data", "container_path": "/data"}]}))
            .expect("input");
            PoolSpec::parse(input, &limits).expect("spec")
        };
        assert_eq!(change_role(&mounted("img:1"), &mounted("img:2")), Role::Admin);
        let scaled = mounted("img:1").with_replicas(3, &limits).expect("scaled");
        assert_eq!(change_role(&mounted("img:1"), &scaled), Role::Operator);
    }
}
