//! TLS for the listener: a certificate and key (PEM), and optionally a CA
//! whose client certificates are accepted (mutual TLS).
//!
//! Certificates are rotated by tools such as cert-manager, which replace
//! the files in place. [`watch`] looks at the files' size and modification
//! time every `--tls-reload-interval` and builds a new server configuration
//! when they change; new connections use it, open ones keep theirs. A
//! change that cannot be loaded (a half-written or corrupt file) keeps the
//! configuration in use and logs why; the next change is tried again.
//! At start, a file that cannot be loaded stops the start with its name.
//!
//! With a client CA, a client may still connect without a certificate (and
//! use a bearer token); a certificate that the CA did not sign fails the
//! handshake. The subject of an accepted certificate is what
//! `--access-config`'s `mtls` entries map to a role.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_util::sync::CancellationToken;

/// Why the TLS files could not be used; each variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {detail}")]
    Read { path: PathBuf, detail: String },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("the key {key} does not fit the certificate {cert}, or is not usable: {source}")]
    KeyMismatch { cert: PathBuf, key: PathBuf, source: rustls::Error },
    #[error("the client CA {path} is not usable: {detail}")]
    ClientCa { path: PathBuf, detail: String },
    #[error("TLS setup: {0}")]
    Setup(rustls::Error),
}

/// Where the files are.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    fn paths(&self) -> impl Iterator<Item = &Path> {
        [Some(self.cert.as_path()), Some(self.key.as_path()), self.client_ca.as_deref()].into_iter().flatten()
    }
}

/// The listener's TLS configuration, replaced on reload.
pub struct Tls {
    files: TlsFiles,
    config: RwLock<Arc<ServerConfig>>,
    reloaded: AtomicU64,
    failed: AtomicU64,
}

impl Tls {
    /// Loads the files; any that cannot be used is an error naming it.
    pub fn load(files: TlsFiles) -> Result<Self, TlsError> {
        let config = build(&files)?;
        Ok(Self { files, config: RwLock::new(config), reloaded: AtomicU64::new(0), failed: AtomicU64::new(0) })
    }

    /// The configuration for a new connection.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(Arc::clone(&self.config.read().unwrap_or_else(|p| p.into_inner())))
    }

    /// Successful reloads since start.
    pub fn reloads(&self) -> u64 {
        self.reloaded.load(Ordering::Relaxed)
    }

    /// Reloads that failed (and kept the previous configuration).
    pub fn failed_reloads(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// Builds the configuration from the files again; on failure keeps the
    /// one in use.
    pub fn reload(&self) -> Result<(), TlsError> {
        match build(&self.files) {
            Ok(config) => {
                *self.config.write().unwrap_or_else(|p| p.into_inner()) = config;
                self.reloaded.fetch_add(1, Ordering::Relaxed);
                tracing::info!(cert = %self.files.cert.display(), "reloaded the TLS certificate");
                Ok(())
            }
            Err(e) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, "could not reload the TLS files; still serving the previous certificate");
                Err(e)
            }
        }
    }

    /// Size and modification time of each file: what a rotation changes.
    fn stamp(&self) -> Vec<Option<(u64, SystemTime)>> {
        self.files
            .paths()
            .map(|p| std::fs::metadata(p).ok().and_then(|m| Some((m.len(), m.modified().ok()?))))
            .collect()
    }
}

/// Reloads `tls` whenever its files change, until `cancel`.
pub async fn watch(tls: Arc<Tls>, every: Duration, cancel: CancellationToken) {
    let mut seen = tls.stamp();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = tls.stamp();
        if now != seen {
            seen = now;
            // The error is logged by `reload`; the next change is tried again.
            let _ = tls.reload();
        }
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::Read { path: path.into(), detail: e.to_string() })
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Read { path: path.into(), detail: format!("not PEM: {e}") })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { path: path.into() });
    }
    Ok(certs)
}

fn build(files: &TlsFiles) -> Result<Arc<ServerConfig>, TlsError> {
    let certs = certificates(&files.cert)?;
    let key = PrivateKeyDer::from_pem_slice(&read(&files.key)?)
        .map_err(|e| TlsError::Read { path: files.key.clone(), detail: format!("no PEM private key: {e}") })?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Setup)?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates(path)? {
                roots.add(cert).map_err(|e| TlsError::ClientCa { path: path.clone(), detail: e.to_string() })?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| TlsError::ClientCa { path: path.clone(), detail: e.to_string() })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|source| TlsError::KeyMismatch {
        cert: files.cert.clone(),
        key: files.key.clone(),
        source,
    })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The subject of a client's certificate, as `--access-config` names it:
/// RFC 4514-style `CN=...,O=...` in the certificate's order, without spaces
/// after the commas.
pub fn subject_of(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    Some(normalize_subject(&parsed.subject().to_string()))
}

/// `CN=a, O=b` and `CN=a,O=b` are the same subject.
pub fn normalize_subject(s: &str) -> String {
    s.split(',').map(str::trim).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_empty_file_is_named() {
        let dir = tempfile::tempdir().expect("dir");
        let cert = dir.path().join("cert.pem");
        let key = dir.path().join("key.pem");
        let files = TlsFiles { cert: cert.clone(), key: key.clone(), client_ca: None };
        let err = Tls::load(files.clone()).err().expect("missing files").to_string();
        assert!(err.contains("cert.pem"), "{err}");
        std::fs::write(&cert, "not a certificate").expect("write");
        let err = Tls::load(files).err().expect("no PEM").to_string();
        assert!(err.contains("cert.pem") && err.contains("no PEM certificate"), "{err}");
    }

    #[test]
    fn subjects_compare_without_spaces() {
        assert_eq!(normalize_subject("CN=ci, O=example"), "CN=ci,O=example");
    }
}
