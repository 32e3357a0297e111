//! Where the store is: `--database-url`, read into a [`Location`].

use std::str::FromStr;

use sqlx::postgres::PgConnectOptions;

/// Where the store is: a SQLite file, or a PostgreSQL database.
#[derive(Clone, PartialEq, Eq)]
pub enum Location {
    Sqlite(std::path::PathBuf),
    /// A `postgres://` URL. It may hold a password: shown only redacted.
    Postgres(String),
}

impl std::fmt::Debug for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown())
    }
}

impl Location {
    /// Reads `--database-url`: `sqlite://<path>` (or `sqlite:<path>`) or
    /// `postgres://...` (`postgresql://` too).
    pub fn parse(url: &str) -> Result<Self, String> {
        let url = url.trim();
        if let Some(path) = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:")) {
            let path = path.split('?').next().unwrap_or_default();
            if path.is_empty() {
                return Err("sqlite:// needs a file path, e.g. sqlite:///var/lib/drover/drover.db".into());
            }
            return Ok(Self::Sqlite(path.into()));
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            PgConnectOptions::from_str(url).map_err(|e| format!("not a PostgreSQL URL: {}", redact(&e.to_string())))?;
            return Ok(Self::Postgres(url.to_owned()));
        }
        Err("must start with sqlite:// or postgres://".into())
    }

    /// For messages and logs: a PostgreSQL URL without its password.
    pub fn shown(&self) -> String {
        match self {
            Self::Sqlite(path) => format!("sqlite://{}", path.display()),
            Self::Postgres(url) => redact(url),
        }
    }
}

/// `postgres://user:secret@host/db` as `postgres://user:***@host/db`.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let Some((auth, host)) = rest.split_once('@') else { return url.to_owned() };
    match auth.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_urls_name_their_store_and_never_show_a_password() {
        assert_eq!(Location::parse("sqlite:///tmp/d.db").unwrap(), Location::Sqlite("/tmp/d.db".into()));
        assert_eq!(Location::parse("sqlite:rel.db").unwrap(), Location::Sqlite("rel.db".into()));
        let pg = Location::parse("postgres://drover:s3cret@db:5432/drover").unwrap();
        assert_eq!(pg.shown(), "postgres://drover:***@db:5432/drover");
        assert!(!format!("{pg:?}").contains("s3cret"));
        assert!(Location::parse("mysql://x").unwrap_err().contains("sqlite:// or postgres://"));
        assert!(Location::parse("sqlite://").is_err());
        assert!(Location::parse("postgres://host:notaport/db").is_err());
    }
}
