//! Persistent sessions' host directories: names, privacy, the record of
//! the container made for a session, and neutralising setuid bits.
//!
//! A sandbox is root over what it writes into its workspace: without care
//! it can leave a setuid-root binary on the host. So:
//! - the persistence root and every session directory are private to the
//!   user (0700, owned by this user; a looser mode is fixed when found, a
//!   foreign owner is an error), so other host users cannot reach anything
//!   a sandbox wrote;
//! - inside sandboxes the workspace and home are mounted `nosuid,nodev`
//!   (`container_config.rs`), so a planted setuid binary gains nothing in a
//!   later sandbox of the session;
//! - when no container of the session runs (after it is released or
//!   evicted, and before a new one starts) corral clears setuid/setgid bits
//!   from the two trees, so nothing privileged survives on the host, even
//!   if the directory is later copied elsewhere. Clearing a bit on a file
//!   that belongs to someone else needs root: a non-root corral logs such
//!   files (they stay unreachable for other users behind the 0700 tree).
//!
//! A session key maps to `<sanitised prefix>-<first 128 bits of
//! SHA-256(key)>`, so distinct keys never share a directory (the earlier
//! scheme's 32-bit hash could be made to collide). A directory left under
//! the earlier name is renamed to the new one the first time its key is
//! used again, but only when the key it records (its `session` file) is
//! that key: under the earlier name two keys could share a directory, so
//! one without its key, or with another, is left where it is and logged
//! (writing the key into its `session` file by hand lets it move).

use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use corral_core::SpecError;

/// Container path of a persistent session's workspace.
pub const WORKSPACE: &str = corral_core::backend::SESSION_WORKSPACE;
/// Container path of a persistent session's home (`$HOME`).
pub const HOME: &str = corral_core::backend::SESSION_HOME;

/// The effective uid of this process.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// A session's directories on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionDirs {
    /// `<root>/<name>`: private, never mounted into a sandbox.
    pub dir: PathBuf,
    /// Mounted at [`WORKSPACE`].
    pub workspace: PathBuf,
    /// Mounted at [`HOME`].
    pub home: PathBuf,
}

impl SessionDirs {
    /// The directories of session `key` under `root` (nothing is created).
    pub fn new(root: &Path, key: &str) -> SessionDirs {
        let dir = root.join(dir_name(key));
        SessionDirs {
            workspace: dir.join("workspace"),
            home: dir.join("home"),
            dir,
        }
    }

    /// The trees a sandbox of the session can write.
    pub fn trees(&self) -> [&Path; 2] {
        [&self.workspace, &self.home]
    }

    fn record_path(&self) -> PathBuf {
        self.dir.join("container")
    }

    fn key_path(&self) -> PathBuf {
        self.dir.join("session")
    }
}

fn sanitised(key: &str, max: usize) -> String {
    key.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .take(max)
        .collect()
}

/// The directory name of session `key`: a readable prefix and 128 bits of
/// SHA-256 of the whole key.
pub fn dir_name(key: &str) -> String {
    let hash = crate::seal::sha256_hex(key.as_bytes());
    format!("{}-{}", sanitised(key, 48), &hash[..32])
}

/// The name the earlier scheme gave `key` (64 sanitised characters and a
/// 32-bit FNV-1a hash), looked for when migrating.
pub fn legacy_dir_name(key: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{}-{:08x}", sanitised(key, 64), h as u32)
}

fn dir_error(path: &Path, reason: impl Into<String>) -> SpecError {
    SpecError {
        field: "persistence_root".into(),
        value: path.display().to_string(),
        reason: reason.into(),
    }
}

/// Makes `path`, a directory below a private root, private to this user:
/// created 0700 when missing, a looser mode tightened (nobody else can
/// have made it), a symlink or another owner refused. The root itself is
/// checked by [`crate::host::private_dir`], which never changes a
/// directory corral did not make.
pub fn ensure_private_dir(path: &Path, follow_symlink: bool) -> Result<(), SpecError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|e| dir_error(path, format!("cannot create the directory: {e}")))?;
    let meta = if follow_symlink {
        std::fs::metadata(path)
    } else {
        std::fs::symlink_metadata(path)
    }
    .map_err(|e| dir_error(path, format!("cannot read: {e}")))?;
    if !meta.file_type().is_dir() {
        return Err(dir_error(path, "is not a directory (a symlink?)"));
    }
    let me = euid();
    if meta.uid() != me {
        return Err(dir_error(
            path,
            format!(
                "is owned by uid {}, not this user (uid {me}): it cannot be kept private",
                meta.uid()
            ),
        ));
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)).map_err(|e| {
            dir_error(
                path,
                format!("has mode {mode:04o} and cannot be made private (0700): {e}"),
            )
        })?;
        tracing::info!(path = %path.display(), old_mode = format!("{mode:04o}"), "made a persistence directory private (0700)");
    }
    Ok(())
}

/// Creates (or checks and fixes) session `key`'s directories under `root`,
/// migrating a directory left under the earlier name.
pub fn prepare(root: &Path, key: &str) -> Result<SessionDirs, SpecError> {
    // The root may be a symlink the user made (to another disk), or a
    // directory others use: it is never changed, only refused unless
    // private. Below it, corral makes every entry itself.
    crate::host::private_dir(root, true).map_err(|why| dir_error(root, why))?;
    let dirs = SessionDirs::new(root, key);
    let legacy = root.join(legacy_dir_name(key));
    if std::fs::symlink_metadata(&dirs.dir).is_err() {
        if let Ok(meta) = std::fs::symlink_metadata(&legacy) {
            if meta.file_type().is_dir() && meta.uid() == euid() && legacy_owned_by(&legacy, key) {
                std::fs::rename(&legacy, &dirs.dir).map_err(|e| {
                    dir_error(
                        &legacy,
                        format!("cannot move to {}: {e}", dirs.dir.display()),
                    )
                })?;
                tracing::info!(session = key, from = %legacy.display(), to = %dirs.dir.display(), "moved a persistent session's directory to its collision-free name");
            }
        }
    }
    ensure_private_dir(&dirs.dir, false)?;
    // The full key, so a directory is never silently shared.
    let key_path = dirs.key_path();
    match std::fs::read(&key_path) {
        Ok(stored) if stored == key.as_bytes() => {}
        Ok(stored) => {
            return Err(dir_error(
                &dirs.dir,
                format!(
                    "belongs to session {:?}, not {key:?}",
                    String::from_utf8_lossy(&stored)
                ),
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            write_private(&key_path, key.as_bytes())
                .map_err(|e| dir_error(&key_path, format!("cannot write: {e}")))?;
        }
        Err(e) => return Err(dir_error(&key_path, format!("cannot read: {e}"))),
    }
    for tree in dirs.trees() {
        match std::fs::symlink_metadata(tree) {
            Ok(m) if !m.file_type().is_dir() => {
                return Err(dir_error(tree, "is not a directory (a symlink?)"))
            }
            _ => {}
        }
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(tree)
            .or_else(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => Ok(()),
                _ => Err(e),
            })
            .map_err(|e| dir_error(tree, format!("cannot create the directory: {e}")))?;
        // Made 0700, but not tightened later: a sandbox (root inside) may
        // open its own mount point up to a non-root user it runs; the
        // private session directory above it is what keeps host users out.
    }
    Ok(dirs)
}

/// True when the directory left under the earlier name records `key` as
/// its session (checked before it is moved: that name could be shared by
/// two keys); logs why not otherwise.
fn legacy_owned_by(legacy: &Path, key: &str) -> bool {
    let path = legacy.join("session");
    let why = match std::fs::symlink_metadata(&path) {
        Ok(m) if !m.file_type().is_file() => "its session file is not a regular file".to_string(),
        Ok(_) => match std::fs::read(&path) {
            Ok(stored) if stored == key.as_bytes() => return true,
            Ok(stored) => format!(
                "it belongs to session {:?}",
                String::from_utf8_lossy(&stored)
            ),
            Err(e) => format!("its session file cannot be read: {e}"),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            "it records no session key (write the key into its session file to move it)".into()
        }
        Err(e) => format!("its session file cannot be read: {e}"),
    };
    tracing::warn!(session = key, dir = %legacy.display(), reason = %why, "left a directory under the earlier naming where it is: it may belong to another session whose key had the same 32-bit hash");
    false
}

fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension(format!("tmp{}", crate::host::random_hex(6)));
    let res = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(data))
        .and_then(|()| std::fs::rename(&tmp, path));
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

/// Records `container_id` as the container made for the session.
pub fn record_container(dirs: &SessionDirs, container_id: &str) -> Result<(), SpecError> {
    let path = dirs.record_path();
    write_private(&path, container_id.as_bytes())
        .map_err(|e| dir_error(&path, format!("cannot write: {e}")))
}

/// The container recorded for the session, if any.
pub fn recorded_container(dirs: &SessionDirs) -> Option<String> {
    let text = std::fs::read_to_string(dirs.record_path()).ok()?;
    let id = text.trim();
    (!id.is_empty()).then(|| id.to_string())
}

/// What clearing setuid/setgid bits did.
#[derive(Debug, Default)]
pub struct StripReport {
    /// Files whose setuid/setgid bits were cleared.
    pub cleared: Vec<PathBuf>,
    /// Files that keep them, with the reason (e.g. owned by root and
    /// corral is not root).
    pub failed: Vec<(PathBuf, String)>,
}

/// Clears setuid and setgid bits from every non-directory under `trees`,
/// never following symlinks and never leaving the trees' filesystems.
/// Call only while no container of the session runs: then nothing else
/// writes there (the session directory is private), so the walk cannot be
/// raced.
pub fn strip_privileges(trees: &[&Path]) -> StripReport {
    let mut report = StripReport::default();
    for tree in trees {
        let Ok(top) = std::fs::symlink_metadata(tree) else {
            continue;
        };
        if !top.file_type().is_dir() {
            continue;
        }
        let dev = top.dev();
        let mut stack = vec![tree.to_path_buf()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                let Ok(meta) = std::fs::symlink_metadata(&path) else {
                    continue;
                };
                let ft = meta.file_type();
                if ft.is_symlink() || meta.dev() != dev {
                    continue;
                }
                if ft.is_dir() {
                    stack.push(path);
                    continue;
                }
                let mode = meta.mode() & 0o7777;
                if mode & 0o6000 == 0 {
                    continue;
                }
                match chmod_nofollow(&path, mode & !0o6000) {
                    Ok(()) => report.cleared.push(path),
                    Err(e) => report.failed.push((path, e.to_string())),
                }
            }
        }
    }
    report
}

fn chmod_nofollow(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call;
    // AT_SYMLINK_NOFOLLOW makes a symlink an error instead of a target.
    let rc = unsafe {
        libc::fchmodat(
            libc::AT_FDCWD,
            c.as_ptr(),
            mode as libc::mode_t,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Strips the session's trees and logs what could not be fixed.
pub fn strip_and_log(dirs: &SessionDirs, session: &str) {
    let report = strip_privileges(&dirs.trees());
    if !report.cleared.is_empty() {
        tracing::warn!(
            session,
            files = ?report.cleared,
            "cleared setuid/setgid bits a sandbox left in its persistent directories"
        );
    }
    if !report.failed.is_empty() {
        tracing::warn!(
            session,
            files = ?report.failed,
            "could not clear setuid/setgid bits (they stay unreachable to other users behind the private session directory)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp_root() -> PathBuf {
        std::env::temp_dir().join(format!("corral-ws-test-{}", crate::host::random_hex(8)))
    }

    /// `dir` and its parents made as a user would (`mkdir -p`), the root
    /// then private, as corral asks of a root it did not make.
    fn made_by_hand(root: &Path, dir: &Path) {
        std::fs::create_dir_all(dir).expect("mkdir");
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    }

    /// Two keys the earlier scheme sent to one directory: the same first
    /// 64 sanitised characters and the same 32-bit FNV-1a hash (found by a
    /// birthday search).
    pub const LEGACY_COLLISION: (&str, &str) = (
        concat!(
            "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk",
            "-181191"
        ),
        concat!(
            "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk",
            "-755080"
        ),
    );

    #[test]
    fn names_are_readable_and_distinct() {
        let n = dir_name("agent/7");
        assert!(n.starts_with("agent_7-"), "{n}");
        assert_eq!(n.len(), "agent_7-".len() + 32);
        assert_ne!(dir_name("a/b"), dir_name("a_b"));
        assert_ne!(dir_name(".."), "..");
        assert!(!dir_name("../x").contains('/'));
    }

    #[test]
    fn private_dirs_are_made_and_tightened() {
        let root = tmp_root();
        let dirs = prepare(&root, "agent/7").expect("prepare");
        for d in [&root, &dirs.dir, &dirs.workspace, &dirs.home] {
            let mode = std::fs::metadata(d).expect("dir").permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", d.display());
        }
        std::fs::set_permissions(&dirs.dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        prepare(&root, "agent/7").expect("prepare again");
        let mode = std::fs::metadata(&dirs.dir)
            .expect("dir")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o700, "fixed: {}", dirs.dir.display());
        // A root others may use (corral did not make it so) is refused
        // by name and left as it is.
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        let e = prepare(&root, "agent/7").expect_err("a shared root");
        assert_eq!(e.field, "persistence_root");
        assert!(e.reason.contains("mode 1777"), "{e}");
        let mode = std::fs::metadata(&root).expect("dir").permissions().mode() & 0o7777;
        assert_eq!(mode, 0o1777, "the root was changed");
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        // A session directory holding another key is refused by name.
        std::fs::write(dirs.dir.join("session"), "other").expect("write");
        let e = prepare(&root, "agent/7").expect_err("another key's directory");
        assert_eq!(e.field, "persistence_root");
        assert!(e.reason.contains("\"other\""), "{e}");
        std::fs::remove_dir_all(&root).ok();
    }

    #[test]
    fn legacy_directories_move_to_their_new_name() {
        let (a, b) = LEGACY_COLLISION;
        assert_eq!(
            legacy_dir_name(a),
            legacy_dir_name(b),
            "they used to collide"
        );
        assert_ne!(dir_name(a), dir_name(b));

        let root = tmp_root();
        let legacy = root.join(legacy_dir_name("agent/7"));
        made_by_hand(&root, &legacy.join("workspace"));
        std::fs::write(legacy.join("workspace/notes.txt"), "kept").expect("write");
        std::fs::write(legacy.join("session"), "agent/7").expect("write");
        let dirs = prepare(&root, "agent/7").expect("prepare");
        assert_eq!(
            std::fs::read_to_string(dirs.workspace.join("notes.txt")).expect("migrated"),
            "kept"
        );
        assert!(!legacy.exists());
        std::fs::remove_dir_all(&root).ok();
    }

    #[test]
    fn a_legacy_directory_of_a_colliding_key_is_left_alone() {
        let (a, b) = LEGACY_COLLISION;
        let root = tmp_root();
        // Session `a`'s directory under the earlier name, which `b` shares.
        let legacy = root.join(legacy_dir_name(a));
        made_by_hand(&root, &legacy.join("workspace"));
        std::fs::write(legacy.join("workspace/secret.txt"), "a's").expect("write");
        std::fs::write(legacy.join("session"), a).expect("write");
        let dirs = prepare(&root, b).expect("prepare");
        assert!(
            !dirs.workspace.join("secret.txt").exists(),
            "session b was given session a's workspace"
        );
        assert_eq!(
            std::fs::read_to_string(legacy.join("workspace/secret.txt")).expect("left"),
            "a's"
        );
        // Without a recorded key, it cannot be told whose it is either.
        std::fs::remove_file(legacy.join("session")).expect("rm");
        std::fs::remove_dir_all(&dirs.dir).expect("rm");
        let dirs = prepare(&root, b).expect("prepare");
        assert!(!dirs.workspace.join("secret.txt").exists());
        assert!(legacy.join("workspace/secret.txt").exists());
        // Its own key moves it.
        std::fs::write(legacy.join("session"), a).expect("write");
        let dirs = prepare(&root, a).expect("prepare");
        assert!(dirs.workspace.join("secret.txt").exists());
        assert!(!legacy.exists());
        std::fs::remove_dir_all(&root).ok();
    }

    #[test]
    fn setuid_bits_are_cleared_without_following_links() {
        let root = tmp_root();
        let dirs = prepare(&root, "s").expect("prepare");
        let bin = dirs.workspace.join("deep/bin");
        std::fs::create_dir_all(&bin).expect("mkdir");
        let target = root.join("outside");
        std::fs::write(&target, "x").expect("write");
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o4755)).expect("chmod");
        std::os::unix::fs::symlink(&target, bin.join("link")).expect("symlink");
        let suid = bin.join("suid");
        std::fs::write(&suid, "x").expect("write");
        std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o6755)).expect("chmod");
        let report = strip_privileges(&dirs.trees());
        assert_eq!(report.cleared, vec![suid.clone()]);
        let mode = std::fs::metadata(&suid).expect("file").permissions().mode() & 0o7777;
        assert_eq!(mode, 0o755);
        let outside = std::fs::metadata(&target)
            .expect("file")
            .permissions()
            .mode()
            & 0o7777;
        assert_eq!(outside, 0o4755, "a symlink's target is never touched");
        std::fs::remove_dir_all(&root).ok();
    }

    #[test]
    fn containers_are_recorded_privately() {
        let root = tmp_root();
        let dirs = prepare(&root, "s").expect("prepare");
        assert_eq!(recorded_container(&dirs), None);
        record_container(&dirs, "abc").expect("record");
        assert_eq!(recorded_container(&dirs).as_deref(), Some("abc"));
        let mode = std::fs::metadata(dirs.dir.join("container"))
            .expect("record")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::remove_dir_all(&root).ok();
    }
}
