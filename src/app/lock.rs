//! The data directory's lock: one drover process per data directory.
//!
//! Two processes on one directory would both run the pool reconciler and
//! the upgrade runner against the same store: double container creations
//! past the surge limit, and two runners on one control plane. So `serve`
//! takes an exclusive lock on `<data dir>/drover.lock` before it opens the
//! store, holds it for the life of the process, and refuses to start when
//! another process holds it. The lock is the operating system's (`flock`):
//! it goes with the process, even on SIGKILL, so a crash never leaves a
//! stale lock behind. The file holds the holder's pid, for the message.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// The lock file's name inside the data directory.
pub const LOCK_FILE: &str = "drover.lock";

/// Held for as long as it lives; dropping it releases the lock.
#[derive(Debug)]
pub struct DataDirLock {
    /// Kept open: closing the file would release the lock.
    _file: File,
    pub path: PathBuf,
}

impl DataDirLock {
    /// Takes the lock of `data_dir`, or fails with a message naming the
    /// lock file and the process that holds it.
    pub fn acquire(data_dir: &Path) -> anyhow::Result<Self> {
        let path = data_dir.join(LOCK_FILE);
        // Not truncated on open: while another process holds the lock, its
        // pid must stay readable.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("opening lock file {}", path.display()))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                let who = if holder.is_empty() { "another process".to_owned() } else { format!("process {holder}") };
                anyhow::bail!(
                    "data directory {} is in use by another drover (lock file {} is held by {who}); \
                     stop that process, or give this one another --data-dir",
                    data_dir.display(),
                    path.display()
                );
            }
            Err(TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("locking {}", path.display()));
            }
        }
        let pid = std::process::id();
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| writeln!(file, "{pid}"))
            .and_then(|()| file.flush())
            .with_context(|| format!("writing the pid into {}", path.display()))?;
        tracing::debug!(lock = %path.display(), pid, "data directory locked");
        Ok(Self { _file: file, path })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_one_directory_is_refused_naming_the_file_and_the_holder() {
        let dir = tempfile::TempDir::new().unwrap();
        let first = DataDirLock::acquire(dir.path()).unwrap();
        let err = DataDirLock::acquire(dir.path()).unwrap_err().to_string();
        assert!(err.contains("drover.lock"), "{err}");
        assert!(err.contains(&format!("process {}", std::process::id())), "{err}");
        drop(first);
        let again = DataDirLock::acquire(dir.path()).expect("the lock is free once its holder is gone");
        assert_eq!(std::fs::read_to_string(&again.path).unwrap().trim(), std::process::id().to_string());
    }
}
