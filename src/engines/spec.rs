//! Engines as clients register them: a name, an endpoint, labels and, for
//! TCP, a TLS client identity; and the rules a registration must satisfy.

use std::collections::BTreeMap;
use std::net::IpAddr;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::domain::ValidationErrors;
use crate::domain::names::DnsLabel;

/// The server's own engine (`--docker-host`); no registration may take it.
pub const LOCAL: &str = "local";
/// Longest path of a Unix socket (the kernel's `sun_path`).
const MAX_SOCKET_PATH: usize = 107;
/// Largest PEM document accepted for a certificate or key.
const MAX_PEM: usize = 64 * 1024;

/// How drover reaches an engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// `unix:///path`.
    Unix(String),
    /// `tcp://host:port`, with TLS when the registration gave an identity.
    Tcp { host: String, port: u16 },
    /// `sim://name`: an in-memory engine of a simulated server.
    Simulated,
}

/// A TLS client identity (PEM), as stored: the store's type.
pub use crate::db::engines::Tls;

/// A registration that passed every rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineSpec {
    pub name: String,
    /// As given, for display and storage: holds no credential.
    pub address: String,
    pub endpoint: Endpoint,
    pub labels: BTreeMap<String, String>,
    pub tls: Option<Tls>,
}

/// A registration as sent, loosely typed so that every rule it breaks is
/// reported at once.
#[derive(Debug, Clone)]
pub struct RawEngine {
    pub name: DnsLabel,
    pub endpoint: String,
    pub labels: BTreeMap<String, String>,
    pub tls: Option<Tls>,
}

/// Why `ssh://` is refused, for the error and the docs.
pub const SSH_REFUSED: &str = "ssh:// is not supported: bollard's SSH transport runs the host's `ssh` program \
    (through openssh's control master) with the host's keys and known_hosts, outside drover's control and its \
    data directory; expose the engine on tcp:// with TLS instead (dockerd --tlsverify)";

fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.trim_matches(['[', ']']).parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn parse_endpoint(s: &str, tls: bool, simulated: bool, errs: &mut ValidationErrors) -> Option<Endpoint> {
    let mut bad = |rule: &'static str, message: String| {
        errs.push("endpoint", rule, message);
        None
    };
    if s.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return bad("endpoint_chars", "must not contain spaces or control characters".into());
    }
    let Some((scheme, rest)) = s.split_once("://") else {
        return bad("endpoint_scheme", "must look like unix:///path or tcp://host:port".into());
    };
    match scheme {
        "unix" => {
            if !rest.starts_with('/') || rest.len() > MAX_SOCKET_PATH {
                return bad("unix_path", format!("must be an absolute path of at most {MAX_SOCKET_PATH} bytes"));
            }
            if tls {
                return bad(
                    "tls_needs_tcp",
                    "tls is for tcp:// endpoints; a Unix socket is guarded by its file mode".into(),
                );
            }
            Some(Endpoint::Unix(rest.to_owned()))
        }
        "tcp" => {
            if rest.contains(['@', '/', '?', '#']) {
                return bad("tcp_address", "must be tcp://host:port, with no user, path or query".into());
            }
            let Some((host, port)) = rest.rsplit_once(':') else {
                return bad("tcp_address", "must name a port: tcp://host:port".into());
            };
            let Ok(port) = port.parse::<u16>() else {
                return bad("tcp_address", "the port must be a number from 1 to 65535".into());
            };
            if host.is_empty() || port == 0 {
                return bad("tcp_address", "must be tcp://host:port with a host and a port from 1 to 65535".into());
            }
            if !tls && !is_loopback(host) {
                return bad(
                    "tls_required",
                    "a tcp:// engine off this host needs tls (cert, key, ca): plain TCP would give root on it to \
                     anyone who can reach the port"
                        .into(),
                );
            }
            Some(Endpoint::Tcp { host: host.to_owned(), port })
        }
        "ssh" => bad("unsupported_scheme", SSH_REFUSED.into()),
        "sim" if simulated => Some(Endpoint::Simulated),
        "sim" => bad("simulated_only", "sim:// engines exist only on a server run with --runtime simulated".into()),
        _ => bad("endpoint_scheme", format!("scheme {scheme:?} is not supported; use unix:// or tcp://")),
    }
}

fn check_tls(tls: &Tls, errs: &mut ValidationErrors) {
    for (field, pem) in [("tls.cert", &tls.cert), ("tls.key", &tls.key), ("tls.ca", &tls.ca)] {
        if pem.len() > MAX_PEM {
            errs.push(field, "max_length", format!("must be at most {MAX_PEM} bytes of PEM"));
        }
    }
    let certs = |pem: &str| CertificateDer::pem_slice_iter(pem.as_bytes()).collect::<Result<Vec<_>, _>>();
    if !certs(&tls.cert).is_ok_and(|c| !c.is_empty()) {
        errs.push("tls.cert", "pem_certificate", "must be one or more PEM certificates (-----BEGIN CERTIFICATE-----)");
    }
    if !certs(&tls.ca).is_ok_and(|c| !c.is_empty()) {
        errs.push("tls.ca", "pem_certificate", "must be one or more PEM certificates (-----BEGIN CERTIFICATE-----)");
    }
    if PrivateKeyDer::from_pem_slice(tls.key.as_bytes()).is_err() {
        errs.push("tls.key", "pem_private_key", "must be a PEM private key (-----BEGIN ... PRIVATE KEY-----)");
    }
}

/// Checks every rule; `simulated` says whether the server runs simulated
/// engines (and so accepts `sim://`).
pub fn validate(raw: RawEngine, simulated: bool) -> Result<EngineSpec, ValidationErrors> {
    let mut errs = ValidationErrors::default();
    if raw.name.as_str() == LOCAL {
        errs.push("name", "reserved_name", "`local` is the server's own engine (--docker-host)");
    }
    let endpoint = parse_endpoint(&raw.endpoint, raw.tls.is_some(), simulated, &mut errs);
    crate::domain::labels::check(&raw.labels, "labels", &mut errs);
    if let Some(tls) = &raw.tls {
        check_tls(tls, &mut errs);
    }
    match endpoint {
        Some(endpoint) if errs.is_empty() => {
            let name = raw.name.into_string();
            Ok(EngineSpec { name, address: raw.endpoint, endpoint, labels: raw.labels, tls: raw.tls })
        }
        _ => Err(errs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn label(name: &str) -> DnsLabel {
        DnsLabel::parse(name).expect("a DNS label")
    }

    fn raw(endpoint: &str) -> RawEngine {
        RawEngine { name: label("host-b"), endpoint: endpoint.into(), labels: Default::default(), tls: None }
    }

    fn rules(r: Result<EngineSpec, ValidationErrors>) -> Vec<(String, &'static str)> {
        r.expect_err("accepted").0.into_iter().map(|e| (e.static_rule(), e.field)).map(|(r, f)| (f, r)).collect()
    }

    #[test]
    fn unix_and_loopback_tcp_endpoints_are_accepted() {
        let e = validate(raw("unix:///run/b/docker.sock"), false).unwrap();
        assert_eq!(e.endpoint, Endpoint::Unix("/run/b/docker.sock".into()));
        let e = validate(raw("tcp://127.0.0.1:2375"), false).unwrap();
        assert_eq!(e.endpoint, Endpoint::Tcp { host: "127.0.0.1".into(), port: 2375 });
        assert!(validate(raw("tcp://[::1]:2375"), false).is_ok());
        assert!(validate(raw("tcp://localhost:2375"), false).is_ok());
    }

    #[test]
    fn remote_tcp_needs_tls_and_ssh_is_refused_with_the_reason() {
        assert_eq!(rules(validate(raw("tcp://10.0.0.5:2376"), false)), [("endpoint".into(), "tls_required")]);
        let r = validate(raw("ssh://root@host"), false).expect_err("ssh accepted");
        assert_eq!(r.0[0].rule, "unsupported_scheme");
        assert!(r.0[0].message.contains("tcp:// with TLS"));
    }

    #[test]
    fn bad_endpoints_names_and_schemes_are_named() {
        for (endpoint, rule) in [
            ("docker.sock", "endpoint_scheme"),
            ("http://x:1", "endpoint_scheme"),
            ("unix://relative", "unix_path"),
            ("tcp://host", "tcp_address"),
            ("tcp://127.0.0.1:0", "tcp_address"),
            ("tcp://127.0.0.1:99999", "tcp_address"),
            ("tcp://u:p@127.0.0.1:1", "tcp_address"),
            ("tcp://127.0.0.1:1\n", "endpoint_chars"),
            ("sim://x", "simulated_only"),
        ] {
            assert_eq!(rules(validate(raw(endpoint), false)), [("endpoint".into(), rule)], "{endpoint}");
        }
        assert!(validate(raw("sim://x"), true).is_ok());
        let r = validate(RawEngine { name: label("local"), ..raw("unix:///x") }, false);
        assert_eq!(rules(r), [("name".into(), "reserved_name")]);
    }

    #[test]
    fn tls_must_be_pem_and_only_for_tcp() {
        let tls = Tls { cert: "nope".into(), key: "nope".into(), ca: "nope".into() };
        let r = validate(RawEngine { tls: Some(tls.clone()), ..raw("tcp://10.0.0.5:2376") }, false);
        assert_eq!(
            rules(r),
            [
                ("tls.cert".into(), "pem_certificate"),
                ("tls.ca".into(), "pem_certificate"),
                ("tls.key".into(), "pem_private_key")
            ]
        );
        let r = validate(RawEngine { tls: Some(tls), ..raw("unix:///x") }, false);
        assert!(rules(r).contains(&("endpoint".into(), "tls_needs_tcp")));
        assert_eq!(
            format!("{:?}", Tls { cert: "c".into(), key: "SECRET".into(), ca: "a".into() }),
            "Tls { <redacted> }"
        );
    }
}
