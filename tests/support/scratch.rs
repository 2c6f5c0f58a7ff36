//! Scratch folders of the tests and benchmarks, all under one folder per process
//! (`$TMPDIR/clb-tests-<pid>`), so that nothing they write outlives them on the machine.
//!
//! Why: the suite writes hundreds of megabytes a run (a packed npm project, a long trace, the
//! built guests), and a CI machine reusing its build cache runs it again and again on a disk
//! that may be nearly full. A test's own folder ([`Scratch`]) is removed when the test drops it;
//! what lives as long as the process (the guests as files, a webhook's serving pair) goes under
//! [`process_dir`], and the first use of it in a later process removes the folders of processes
//! that have ended, however they ended (a panic in a static, a kill, a timeout).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const PREFIX: &str = "clb-tests-";

/// A folder of one test, removed with everything in it when dropped.
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh, empty folder named `name` under this process's folder, removed when dropped. Two
/// live folders of one name in one process share it: names are per test.
pub fn scratch(name: &str) -> Scratch {
    let dir = process_dir().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    Scratch(dir)
}

/// This process's folder, for what lives as long as the process. Its first use removes the
/// folders of ended processes.
pub fn process_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let temp = std::env::temp_dir();
        remove_ended(&temp);
        let dir = temp.join(format!("{PREFIX}{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        dir
    })
}

/// Removes `clb-tests-<pid>` folders whose process is gone (Linux's `/proc` says which are
/// alive; elsewhere nothing is removed).
pub fn remove_ended(temp: &Path) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(temp) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)).and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}
