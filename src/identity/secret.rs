//! drover's own tokens as secrets: made at random, kept only as hashes,
//! and the first admin token of a new store, written to a file only its
//! owner may read.

use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::Rng;
use sha2::{Digest, Sha256};

use crate::db::{self, Db};
use crate::domain::grant::Grants;
use crate::domain::role::Role;

const TOKEN_PREFIX: &str = "drover_";

/// A new random token: 256 bits, URL-safe.
pub fn new_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes))
}

pub fn hash_token(token: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(token.as_bytes());
    let mut out = String::with_capacity(64);
    for b in digest {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    out
}

/// On first start, when no token exists, makes an admin token and writes
/// it to `<data dir>/admin.token` (mode 0600). The log names the file,
/// never the token. Of replicas starting together on an empty store,
/// exactly one makes it (the check and the insert hold the table), and
/// only that one writes the file. The file is written before the token is
/// committed, so no valid admin token is ever without it.
pub async fn bootstrap(db: &Db, data_dir: &Path) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let mut tx = db.begin_write().await?;
    if db::tokens::any_locked(&mut tx).await? {
        return Ok(());
    }
    let token = new_token();
    let path = data_dir.join("admin.token");
    let grants = Grants::everywhere(Role::Admin);
    let hash = hash_token(&token);
    let new = db::tokens::NewToken { name: "bootstrap-admin", namespace: None, grants: &grants, hash: &hash };
    db::tokens::insert(&mut tx, &new, crate::clock::wall()).await?;
    write_private(&path, &format!("{token}\n")).with_context(|| format!("writing {}", path.display()))?;
    if let Err(e) = tx.commit().await {
        let _ = std::fs::remove_file(&path);
        return Err(e).context("storing the first admin token");
    }
    tracing::warn!(file = %path.display(), "created an admin token (name bootstrap-admin); it is in {}", path.display());
    Ok(())
}

/// Creates (or replaces) a file readable by its owner only.
pub fn write_private(path: &Path, content: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(path)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    f.write_all(content.as_bytes())?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_hashes_are_lowercase_hex_sha256() {
        assert_eq!(hash_token("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }

    #[test]
    fn tokens_are_random_and_hash_stably() {
        let (a, b) = (new_token(), new_token());
        assert_ne!(a, b);
        assert!(a.starts_with(TOKEN_PREFIX) && a.len() == TOKEN_PREFIX.len() + 43);
        assert_eq!(hash_token(&a), hash_token(&a));
        assert_eq!(hash_token(&a).len(), 64);
    }
}
