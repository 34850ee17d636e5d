//! Facts about the host corral runs on: environment, paths, processes.

use corral_core::labels::Owner;
use corral_core::spec::HostView;

/// The real host: its environment variables and filesystem.
pub struct RealHost;

impl HostView for RealHost {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }

    fn path_exists(&self, path: &str) -> bool {
        std::path::Path::new(path).exists()
    }
}

/// This host's name, as container owner labels record it.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// Start time of process `pid` in clock ticks since boot (field 22 of
/// `/proc/<pid>/stat`); `None` when no such process runs.
pub fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses; the
    // fields after it start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the process `pid` that started at `start` still runs here.
pub fn process_alive(pid: u32, start: u64) -> bool {
    process_start(pid) == Some(start)
}

/// The owner record for this process.
pub fn this_owner() -> Owner {
    let pid = std::process::id();
    Owner {
        host: hostname(),
        pid,
        start: process_start(pid).unwrap_or(0),
    }
}

/// The per-user runtime directory (`corral_core::paths::user_runtime_dir`)
/// for this process.
pub fn user_runtime_dir() -> std::path::PathBuf {
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(0);
    corral_core::paths::user_runtime_dir(
        std::env::var_os("XDG_RUNTIME_DIR")
            .as_deref()
            .map(std::path::Path::new),
        &std::env::temp_dir(),
        uid,
    )
}

/// A random hex string of `len` characters, from the kernel's generator.
pub fn random_hex(len: usize) -> String {
    use std::io::Read;
    let mut buf = vec![0u8; len.div_ceil(2)];
    let filled = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .is_ok();
    if !filled {
        // No /dev/urandom: fall back to std's per-process random hash keys.
        use std::hash::{BuildHasher, Hasher};
        for (i, b) in buf.iter_mut().enumerate() {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_usize(i);
            *b = h.finish() as u8;
        }
    }
    let mut s: String = buf.iter().map(|b| format!("{b:02x}")).collect();
    s.truncate(len);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_alive_and_reused_pid_is_not() {
        let me = this_owner();
        assert!(me.start > 0);
        assert!(process_alive(me.pid, me.start));
        assert!(!process_alive(me.pid, me.start + 1));
        assert_eq!(random_hex(12).len(), 12);
        assert_ne!(random_hex(16), random_hex(16));
    }
}
