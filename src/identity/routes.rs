//! The role each route needs, and the role of a caller.

use axum::http::Method;

use crate::domain::role::Role;

/// Routes anyone may call.
pub(super) fn is_public(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/openapi.json") || path == "/docs" || path.starts_with("/docs/")
        // The dashboard's page and files hold no data; its API calls carry the token.
        || path == "/ui"
        || path.starts_with("/ui/")
}

/// The least role a route needs. Unknown routes need `admin`, so that a
/// new endpoint is closed until someone decides otherwise.
pub fn required_role(method: &Method, route: &str) -> Role {
    use Role::*;
    let m = method.as_str();
    match (m, route) {
        (_, "/v1/tokens" | "/v1/tokens/{name}" | "/v1/audit") => Admin,
        ("GET" | "HEAD", _) => Viewer,
        // A dry run changes nothing (the admin-only fields of an upgrade
        // stay the admin's: the service checks them on both routes).
        ("POST", "/v1/pools/{name}/plan" | "/v1/clusters/{name}/upgrades/plan") => Viewer,
        // A dry run changes nothing; an apply checks each change against
        // the role its single-object route needs (`apply::plan`).
        ("POST", "/v1/apply") => Viewer,
        ("PUT", "/v1/pools/{name}/scale")
        | ("PATCH", "/v1/pools/{name}")
        | ("POST", "/v1/pools/{name}/rollout/continue")
        | ("POST", "/v1/pools/{name}/rollback")
        | ("POST", "/v1/pools/{name}/machines/{machine}/delete-request")
        | ("DELETE", "/v1/pools/{name}/machines/{machine}")
        | ("POST", "/v1/clusters/{name}/upgrades")
        | ("POST", "/v1/upgrades/{id}/cancel") => Operator,
        _ => Admin,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_follow_the_route_table() {
        let r = |m: &str, p: &str| required_role(&Method::from_bytes(m.as_bytes()).unwrap(), p);
        assert_eq!(r("GET", "/v1/pools"), Role::Viewer);
        assert_eq!(r("POST", "/v1/pools/{name}/plan"), Role::Viewer);
        assert_eq!(r("POST", "/v1/clusters/{name}/upgrades/plan"), Role::Viewer);
        assert_eq!(r("POST", "/v1/clusters/{name}/upgrades"), Role::Operator);
        assert_eq!(r("PUT", "/v1/pools/{name}/scale"), Role::Operator);
        assert_eq!(r("POST", "/v1/upgrades/{id}/cancel"), Role::Operator);
        assert_eq!(r("POST", "/v1/pools"), Role::Admin);
        assert_eq!(r("DELETE", "/v1/clusters/{name}"), Role::Admin);
        assert_eq!(r("POST", "/v1/engines/{name}/confirm-identity"), Role::Admin);
        assert_eq!(r("GET", "/v1/tokens"), Role::Admin);
        assert_eq!(r("GET", "/v1/audit"), Role::Admin);
        assert_eq!(r("POST", "/v1/something-new"), Role::Admin);
        assert!(Role::Viewer < Role::Operator && Role::Operator < Role::Admin);
    }
}
