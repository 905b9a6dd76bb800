//! The data owner's log: what analysts must not see, written where only the owner looks.
//!
//! Values that did not parse as their column's declared type are read as NULL, and only their counts are
//! written here (per scan, per column); errors whose text could quote private data (a file that cannot be read)
//! are written here in full while the analyst gets a message without it. Configured by `[session] owner_log`; a
//! line per event, each with its Unix time. A line that cannot be written is dropped: the log never changes what a
//! query does.

use crate::error::{DpError, Result};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// An append-only log file.
#[derive(Debug)]
pub struct OwnerLog {
    path: PathBuf,
    file: Mutex<std::fs::File>,
}

impl OwnerLog {
    /// Opens (creating) `path` for appending.
    pub fn open(path: &Path) -> Result<Self> {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|e| {
            DpError::Config(format!("[session] owner_log: cannot open {} for appending: {e}", path.display()))
        })?;
        Ok(OwnerLog { path: path.to_path_buf(), file: Mutex::new(file) })
    }

    /// Where the log is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one line (newlines inside `line` are escaped).
    pub fn write(&self, line: &str) {
        let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        if let Ok(mut f) = self.file.lock() {
            let _ = writeln!(f, "{at} {}", line.replace('\n', "\\n"));
        }
    }
}
