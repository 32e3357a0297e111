//! Docker image references, checked against the grammar of
//! `distribution/reference` (the one the Docker Engine applies):
//!
//! ```text
//! reference      := name [ ":" tag ] [ "@" digest ]
//! name           := [ domain "/" ] path-component ( "/" path-component )*
//! path-component := [a-z0-9]+ ( ( "." | "_" | "__" | "-"+ ) [a-z0-9]+ )*
//! tag            := [A-Za-z0-9_] [A-Za-z0-9_.-]{0,127}
//! digest         := algorithm ":" hex{32,}
//! ```
//!
//! Checking here means a pool with a typo is refused at once with the reason,
//! instead of failing on every reconcile pass.

/// Longest repository name the engine accepts.
const MAX_NAME_LEN: usize = 255;
const MAX_TAG_LEN: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    #[error("must not be empty")]
    Empty,
    #[error("repository name must be at most {MAX_NAME_LEN} characters")]
    NameTooLong,
    #[error("registry host {0:?} is not a valid host[:port]")]
    BadDomain(String),
    #[error("path component {0:?} must be lowercase letters and digits, joined by '.', '_', '__' or dashes")]
    BadPathComponent(String),
    #[error("tag {0:?} must be 1-128 of letters, digits, '_', '.', '-', not starting with '.' or '-'")]
    BadTag(String),
    #[error("digest {0:?} must be algorithm:hex with at least 32 hex digits")]
    BadDigest(String),
}

/// Checks a Docker image reference such as `kindest/node:v1.29.2`,
/// `localhost:5000/team/app@sha256:...` or `busybox`.
pub fn check_image_reference(s: &str) -> Result<(), ImageError> {
    if s.is_empty() {
        return Err(ImageError::Empty);
    }
    let (rest, digest) = match s.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (s, None),
    };
    if let Some(d) = digest {
        check_digest(d)?;
    }
    // A tag is whatever follows the last ':' that comes after the last '/':
    // an earlier ':' belongs to a registry port.
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if let Some(t) = tag {
        check_tag(t)?;
    }
    if name.is_empty() {
        return Err(ImageError::Empty);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(ImageError::NameTooLong);
    }
    let mut components: Vec<&str> = name.split('/').collect();
    if components.len() > 1 && looks_like_domain(components[0]) {
        check_domain(components.remove(0))?;
    }
    components.into_iter().try_for_each(check_path_component)
}

/// The engine's rule: the first component is a registry when it has a '.',
/// a ':', is `localhost`, or has an uppercase letter (paths cannot).
fn looks_like_domain(first: &str) -> bool {
    first.contains(['.', ':']) || first == "localhost" || first.chars().any(|c| c.is_ascii_uppercase())
}

fn check_domain(d: &str) -> Result<(), ImageError> {
    let bad = || ImageError::BadDomain(d.to_owned());
    let (host, port) = match d.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (d, None),
    };
    if let Some(p) = port
        && (p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) || p.parse::<u16>().is_err())
    {
        return Err(bad());
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if host.split('.').all(label_ok) { Ok(()) } else { Err(bad()) }
}

fn check_path_component(c: &str) -> Result<(), ImageError> {
    let bad = || ImageError::BadPathComponent(c.to_owned());
    let is_alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = c.as_bytes();
    let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) else {
        return Err(bad());
    };
    if !is_alnum(first) || !is_alnum(last) {
        return Err(bad());
    }
    // Every run of non-alphanumerics must be one allowed separator.
    for sep in c.split(|ch: char| ch.is_ascii_lowercase() || ch.is_ascii_digit()) {
        let ok = sep.is_empty() || matches!(sep, "." | "_" | "__") || sep.bytes().all(|b| b == b'-');
        if !ok {
            return Err(bad());
        }
    }
    Ok(())
}

fn check_tag(t: &str) -> Result<(), ImageError> {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let ok = !t.is_empty()
        && t.len() <= MAX_TAG_LEN
        && word(t.as_bytes()[0])
        && t.bytes().all(|b| word(b) || b == b'.' || b == b'-');
    if ok { Ok(()) } else { Err(ImageError::BadTag(t.to_owned())) }
}

fn check_digest(d: &str) -> Result<(), ImageError> {
    let bad = || ImageError::BadDigest(d.to_owned());
    let (algo, hex) = d.split_once(':').ok_or_else(bad)?;
    let algo_ok = algo.split(['+', '.', '-', '_']).all(|p| {
        p.bytes().next().is_some_and(|b| b.is_ascii_alphabetic()) && p.bytes().all(|b| b.is_ascii_alphanumeric())
    });
    if algo_ok && hex.len() >= 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()) { Ok(()) } else { Err(bad()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_real_world_references() {
        let digest = format!("sha256:{}", "a".repeat(64));
        for ok in [
            "busybox".to_owned(),
            "kindest/node:v1.29.2".to_owned(),
            "registry.k8s.io/kube-apiserver:v1.30.0".to_owned(),
            "localhost:5000/team/app:1.0".to_owned(),
            "localhost/app".to_owned(),
            "my-registry.example.com:443/a/b/c".to_owned(),
            "a__b/c.d/e--f_g:_tag".to_owned(),
            format!("app@{digest}"),
            format!("app:1.0@{digest}"),
            format!("a:{}", "t".repeat(128)),
            "drover-test/node:a".to_owned(),
        ] {
            assert_eq!(check_image_reference(&ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn refuses_broken_references() {
        type Check = fn(&ImageError) -> bool;
        let cases: &[(&str, Check)] = &[
            ("", |e| matches!(e, ImageError::Empty)),
            (":tag", |e| matches!(e, ImageError::Empty)),
            ("Busybox", |e| matches!(e, ImageError::BadPathComponent(_))),
            ("a/B", |e| matches!(e, ImageError::BadPathComponent(_))),
            ("a//b", |e| matches!(e, ImageError::BadPathComponent(_))),
            ("a/-b", |e| matches!(e, ImageError::BadPathComponent(_))),
            ("a/b.", |e| matches!(e, ImageError::BadPathComponent(_))),
            ("a/b..c", |e| matches!(e, ImageError::BadPathComponent(_))),
            ("a/b___c", |e| matches!(e, ImageError::BadPathComponent(_))),
            ("a b", |e| matches!(e, ImageError::BadPathComponent(_))),
            ("app:", |e| matches!(e, ImageError::BadTag(_))),
            ("app:.x", |e| matches!(e, ImageError::BadTag(_))),
            ("app:-x", |e| matches!(e, ImageError::BadTag(_))),
            ("app:a/b", |e| matches!(e, ImageError::BadDomain(_))),
            ("app@sha256:abc", |e| matches!(e, ImageError::BadDigest(_))),
            ("app@abc", |e| matches!(e, ImageError::BadDigest(_))),
            ("host:99999/app", |e| matches!(e, ImageError::BadDomain(_))),
            ("-host.io/app", |e| matches!(e, ImageError::BadDomain(_))),
        ];
        for (input, expected) in cases {
            let err = check_image_reference(input).expect_err(input);
            assert!(expected(&err), "{input:?} gave {err:?}");
        }
        let long_tag = format!("a:{}", "t".repeat(129));
        assert!(matches!(check_image_reference(&long_tag), Err(ImageError::BadTag(_))));
        let long_name = "a/".repeat(128) + "a";
        assert_eq!(check_image_reference(&long_name), Err(ImageError::NameTooLong));
    }
}
