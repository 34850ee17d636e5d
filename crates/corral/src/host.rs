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

/// Makes `dir` a directory only this user can use, never changing one it
/// did not make: what is missing (parents too) is created 0700; a
/// directory that exists already is used as it is when it is private (a
/// directory, or with `follow_symlink` a symlink to one, owned by this
/// user, no group or other access) and refused otherwise, with the
/// reason (the caller names the path and the setting). A configured
/// directory may be a shared one such as a 1777 `/tmp`: tightening it
/// would take it from every other user of the host.
pub fn private_dir(dir: &std::path::Path, follow_symlink: bool) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot be created: {e}"))?;
    let meta = if follow_symlink {
        std::fs::metadata(dir)
    } else {
        std::fs::symlink_metadata(dir)
    }
    .map_err(|e| format!("cannot be read: {e}"))?;
    if !meta.is_dir() {
        return Err("is not a directory (a symlink?)".into());
    }
    let me = std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .map_err(|e| format!("cannot tell this process's user from /proc/self: {e}"))?;
    if meta.uid() != me {
        return Err(format!(
            "belongs to uid {}, not to this user (uid {me})",
            meta.uid()
        ));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "has mode {mode:04o}: others may use it, and corral leaves a directory it did not \
             make as it is (make it 0700, or name a directory of your own, which corral \
             creates 0700)"
        ));
    }
    Ok(())
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
