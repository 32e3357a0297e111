//! Test-only certificates (rcgen): a CA, server certificates for
//! 127.0.0.1 and client certificates with a chosen common name, written as
//! PEM files the way drover's flags read them.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

/// A certificate authority that signs the test's certificates.
pub struct Ca {
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its key, as PEM.
pub struct Leaf {
    pub cert: String,
    pub key: String,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).expect("self-signed CA");
        Ca { pem: cert.pem(), issuer: Issuer::new(params, key) }
    }

    /// A server certificate for 127.0.0.1 (and localhost).
    pub fn server(&self) -> Leaf {
        self.leaf(vec!["127.0.0.1".into(), "localhost".into()], "drover test server")
    }

    /// A client certificate whose subject is `CN=<common_name>`.
    pub fn client(&self, common_name: &str) -> Leaf {
        self.leaf(Vec::new(), common_name)
    }

    fn leaf(&self, names: Vec<String>, common_name: &str) -> Leaf {
        let key = KeyPair::generate().expect("leaf key");
        let mut params = CertificateParams::new(names).expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, common_name);
        let cert = params.signed_by(&key, &self.issuer).expect("signed leaf");
        Leaf { cert: cert.pem(), key: key.serialize_pem() }
    }

    /// Writes the CA certificate to `<dir>/<name>` and returns the path.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, &self.pem).expect("writing the CA");
        path
    }
}

impl Leaf {
    /// Writes `<dir>/<stem>.crt` and `<dir>/<stem>.key`.
    pub fn write(&self, dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
        let (cert, key) = (dir.join(format!("{stem}.crt")), dir.join(format!("{stem}.key")));
        std::fs::write(&cert, &self.cert).expect("writing the certificate");
        std::fs::write(&key, &self.key).expect("writing the key");
        (cert, key)
    }
}

/// An HTTPS client trusting only `ca`, presenting `identity` when given.
pub fn https_client(ca: &Ca, identity: Option<&Leaf>) -> reqwest::Client {
    let mut builder = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(ca.pem.as_bytes()).expect("CA PEM")])
        .timeout(std::time::Duration::from_secs(20));
    if let Some(leaf) = identity {
        let pem = format!("{}\n{}", leaf.cert, leaf.key);
        builder = builder.identity(reqwest::Identity::from_pem(pem.as_bytes()).expect("client identity"));
    }
    builder.build().expect("HTTPS client")
}
