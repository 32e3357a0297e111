//! Cluster server URLs are shown to every viewer and written to logs, so
//! they must hold no credential: neither userinfo (`https://user:pass@host`)
//! nor a query parameter whose name says it carries one (`?access_token=`).
//! Credentials belong in the cluster's write-only fields.

/// Query parameter names (compared without case, as substrings) that say a
/// value is a credential.
const CREDENTIAL_WORDS: [&str; 9] =
    ["token", "password", "passwd", "pwd", "secret", "key", "auth", "signature", "credential"];

/// The URL's authority (between `//` and the path, query or fragment).
fn authority(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.split(['/', '?', '#', '\\']).next().unwrap_or_default()
}

fn credential_parameter(url: &str) -> Option<&str> {
    let query = url.split_once('?')?.1;
    let query = query.split('#').next().unwrap_or_default();
    query.split(['&', ';']).map(|pair| pair.split('=').next().unwrap_or_default()).find(|name| {
        let name = name.to_ascii_lowercase();
        name == "sig" || CREDENTIAL_WORDS.iter().any(|w| name.contains(w))
    })
}

/// Refuses a server URL that carries a credential, saying where.
pub fn check_server_url(url: &str) -> Result<(), String> {
    if authority(url).contains('@') {
        return Err(
            "must not contain a user name or password (`user:pass@host`); give credentials in their own fields".into(),
        );
    }
    if let Some(name) = credential_parameter(url) {
        return Err(format!(
            "must not carry a credential in its query (parameter {:?}); give credentials in their own fields",
            crate::telemetry::truncate(name, 64)
        ));
    }
    Ok(())
}

/// The URL with any userinfo and query removed: safe to show and log even
/// for a URL stored before [`check_server_url`] existed.
pub fn redact_server_url(url: &str) -> String {
    if check_server_url(url).is_ok() {
        return url.to_owned();
    }
    let (scheme, rest) = url.split_once("://").map_or(("", url), |(s, r)| (s, r));
    let host_start = authority(url).rfind('@').map_or(0, |i| i + 1);
    let rest = &rest[host_start..];
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    if scheme.is_empty() { rest.to_owned() } else { format!("{scheme}://{rest}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_urls_pass() {
        for ok in ["https://10.0.0.1:6443", "http://127.0.0.1:8080/", "https://k8s.example.com/prefix?timeout=5s"] {
            assert_eq!(check_server_url(ok), Ok(()), "{ok}");
            assert_eq!(redact_server_url(ok), ok);
        }
    }

    #[test]
    fn userinfo_and_credential_parameters_are_refused_and_redacted() {
        for bad in [
            "http://user:pass@host:6443",
            "https://token@host",
            "https://host/?access_token=abc",
            "https://host/?a=1&X-Amz-Signature=abc",
            "https://host?sig=abc",
            "https://host/path?apiKey=1#frag",
        ] {
            assert!(check_server_url(bad).is_err(), "{bad}");
            let shown = redact_server_url(bad);
            assert!(!shown.contains("pass") && !shown.contains("abc") && !shown.contains('@'), "{bad} -> {shown}");
        }
        assert_eq!(redact_server_url("http://user:pass@host:6443/x?token=1"), "http://host:6443/x");
        // An `@` after the authority is part of the path, not userinfo.
        assert_eq!(check_server_url("https://host/a@b"), Ok(()));
    }
}
