//! Which object: namespaces, and the references by which every module
//! names a pool, a cluster, an upgrade job or an engine (events, change
//! notices, leases, the reconciler's queue, the authorizer).
//!
//! A pool, a cluster, an upgrade job and an apply set each belong to one
//! namespace, and names are unique within it: a pool is its namespace and
//! its name together ([`PoolRef`]). Engines belong to none: they are the
//! infrastructure every namespace shares.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::names::{DnsLabel, NameError};

/// A namespace: a DNS label. `default` always exists, and is where a
/// request that names none works.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Namespace(DnsLabel);

impl Namespace {
    pub const DEFAULT: &'static str = "default";

    pub fn parse(s: &str) -> Result<Self, NameError> {
        DnsLabel::parse(s).map(Self)
    }

    /// A namespace as the store keeps it (it keeps only checked names).
    pub fn stored(s: String) -> Self {
        Self(DnsLabel::from_store(s))
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    pub fn is_default(&self) -> bool {
        self.as_str() == Self::DEFAULT
    }
}

/// Read back from the store, checked again (it is cheap).
impl TryFrom<String> for Namespace {
    type Error = NameError;

    fn try_from(s: String) -> Result<Self, NameError> {
        Self::parse(&s)
    }
}

impl Default for Namespace {
    fn default() -> Self {
        Self::stored(Self::DEFAULT.to_owned())
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl AsRef<str> for Namespace {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl utoipa::PartialSchema for Namespace {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        <DnsLabel as utoipa::PartialSchema>::schema()
    }
}

impl utoipa::ToSchema for Namespace {
    fn name() -> std::borrow::Cow<'static, str> {
        "DnsLabel".into()
    }
}

/// A pool: its namespace and its name, together its identity everywhere.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PoolRef {
    pub namespace: Namespace,
    pub name: String,
}

impl PoolRef {
    pub fn new(namespace: Namespace, name: impl Into<String>) -> Self {
        Self { namespace, name: name.into() }
    }

    /// A pool of the `default` namespace (what a request naming no
    /// namespace means, and what existed before namespaces).
    pub fn in_default(name: impl Into<String>) -> Self {
        Self::new(Namespace::default(), name)
    }
}

/// `team-a/web`, for logs and messages (a name holds no `/`).
impl fmt::Display for PoolRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A registered cluster: its namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClusterRef {
    pub namespace: Namespace,
    pub name: String,
}

impl ClusterRef {
    pub fn new(namespace: Namespace, name: impl Into<String>) -> Self {
        Self { namespace, name: name.into() }
    }
}

impl fmt::Display for ClusterRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// In unit tests, a bare name is a pool of `default`.
#[cfg(test)]
impl From<&str> for PoolRef {
    fn from(name: &str) -> Self {
        Self::in_default(name)
    }
}

/// An apply set (`drover apply`): its namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SetRef {
    pub namespace: Namespace,
    pub name: String,
}

impl SetRef {
    pub fn new(namespace: Namespace, name: impl Into<String>) -> Self {
        Self { namespace, name: name.into() }
    }
}

/// `"fleet"` in `default`, `"fleet" of namespace team-a` elsewhere: how
/// messages name a set.
impl fmt::Display for SetRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_default() {
            write!(f, "{:?}", self.name)
        } else {
            write!(f, "{:?} of namespace {}", self.name, self.namespace)
        }
    }
}

/// What an event is about, what a change notice says changed, what a lease
/// is of: one reference for "a pool, a job or an engine".
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectRef {
    Pool(PoolRef),
    /// An upgrade job: ids are unique across namespaces.
    Job(i64),
    /// An engine: engines belong to no namespace.
    Engine(String),
}

impl ObjectRef {
    pub fn kind(&self) -> ObjectKind {
        match self {
            Self::Pool(_) => ObjectKind::Pool,
            Self::Job(_) => ObjectKind::Job,
            Self::Engine(_) => ObjectKind::Engine,
        }
    }
}

/// The kinds of [`ObjectRef`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectKind {
    Pool,
    Job,
    Engine,
}

impl ObjectKind {
    /// As the store names it (`events.subject_kind`, `leases.kind`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pool => "pool",
            Self::Job => "job",
            Self::Engine => "engine",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_is_a_dns_label_and_default_is_default() {
        assert_eq!(Namespace::default().as_str(), "default");
        assert!(Namespace::default().is_default());
        assert!(Namespace::parse("team-a").is_ok());
        assert!(Namespace::parse("Team_A").is_err());
        assert!(Namespace::parse("*").is_err(), "`*` names every namespace in a grant, never one");
        let web_a = PoolRef::new(Namespace::parse("a").unwrap(), "web");
        let web_b = PoolRef::new(Namespace::parse("b").unwrap(), "web");
        assert_ne!(web_a, web_b, "one name in two namespaces is two pools");
        assert_eq!(web_a.to_string(), "a/web");
    }
}
