//! In-place reset: commands run in a disposable view of the file system.
//!
//! A sandbox started for it (`init --pristine`) gets three capabilities
//! more than usual, for the agent alone: CAP_SYS_ADMIN and CAP_SYS_CHROOT
//! (to build mount namespaces and move commands into them) and CAP_SETPCAP
//! (to take the other two out of every command's bounding set). PID 1
//! gives itself a private mount namespace at start, while it still has one
//! thread.
//!
//! Commands never change the container's root file system. What they
//! change lands in overlay upper layers on a private tmpfs (the state,
//! mounted on a directory of `/dev/shm` in the agent's namespace only), and
//! what resets return to is the *delta* (`delta`), a directory of that
//! tmpfs in overlay form holding every change to the image that is kept:
//! the start-up commands', a delta imported before the first command (a
//! fork's snapshot), and kept resets'. The commands before the first reset
//! (the start-up commands) run in the first world: the root an overlay
//! over the container's root file system, every other mount bound as it is
//! in the agent's namespace (so tmpfs content and single-file binds they
//! write are there at the first reset, as on the real mounts), and the
//! state's mount point covered by an empty read-only tmpfs (so no command
//! can unlink it, which would detach the state everywhere). The first
//! reset folds that world's upper layer into the delta.
//!
//! A reset kills every process but the agent, then builds a *world*: a
//! mount namespace whose root is an overlay with the delta and the
//! container's root file system as its lower layers and an empty directory
//! of the state as its upper layer. Every other mount of
//! the container is carried over from the agent's namespace: tmpfs mounts
//! (`/tmp`, `/dev/shm`, ...) as fresh tmpfs with the same options and the
//! content they had at the first reset, writable single-file binds
//! (`/etc/hosts`, `/etc/resolv.conf`, `/etc/hostname`) as fresh copies, and
//! everything else (`/proc`, `/dev`, `/sys`, the agent's directory, host
//! mounts, volumes) bound as it is. Every command is spawned into the
//! current world (`setns`), with the agent's extra capabilities dropped and
//! the system calls they would unlock refused (`confine`). The next reset
//! throws the world away: everything commands did to the file system is
//! gone with its upper layer.
//!
//! What worlds share must not carry anything from one episode to the next
//! either. The engine's tmpfs mounts under `/sys` and `/proc` (the writable
//! `/sys/fs/cgroup` of cgroup v1, the masks over `/proc/keys`, ...) and the
//! device nodes of `/dev` are bound read-only: a device still reads and
//! writes, but no file, mode, owner or time can be left on them. The
//! pseudo file systems commands must be able to write through (`/proc`,
//! `/dev/pts`, `/dev/mqueue`) keep their one instance; the mode, owner and
//! times of their roots (and of `/dev/pts/ptmx`) as the first reset found
//! them are put back at every reset, and the mqueue and System V IPC
//! objects are removed. PID 1's own tunables a command can write through
//! `/proc/1` are put back too (`tunables`).
//!
//! A reset that keeps the changes merges the upper layer into the delta
//! first, so later resets start from it; one for an engine's copy of the
//! container (`docker commit`) also applies the whole delta to the
//! container's own root file system (whiteouts become deletions, opaque
//! directories replace what was there). The delta travels as a tar archive
//! with OCI whiteouts (`export`, `import`; the `delta` module), which is
//! how a snapshot reaches a fork without an image.

use std::ffi::{CString, OsStr};
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{chown, DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicBool, Ordering};

use corral_core::protocol::{
    DeltaError, DeltaErrorKind, ResetReport, ResetSupport, SHARED_DELTAS_DIR,
};

use crate::caps::{CAP_SETPCAP, CAP_SYS_ADMIN};
use crate::delta;
use crate::reaper::Reaper;
use crate::sys;

/// The agent's extra capabilities, in the order commands drop them
/// (CAP_SETPCAP last: dropping from the bounding set needs it).
pub const EXTRA_CAPS: [u32; 3] = [CAP_SYS_ADMIN, CAP_SYS_CHROOT, CAP_SETPCAP];
const CAP_SYS_CHROOT: u32 = 18;

/// Where the state tmpfs is mounted in the agent's own namespace: a
/// directory of the container's `/dev/shm`, which worlds get as a fresh
/// tmpfs without it.
const STATE: &str = "/dev/shm/.corral-state";

/// How long a reset waits for the sandbox's processes to be gone.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// One mount of the agent's namespace, as a world gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Carry {
    /// Bound as it is.
    Bind,
    /// A fresh tmpfs: mount flags, options (`size=`, `mode=`, ...), and
    /// whether it had content at the first reset (copied from the mount in
    /// the agent's namespace, which nothing changes after that reset).
    Tmpfs {
        flags: libc::c_ulong,
        data: String,
        content: bool,
    },
    /// A fresh copy of a writable single-file bind.
    File,
    /// `/dev`: a fresh tmpfs with the device nodes bound in one by one
    /// and the symbolic links and directories made anew, so files a
    /// command leaves there go with the world.
    Dev {
        flags: libc::c_ulong,
        data: String,
        nodes: Vec<DevNode>,
    },
}

/// One entry of the container's `/dev`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum DevNode {
    /// A device file, bound in.
    Device(PathBuf),
    /// A symbolic link and its target.
    Symlink(PathBuf, PathBuf),
    /// A directory (a mount point, like `pts`) and its mode.
    Dir(PathBuf, u32),
}

/// The entries of `/dev` a world recreates.
fn dev_nodes() -> Result<Vec<DevNode>, String> {
    let mut nodes = Vec::new();
    let dir = fs::read_dir("/dev").map_err(|e| format!("cannot read /dev: {e}"))?;
    for entry in dir {
        let entry = entry.map_err(|e| e.to_string())?;
        let path = entry.path();
        let meta = fs::symlink_metadata(&path).map_err(|e| e.to_string())?;
        let ft = meta.file_type();
        if ft.is_symlink() {
            let target = fs::read_link(&path).map_err(|e| e.to_string())?;
            nodes.push(DevNode::Symlink(path, target));
        } else if ft.is_dir() {
            nodes.push(DevNode::Dir(path, meta.mode() & 0o7777));
        } else if ft.is_char_device() || ft.is_block_device() {
            nodes.push(DevNode::Device(path));
        }
        // Anything else in the container's /dev is a start-up command's
        // file and stays out of the world's fresh /dev, like a new
        // sandbox's.
    }
    nodes.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
    Ok(nodes)
}

#[derive(Debug, Clone)]
struct Entry {
    /// Mount point.
    path: PathBuf,
    read_only: bool,
    /// `nosuid`/`nodev`/`noexec` (and `ro`), kept when bound read-only.
    flags: libc::c_ulong,
    carry: Carry,
}

/// Mode, owner and times of a path every world shares, as the first reset
/// found them.
#[derive(Debug, Clone)]
struct Meta {
    path: PathBuf,
    mode: u32,
    owner: (u32, u32),
    /// Access and modification times: seconds and nanoseconds.
    times: [(i64, i64); 2],
}

impl Meta {
    fn of(path: PathBuf) -> Result<Meta, String> {
        let m = fs::symlink_metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Meta {
            mode: m.mode() & 0o7777,
            owner: (m.uid(), m.gid()),
            times: [(m.atime(), m.atime_nsec()), (m.mtime(), m.mtime_nsec())],
            path,
        })
    }

    /// Puts it back, always (not only when it differs), so that even the
    /// change time says nothing but when the last reset ran.
    fn restore(&self) -> Result<(), String> {
        let err = |e: io::Error| format!("cannot restore {}: {e}", self.path.display());
        std::os::unix::fs::lchown(&self.path, Some(self.owner.0), Some(self.owner.1))
            .map_err(err)?;
        fs::set_permissions(&self.path, fs::Permissions::from_mode(self.mode)).map_err(err)?;
        sys::set_times(&cpath(&self.path)?, self.times).map_err(err)
    }
}

/// What the first reset recorded: the state every world starts from.
#[derive(Debug)]
struct Base {
    entries: Vec<Entry>,
    /// The agent's working directory (the image's or the spec's workdir).
    cwd: PathBuf,
    /// Mode and owner of `/`, which the overlay's root takes from its
    /// upper layer.
    root_mode: u32,
    root_owner: (u32, u32),
    /// Shared pseudo file system roots, put back at every reset.
    shared: Vec<Meta>,
}

/// The namespace commands run in now.
#[derive(Debug)]
pub struct World {
    ns: OwnedFd,
    root: OwnedFd,
    /// Working directory of a command that names none.
    pub cwd: PathBuf,
}

impl World {
    /// The namespace to `setns` into.
    pub fn ns(&self) -> RawFd {
        self.ns.as_raw_fd()
    }

    /// Resolves `dir` inside the world (relative to its default working
    /// directory) and checks it is a directory; the error names it.
    pub fn check_dir(&self, dir: &Path) -> Result<PathBuf, String> {
        let full = self.cwd.join(dir);
        let c = CString::new(full.as_os_str().as_bytes())
            .map_err(|_| format!("working directory {} contains a NUL byte", full.display()))?;
        let fd = sys::open_in_root(self.root.as_fd(), &c)
            .map_err(|e| format!("working directory {}: {e}", full.display()))?;
        let meta = fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .map_err(|e| format!("working directory {}: {e}", full.display()))?;
        if !meta.is_dir() {
            return Err(format!(
                "working directory {} is not a directory",
                full.display()
            ));
        }
        Ok(full)
    }
}

#[derive(Debug, Default)]
struct State {
    /// Recorded at the first reset.
    base: Option<Base>,
    /// The current world's number (0: none built yet).
    generation: u64,
    /// The state tmpfs is mounted and the delta directory made.
    mounted: bool,
    /// A delta was imported.
    imported: bool,
    /// A replacing import set the sandbox's own delta aside (at
    /// [`aside_dir`]); a reset with `restore` brings it back.
    aside: bool,
}

/// In-place reset for one sandbox; `None` support when not asked for.
#[derive(Debug)]
pub struct Pristine {
    /// Asked for (`init --pristine`): the handshake reports on it.
    requested: bool,
    /// The agent holds [`EXTRA_CAPS`]: commands must drop them.
    extra_caps: bool,
    support: ResetSupport,
    /// `size=` of the state tmpfs.
    size: Option<u64>,
    world: RwLock<Option<World>>,
    state: Mutex<State>,
    /// An import is taking the delta in: nothing else may touch it (the
    /// import's thread holds `state` while it waits for bytes, so the
    /// reader thread must not wait for that lock meanwhile).
    importing: AtomicBool,
    /// The host directory corral shares deltas through, taken from
    /// [`SHARED_DELTAS_DIR`] at start (see [`take_shared_deltas`]); only
    /// when in-place reset is ready.
    shared: Option<fs::File>,
}

/// Prepares PID 1 for resets. Call once, while the agent has one thread.
pub fn init(size: Option<u64>, filtered: bool) -> Pristine {
    let extra_caps = missing_extra_cap().is_none();
    let mut shared = None;
    let support = match readiness(filtered) {
        Ok(()) => {
            shared = take_shared_deltas();
            ResetSupport {
                ready: true,
                reason: String::new(),
            }
        }
        Err(reason) => {
            eprintln!("corral-agent: in-place reset is unavailable: {reason}");
            ResetSupport {
                ready: false,
                reason,
            }
        }
    };
    Pristine {
        requested: true,
        extra_caps,
        support,
        size,
        world: RwLock::new(None),
        state: Mutex::new(State::default()),
        importing: AtomicBool::new(false),
        shared,
    }
}

/// Takes the shared deltas mount for the agent alone: opens its directory,
/// then detaches the mount from the agent's (private) namespace, so no
/// world, built from that namespace, carries it, and no command sees what
/// it holds (the agent's descriptors are close-on-exec and PID 1 is not
/// dumpable: `/proc/1/fd` is closed to commands). `None` when nothing is
/// mounted there: a directory of the image by that name is never read.
fn take_shared_deltas() -> Option<fs::File> {
    let path = CString::new(SHARED_DELTAS_DIR).ok()?;
    let dir = fs::File::open(SHARED_DELTAS_DIR).ok()?;
    match sys::umount_detach(&path) {
        Ok(()) => Some(dir),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => None,
        Err(e) => {
            eprintln!("corral-agent: cannot take the shared deltas mount: {e}");
            None
        }
    }
}

/// Whether `name` may name a file of the shared deltas directory: one
/// component of letters, digits, `.`, `_` and `-`, neither `.` nor `..`.
fn shared_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The first of [`EXTRA_CAPS`] missing from this process's effective set.
fn missing_extra_cap() -> Option<u32> {
    let eff = fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0);
    EXTRA_CAPS.into_iter().find(|&cap| eff & (1 << cap) == 0)
}

fn readiness(filtered: bool) -> Result<(), String> {
    if !filtered {
        return Err("no-new-privileges is off, so commands could not be kept from the agent's extra capabilities".into());
    }
    let status = fs::read_to_string("/proc/self/status").map_err(|e| e.to_string())?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap_or("")
            .to_string()
    };
    // The effective uid: the agent's real one is its own (`ids`), its
    // effective one the commands'.
    let uid = field("Uid:");
    let effective = uid.split_whitespace().nth(1);
    if effective != Some("0") {
        return Err(format!(
            "the sandbox runs as uid {}, not root",
            effective.unwrap_or("?")
        ));
    }
    if let Some(cap) = missing_extra_cap() {
        return Err(format!(
            "the agent lacks capability {cap} (the sandbox was not created for in-place reset)"
        ));
    }
    let confined = |what: &str, e: io::Error| {
        let apparmor = fs::read_to_string("/proc/self/attr/apparmor/current")
            .or_else(|_| fs::read_to_string("/proc/self/attr/current"))
            .ok();
        format!(
            "{what}: {e}{}",
            confinement_hint(&e, apparmor.as_deref(), &field("Seccomp:"))
        )
    };
    sys::unshare_mount_ns().map_err(|e| confined("cannot make a mount namespace", e))?;
    sys::mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)
        .map_err(|e| confined("cannot make mounts private", e))
}

/// What confines the agent when a mount or namespace call it needs was
/// refused with the capabilities it holds: an AppArmor profile (a
/// container runtime's default one denies every mount), else a seccomp
/// filter (a runtime's default profile allows these calls only to a
/// container granted CAP_SYS_ADMIN). `apparmor` is the agent's label
/// from `/proc/self/attr`, `seccomp` the `Seccomp:` field of its status.
fn confinement_hint(e: &io::Error, apparmor: Option<&str>, seccomp: &str) -> String {
    if !matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)) {
        return String::new();
    }
    let label = apparmor
        .map(|l| l.trim_end_matches(['\n', '\0']).trim())
        .filter(|l| !l.is_empty() && *l != "unconfined");
    if let Some(label) = label {
        return format!(
            " (the AppArmor profile '{label}' confines the agent: a container runtime's \
             default profile denies mount; the sandbox container needs a profile that \
             allows it)"
        );
    }
    if seccomp == "2" {
        return " (a seccomp filter refused it: the container runtime's profile allows it \
                 only to a container granted CAP_SYS_ADMIN)"
            .into();
    }
    String::new()
}

impl Pristine {
    /// Not asked for: commands run as they always do.
    pub fn off() -> Pristine {
        Pristine {
            requested: false,
            extra_caps: false,
            support: ResetSupport {
                ready: false,
                reason: "the sandbox was not started for in-place reset".into(),
            },
            size: None,
            world: RwLock::new(None),
            state: Mutex::new(State::default()),
            importing: AtomicBool::new(false),
            shared: None,
        }
    }

    /// Asked for, but the engine could not start the sandbox for it: the
    /// handshake says why (`init --pristine-refused`).
    pub fn refused(reason: String) -> Pristine {
        Pristine {
            requested: true,
            extra_caps: false,
            support: ResetSupport {
                ready: false,
                reason,
            },
            size: None,
            world: RwLock::new(None),
            state: Mutex::new(State::default()),
            importing: AtomicBool::new(false),
            shared: None,
        }
    }

    /// What the handshake reports: nothing when not asked for.
    pub fn support(&self) -> Option<&ResetSupport> {
        self.requested.then_some(&self.support)
    }

    /// Whether commands must drop [`EXTRA_CAPS`].
    pub fn holds_extra_caps(&self) -> bool {
        self.extra_caps
    }

    /// Whether deltas can be exported and imported.
    pub fn deltas(&self) -> bool {
        self.requested && self.support.ready
    }

    /// Whether a delta can be taken from the shared deltas directory.
    pub fn shared_deltas(&self) -> bool {
        self.shared.is_some()
    }

    /// Opens the shared delta `name`, which must be a regular file of
    /// exactly `size` bytes. `Err` says why not (nothing was touched).
    pub fn open_shared(&self, name: &str, size: u64) -> Result<fs::File, String> {
        let dir = self
            .shared
            .as_ref()
            .ok_or("no shared deltas directory is mounted")?;
        if !shared_name_ok(name) {
            return Err(format!("shared delta {name:?}: not a valid name"));
        }
        let c =
            CString::new(name).map_err(|_| format!("shared delta {name:?}: not a valid name"))?;
        let file = sys::open_file_beneath(dir.as_fd(), &c)
            .map_err(|e| format!("shared delta {name}: {e}"))?;
        let meta = file
            .metadata()
            .map_err(|e| format!("shared delta {name}: {e}"))?;
        if !meta.file_type().is_file() || meta.len() != size {
            return Err(format!(
                "shared delta {name}: not a regular file of {size} bytes"
            ));
        }
        Ok(file)
    }

    /// The current world, held so that no reset replaces it meanwhile.
    fn current(&self) -> RwLockReadGuard<'_, Option<World>> {
        self.world.read().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The world a command runs in, held so that no reset replaces it
    /// meanwhile: the current one, or, before anything ran, the first
    /// world (built now). `None` when the sandbox does not reset in place
    /// (commands run in the agent's namespace). An error after a reset
    /// failed (there is no world, and the container's own root file
    /// system is never handed to commands) or while an import runs.
    pub fn enter(&self, reaper: &Reaper) -> Result<RwLockReadGuard<'_, Option<World>>, String> {
        if !self.support.ready {
            return Ok(self.current());
        }
        {
            let current = self.current();
            if current.is_some() {
                return Ok(current);
            }
        }
        if self.importing.load(Ordering::Acquire) {
            return Err("a delta is being imported; commands start once it is in".into());
        }
        {
            let mut world = self.world.write().unwrap_or_else(|p| p.into_inner());
            if world.is_none() {
                let mut state = self.lock_state();
                if state.generation != 0 || state.base.is_some() {
                    return Err(
                        "the last in-place reset failed: the sandbox has no clean state to run commands in"
                            .into(),
                    );
                }
                self.ensure_state(&mut state)?;
                let first = startup_base()?;
                state.generation = 1;
                let built = build(&first, 1, reaper);
                match built {
                    Ok(w) => *world = Some(w),
                    Err(e) => {
                        state.generation = 0;
                        discard(gen_dir(1));
                        return Err(format!("cannot prepare the sandbox's first world: {e}"));
                    }
                }
            }
        }
        Ok(self.current())
    }

    /// Mounts the state tmpfs and makes the delta directory, once.
    /// Called only while no command runs (before the first one, or in a
    /// reset), so nothing races the removal of a leftover at the state's
    /// path.
    fn ensure_state(&self, state: &mut State) -> Result<(), String> {
        if state.mounted {
            return Ok(());
        }
        let dir = Path::new(STATE);
        if let Ok(meta) = fs::symlink_metadata(dir) {
            let gone = if meta.is_dir() {
                fs::remove_dir_all(dir)
            } else {
                fs::remove_file(dir)
            };
            gone.map_err(|e| format!("cannot clear {STATE}: {e}"))?;
        }
        fs::DirBuilder::new()
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("cannot make {STATE}: {e}"))?;
        let data = match self.size {
            Some(s) => format!("mode=700,size={s}"),
            None => "mode=700".to_string(),
        };
        let data = CString::new(data).map_err(|e| e.to_string())?;
        sys::mount(
            Some(c"corral-state"),
            &cpath(dir)?,
            Some(c"tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV,
            Some(&data),
        )
        .map_err(|e| format!("cannot mount the reset state on {STATE}: {e}"))?;
        fs::DirBuilder::new()
            .mode(0o700)
            .create(delta_dir())
            .map_err(|e| format!("cannot make the delta: {e}"))?;
        state.mounted = true;
        Ok(())
    }

    /// Writes the delta to `out` as a tar archive with OCI whiteouts, at
    /// most `max` bytes. Resets wait meanwhile; commands go on (they never
    /// touch the delta).
    pub fn export(&self, out: impl io::Write, max: u64) -> Result<delta::Written, DeltaError> {
        self.delta_ready()?;
        let mut state = self.lock_state();
        self.ensure_state(&mut state)
            .map_err(|e| delta_error(DeltaErrorKind::Io, e))?;
        delta::export(&delta_dir(), out, max)
    }

    /// Checks (on the reader thread) that an import may start now, and
    /// marks it in progress: before the first command and the first reset,
    /// once; a replacing one only after the first reset (a warm pool's
    /// sandbox), any number of times.
    pub fn begin_import(&self, replace: bool) -> Result<(), DeltaError> {
        self.delta_ready()?;
        let state = self.lock_state();
        if replace && state.base.is_none() {
            return Err(delta_error(
                DeltaErrorKind::Unsupported,
                "a replacing import is for a sandbox that already reset in place",
            ));
        }
        if !replace && (state.generation != 0 || state.base.is_some() || state.imported) {
            return Err(delta_error(
                DeltaErrorKind::Unsupported,
                "a delta is imported once, before the sandbox's first command and reset",
            ));
        }
        if self.importing.swap(true, Ordering::AcqRel) {
            return Err(delta_error(
                DeltaErrorKind::Unsupported,
                "another import is in progress",
            ));
        }
        Ok(())
    }

    /// Takes the archive on `input` in as the delta (after
    /// [`Pristine::begin_import`]); on failure the delta is left empty.
    /// A replacing import extracts into a directory of its own first (the
    /// sandbox goes on meanwhile), then, like a reset, kills every process,
    /// sets the sandbox's delta aside (or drops an earlier import's) and
    /// starts a fresh world over the imported delta; on failure the
    /// sandbox is as it was.
    pub fn import(
        &self,
        input: impl io::Read,
        replace: bool,
        reaper: &Reaper,
    ) -> Result<delta::Imported, DeltaError> {
        if replace {
            let result = self.import_replacing(input, reaper);
            self.importing.store(false, Ordering::Release);
            return result;
        }
        let result = (|| {
            let mut state = self.lock_state();
            self.ensure_state(&mut state)
                .map_err(|e| delta_error(DeltaErrorKind::Io, e))?;
            let mounts = mount_points().map_err(|e| delta_error(DeltaErrorKind::Io, e))?;
            let done = delta::import(&delta_dir(), input, &mounts);
            match &done {
                Ok(_) => state.imported = true,
                Err(_) => {
                    if let Err(e) = delta::clear(&delta_dir()) {
                        eprintln!("corral-agent: cannot clear a failed import: {e}");
                    }
                }
            }
            done
        })();
        self.importing.store(false, Ordering::Release);
        result
    }

    fn import_replacing(
        &self,
        input: impl io::Read,
        reaper: &Reaper,
    ) -> Result<delta::Imported, DeltaError> {
        let io_error = |e: String| delta_error(DeltaErrorKind::Io, e);
        let incoming = incoming_dir();
        let done = {
            let mut state = self.lock_state();
            self.ensure_state(&mut state).map_err(io_error)?;
            remove_any(&incoming).map_err(io_error)?;
            fs::DirBuilder::new()
                .mode(0o700)
                .create(&incoming)
                .map_err(|e| io_error(format!("cannot make {}: {e}", incoming.display())))?;
            let mounts = mount_points().map_err(io_error)?;
            match delta::import(&incoming, input, &mounts) {
                Ok(done) => done,
                Err(e) => {
                    let _ = remove_any(&incoming);
                    return Err(e);
                }
            }
        };
        // Bytes are in: from here on it is a reset into the new delta
        // (locks in the order a reset takes them).
        let mut world = self.world.write().unwrap_or_else(|p| p.into_inner());
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if !crate::tree::kill_all_others(KILL_WAIT) {
            let _ = remove_any(&incoming);
            return Err(io_error(format!(
                "processes survived {KILL_WAIT:?} of SIGKILL; the delta was not taken in"
            )));
        }
        clear_ipc();
        if let Err(e) = crate::tunables::restore() {
            let _ = remove_any(&incoming);
            return Err(io_error(e.to_string()));
        }
        drop(world.take());
        let swapped = (|| {
            let base = state.base.as_ref().ok_or("no base recorded")?;
            for meta in &base.shared {
                meta.restore()?;
            }
            let previous = state.generation;
            discard(gen_dir(previous));
            let rename = |from: &Path, to: &Path| {
                fs::rename(from, to)
                    .map_err(|e| format!("cannot move {} to {}: {e}", from.display(), to.display()))
            };
            if state.aside {
                // An earlier import's delta: dropped.
                let old = Path::new(STATE).join(format!("old{previous}"));
                rename(&delta_dir(), &old)?;
                discard(old);
            } else {
                rename(&delta_dir(), &aside_dir())?;
                state.aside = true;
            }
            rename(&incoming, &delta_dir())?;
            state.generation += 1;
            let base = state.base.as_ref().ok_or("no base recorded")?;
            build(base, state.generation, reaper)
        })();
        match swapped {
            Ok(w) => {
                *world = Some(w);
                Ok(done)
            }
            Err(e) => Err(io_error(format!(
                "taking the delta in failed: {e}; the sandbox has no clean state to run commands in"
            ))),
        }
    }

    /// Undoes [`Pristine::begin_import`] for an import that never started.
    pub fn abort_import(&self) {
        self.importing.store(false, Ordering::Release);
    }

    fn delta_ready(&self) -> Result<(), DeltaError> {
        if !self.deltas() {
            return Err(delta_error(
                DeltaErrorKind::Unsupported,
                format!(
                    "the sandbox keeps no delta: in-place reset is unavailable: {}",
                    self.support.reason
                ),
            ));
        }
        if self.importing.load(Ordering::Acquire) {
            return Err(delta_error(
                DeltaErrorKind::Unsupported,
                "an import is in progress",
            ));
        }
        Ok(())
    }

    /// Kills every process but the agent and starts a fresh world (first
    /// merging what changed into the delta when `keep`, and applying the
    /// delta to the container's own root file system when `to_root`).
    pub fn reset(&self, keep: bool, to_root: bool, restore: bool, reaper: &Reaper) -> ResetReport {
        let started = Instant::now();
        let mut report = ResetReport::default();
        if !self.support.ready {
            report.error = Some(format!(
                "in-place reset is unavailable: {}",
                self.support.reason
            ));
            return report;
        }
        if self.importing.load(Ordering::Acquire) {
            report.error = Some("a delta is being imported; reset after it is in".into());
            return report;
        }
        let mut world = self.world.write().unwrap_or_else(|p| p.into_inner());
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        report.killed = count_others();
        if !crate::tree::kill_all_others(KILL_WAIT) {
            report.error = Some(format!(
                "processes survived {KILL_WAIT:?} of SIGKILL; the sandbox is not pristine"
            ));
            return report;
        }
        clear_ipc();
        // What the last episode wrote to PID 1 through /proc/1.
        if let Err(e) = crate::tunables::restore() {
            report.error = Some(format!("{e}; the sandbox is not pristine"));
            return report;
        }
        // Nothing runs in the old world now; dropping its descriptors
        // releases its mounts.
        let old = world.take();
        drop(old);
        let result = self.next_world(&mut state, keep, to_root, restore, reaper);
        match result {
            Ok((w, kept)) => {
                *world = Some(w);
                report.kept_bytes = kept;
            }
            Err(e) => report.error = Some(e),
        }
        report.elapsed_us = started.elapsed().as_micros() as u64;
        report
    }

    fn next_world(
        &self,
        state: &mut State,
        keep: bool,
        to_root: bool,
        restore: bool,
        reaper: &Reaper,
    ) -> Result<(World, u64), String> {
        self.ensure_state(state)?;
        let first = state.base.is_none();
        match &state.base {
            None => state.base = Some(self.record_base()?),
            Some(base) => {
                for meta in &base.shared {
                    meta.restore()?;
                }
            }
        }
        let previous = state.generation;
        let mut kept = 0;
        if previous > 0 {
            // The first world is the start-up commands': always kept.
            if keep || first {
                kept = delta::merge(&gen_dir(previous).join("upper"), &delta_dir())?;
            }
            discard(gen_dir(previous));
        }
        if restore && state.aside {
            // Back to the sandbox's own delta: the imported one goes.
            let old = Path::new(STATE).join(format!("old{previous}"));
            fs::rename(delta_dir(), &old)
                .map_err(|e| format!("cannot drop the imported delta: {e}"))?;
            discard(old);
            fs::rename(aside_dir(), delta_dir())
                .map_err(|e| format!("cannot bring the sandbox's delta back: {e}"))?;
            state.aside = false;
        }
        if to_root {
            fold(&delta_dir(), Path::new("/"))?;
        }
        state.generation += 1;
        let base = state.base.as_ref().ok_or("no base recorded")?;
        Ok((build(base, state.generation, reaper)?, kept))
    }

    /// At the first reset: what every world carries over.
    fn record_base(&self) -> Result<Base, String> {
        let info = fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("cannot read mountinfo: {e}"))?;
        let root = fs::metadata("/").map_err(|e| format!("cannot stat /: {e}"))?;
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        let mut entries = Vec::new();
        let mut shared = Vec::new();
        for m in parse_mountinfo(&info) {
            if m.path == Path::new("/") || m.path.starts_with(STATE) {
                continue;
            }
            if !m.read_only && ["proc", "devpts", "mqueue"].contains(&m.fstype.as_str()) {
                shared.push(Meta::of(m.path.clone())?);
                let ptmx = m.path.join("ptmx");
                if m.fstype == "devpts" && fs::symlink_metadata(&ptmx).is_ok() {
                    shared.push(Meta::of(ptmx)?);
                }
            }
            // The engine's tmpfs under /proc and /sys (cgroup v1's
            // writable /sys/fs/cgroup, the masks over /proc/keys, ...):
            // shared by every world, so read-only in each.
            let engine_tmpfs =
                m.fstype == "tmpfs" && m.path != Path::new("/dev") && !fresh_tmpfs(&m.path);
            let carry = if m.fstype == "tmpfs" && m.path == Path::new("/dev") {
                Carry::Dev {
                    flags: m.flags,
                    data: tmpfs_data(&m.super_options),
                    nodes: dev_nodes()?,
                }
            } else if m.fstype == "tmpfs" && fresh_tmpfs(&m.path) {
                Carry::Tmpfs {
                    flags: m.flags,
                    data: tmpfs_data(&m.super_options),
                    content: !is_empty_dir(&m.path),
                }
            } else if !m.read_only && fs::metadata(&m.path).is_ok_and(|md| md.is_file()) {
                Carry::File
            } else {
                Carry::Bind
            };
            entries.push(Entry {
                path: m.path,
                read_only: m.read_only || engine_tmpfs,
                flags: m.flags,
                carry,
            });
        }
        Ok(Base {
            entries,
            cwd,
            root_mode: root.mode() & 0o7777,
            root_owner: (root.uid(), root.gid()),
            shared,
        })
    }
}

/// Removes what commands left in the sandbox's IPC namespace, which is
/// not part of any file system view: System V shared memory, semaphore
/// sets and message queues, and POSIX message queues.
fn clear_ipc() {
    for (file, kind) in [
        ("/proc/sysvipc/shm", sys::Ipc::Shm),
        ("/proc/sysvipc/sem", sys::Ipc::Sem),
        ("/proc/sysvipc/msg", sys::Ipc::Msg),
    ] {
        let Ok(table) = fs::read_to_string(file) else {
            continue;
        };
        for id in table
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<i32>().ok())
        {
            if let Err(e) = sys::ipc_remove(kind, id) {
                eprintln!("corral-agent: cannot remove IPC object {id}: {e}");
            }
        }
    }
    if let Ok(dir) = fs::read_dir("/dev/mqueue") {
        for entry in dir.flatten() {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// Processes other than the agent right now.
fn count_others() -> u32 {
    let me = sys::getpid();
    crate::tree::scan().iter().filter(|p| p.pid != me).count() as u32
}

fn gen_dir(generation: u64) -> PathBuf {
    Path::new(STATE).join(format!("g{generation}"))
}

/// The sandbox's delta, in overlay form: a lower layer of every world.
fn delta_dir() -> PathBuf {
    Path::new(STATE).join("delta")
}

/// The sandbox's own delta while a replacing import's is in its place.
fn aside_dir() -> PathBuf {
    Path::new(STATE).join("aside")
}

/// Where a replacing import extracts its archive.
fn incoming_dir() -> PathBuf {
    Path::new(STATE).join("incoming")
}

fn delta_error(kind: DeltaErrorKind, message: impl Into<String>) -> DeltaError {
    DeltaError {
        kind,
        message: message.into(),
        path: None,
    }
}

/// The mount points of the agent's namespace below `/`, relative to it
/// (what an imported delta may not touch).
fn mount_points() -> Result<Vec<PathBuf>, String> {
    let info = fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read mountinfo: {e}"))?;
    Ok(parse_mountinfo(&info)
        .into_iter()
        .filter_map(|m| {
            let rel = m.path.strip_prefix("/").ok()?.to_path_buf();
            (!rel.as_os_str().is_empty()).then_some(rel)
        })
        .collect())
}

/// The first world's recipe: every mount of the agent's namespace bound
/// as it is (the start-up commands write the real tmpfs mounts and files,
/// whose content the first reset records), and the state's mount point
/// covered by an empty read-only tmpfs.
fn startup_base() -> Result<Base, String> {
    let info = fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read mountinfo: {e}"))?;
    let root = fs::metadata("/").map_err(|e| format!("cannot stat /: {e}"))?;
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let mut entries: Vec<Entry> = parse_mountinfo(&info)
        .into_iter()
        .filter(|m| m.path != Path::new("/") && !m.path.starts_with(STATE))
        .map(|m| Entry {
            path: m.path,
            read_only: m.read_only,
            flags: m.flags,
            carry: Carry::Bind,
        })
        .collect();
    let cover = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    entries.push(Entry {
        path: PathBuf::from(STATE),
        read_only: true,
        flags: cover,
        carry: Carry::Tmpfs {
            flags: cover,
            data: "size=4k,mode=000".into(),
            content: false,
        },
    });
    Ok(Base {
        entries,
        cwd,
        root_mode: root.mode() & 0o7777,
        root_owner: (root.uid(), root.gid()),
        shared: Vec::new(),
    })
}

/// Removes a world's directories in the background (the overlay's work
/// directory holds a mode-000 directory; it is opened up first).
fn discard(dir: PathBuf) {
    let work = dir.join("work").join("work");
    let _ = fs::set_permissions(&work, fs::Permissions::from_mode(0o700));
    let spawned = std::thread::Builder::new()
        .name("discard".into())
        .stack_size(256 * 1024)
        .spawn(move || {
            if let Err(e) = fs::remove_dir_all(&dir) {
                eprintln!("corral-agent: cannot remove {}: {e}", dir.display());
            }
        });
    if let Err(e) = spawned {
        eprintln!("corral-agent: cannot start a thread to remove an old world: {e}");
    }
}

/// Applies an overlay layer (the delta) to `target` (the real root file
/// system): a whiteout (character device 0:0) deletes, an opaque directory
/// replaces, everything else is copied over with its mode and owner.
/// Returns the bytes of file content copied.
fn fold(upper: &Path, target: &Path) -> Result<u64, String> {
    let mut bytes = 0;
    let entries =
        fs::read_dir(upper).map_err(|e| format!("cannot read {}: {e}", upper.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| e.to_string())?;
        let src = entry.path();
        let dst = target.join(entry.file_name());
        let meta = fs::symlink_metadata(&src).map_err(|e| format!("{}: {e}", src.display()))?;
        let here = fs::symlink_metadata(&dst).ok();
        let whiteout = delta::is_whiteout(&meta);
        let replace = match &here {
            None => false,
            Some(h) => {
                whiteout
                    || !(meta.is_dir() && h.is_dir())
                    || (meta.is_dir() && delta::is_opaque(&src))
            }
        };
        if replace {
            remove_any(&dst)?;
        }
        if whiteout {
            continue;
        }
        if meta.is_dir() {
            if !dst.is_dir() {
                fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&dst)
                    .map_err(|e| format!("cannot make {}: {e}", dst.display()))?;
            }
            bytes += fold(&src, &dst)?;
            chown(&dst, Some(meta.uid()), Some(meta.gid())).map_err(|e| e.to_string())?;
            fs::set_permissions(&dst, fs::Permissions::from_mode(meta.mode() & 0o7777))
                .map_err(|e| e.to_string())?;
        } else {
            copy_tree(&src, &dst)?;
            if meta.is_file() {
                bytes += meta.len();
            }
        }
    }
    Ok(bytes)
}

fn remove_any(path: &Path) -> Result<(), String> {
    let res = match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(_) => return Ok(()),
    };
    res.map_err(|e| format!("cannot remove {}: {e}", path.display()))
}

/// A tmpfs that belongs to the sandbox's own state (not `/dev` with its
/// device nodes, not the kernel's masks under `/proc` and `/sys`).
fn fresh_tmpfs(path: &Path) -> bool {
    path != Path::new("/dev") && !path.starts_with("/proc") && !path.starts_with("/sys")
}

fn is_empty_dir(path: &Path) -> bool {
    fs::read_dir(path).is_ok_and(|mut d| d.next().is_none())
}

/// The tmpfs options worth carrying to a fresh one.
fn tmpfs_data(super_options: &str) -> String {
    super_options
        .split(',')
        .filter(|o| {
            ["size=", "nr_inodes=", "mode=", "uid=", "gid="]
                .iter()
                .any(|k| o.starts_with(k))
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn cpath(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| format!("{} contains a NUL byte", p.display()))
}

/// One mount from `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MountInfo {
    path: PathBuf,
    fstype: String,
    read_only: bool,
    flags: libc::c_ulong,
    super_options: String,
}

/// Parses mountinfo, in mount order; lines it cannot read are skipped.
fn parse_mountinfo(text: &str) -> Vec<MountInfo> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let left: Vec<&str> = left.split(' ').collect();
            let path = PathBuf::from(OsStr::from_bytes(&unescape(left.get(4)?)));
            let opts = left.get(5)?;
            let mut right = right.split(' ');
            let fstype = right.next()?.to_string();
            let _source = right.next()?;
            let super_options = right.next().unwrap_or("").to_string();
            let mut flags = 0;
            let mut read_only = false;
            for o in opts.split(',') {
                match o {
                    "ro" => {
                        read_only = true;
                        flags |= libc::MS_RDONLY;
                    }
                    "nosuid" => flags |= libc::MS_NOSUID,
                    "nodev" => flags |= libc::MS_NODEV,
                    "noexec" => flags |= libc::MS_NOEXEC,
                    _ => {}
                }
            }
            Some(MountInfo {
                path,
                fstype,
                read_only,
                flags,
                super_options,
            })
        })
        .collect()
}

/// Undoes mountinfo's octal escapes (`\040` for a space, ...).
fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') as u32 * 64
                + (b[i + 2] - b'0') as u32 * 8
                + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// Copies a directory tree (directories, files, symlinks; mode and owner
/// kept; other kinds skipped with a log line).
fn copy_tree(from: &Path, to: &Path) -> Result<(), String> {
    let meta = fs::symlink_metadata(from).map_err(|e| format!("{}: {e}", from.display()))?;
    let err = |e: io::Error| format!("cannot copy {} to {}: {e}", from.display(), to.display());
    let ft = meta.file_type();
    if ft.is_symlink() {
        let target = fs::read_link(from).map_err(err)?;
        std::os::unix::fs::symlink(target, to).map_err(err)?;
        let _ = std::os::unix::fs::lchown(to, Some(meta.uid()), Some(meta.gid()));
        return Ok(());
    }
    if ft.is_dir() {
        if fs::symlink_metadata(to).is_err() {
            fs::DirBuilder::new().mode(0o700).create(to).map_err(err)?;
        }
        for entry in fs::read_dir(from).map_err(err)? {
            let entry = entry.map_err(err)?;
            copy_tree(&entry.path(), &to.join(entry.file_name()))?;
        }
    } else if ft.is_file() {
        fs::copy(from, to).map_err(err)?;
    } else {
        eprintln!(
            "corral-agent: reset does not carry {} (not a file, directory or symlink)",
            from.display()
        );
        return Ok(());
    }
    chown(to, Some(meta.uid()), Some(meta.gid())).map_err(err)?;
    fs::set_permissions(to, fs::Permissions::from_mode(meta.mode() & 0o7777)).map_err(err)
}

/// One step of the child that builds a world, with everything it needs
/// prepared (the child may not allocate).
enum Step {
    Bind {
        src: CString,
        dst: CString,
        remount: Option<libc::c_ulong>,
    },
    Tmpfs {
        dst: CString,
        flags: libc::c_ulong,
        data: CString,
    },
    /// An empty file to bind a device onto.
    Touch {
        dst: CString,
    },
    Symlink {
        target: CString,
        dst: CString,
    },
    Mkdir {
        dst: CString,
        mode: u32,
    },
}

/// Builds world `generation`: directories on the state, a forked child
/// that makes the namespace and pivots into it, and the content of
/// non-empty tmpfs mounts copied in through the child's root.
fn build(base: &Base, generation: u64, reaper: &Reaper) -> Result<World, String> {
    let dir = gen_dir(generation);
    let io = |what: &str, e: io::Error| format!("cannot make {what}: {e}");
    for sub in ["", "upper", "work", "root", "files"] {
        fs::DirBuilder::new()
            .mode(0o700)
            .create(dir.join(sub))
            .map_err(|e| io(&dir.join(sub).display().to_string(), e))?;
    }
    let upper = dir.join("upper");
    fs::set_permissions(&upper, fs::Permissions::from_mode(base.root_mode))
        .map_err(|e| io("the upper layer", e))?;
    chown(&upper, Some(base.root_owner.0), Some(base.root_owner.1))
        .map_err(|e| io("the upper layer", e))?;
    let root = dir.join("root");

    // The delta over the container's root file system. Directory renames
    // and metadata-only copies are kept off whatever the module's
    // defaults, so an upper layer holds whole entries a merge can copy (a
    // kernel that does not know the options gets the plain mount).
    let layers = format!(
        "lowerdir={}:/,upperdir={},workdir={}",
        delta_dir().display(),
        upper.display(),
        dir.join("work").display()
    );
    let overlay = [
        CString::new(format!("{layers},redirect_dir=off,metacopy=off,index=off"))
            .map_err(|e| e.to_string())?,
        CString::new(layers).map_err(|e| e.to_string())?,
    ];

    // Each step with what it carries, for the error message.
    let mut steps: Vec<(Step, String)> = Vec::new();
    let mut fills = Vec::new();
    let inside = |p: &Path| cpath(&root.join(p.strip_prefix("/").unwrap_or(p)));
    for (i, e) in base.entries.iter().enumerate() {
        let label = e.path.display().to_string();
        let dst = inside(&e.path)?;
        if let Some(step) = mount_point(base, e, dst.clone()) {
            steps.push((step, label.clone()));
        }
        match &e.carry {
            Carry::Bind => steps.push((
                Step::Bind {
                    src: cpath(&e.path)?,
                    dst,
                    remount: e.read_only.then_some(e.flags | libc::MS_RDONLY),
                },
                label,
            )),
            Carry::File => {
                let fresh = dir.join("files").join(i.to_string());
                let copy = &e.path;
                fs::copy(copy, &fresh).map_err(|e| io("a file copy", e))?;
                let meta = fs::metadata(copy).map_err(|e| io("a file copy", e))?;
                fs::set_permissions(&fresh, meta.permissions())
                    .map_err(|e| io("a file copy", e))?;
                chown(&fresh, Some(meta.uid()), Some(meta.gid()))
                    .map_err(|e| io("a file copy", e))?;
                steps.push((
                    Step::Bind {
                        src: cpath(&fresh)?,
                        dst,
                        remount: None,
                    },
                    label,
                ));
            }
            Carry::Tmpfs {
                flags,
                data,
                content,
            } => {
                steps.push((
                    Step::Tmpfs {
                        dst,
                        flags: *flags,
                        data: CString::new(data.as_str()).map_err(|e| e.to_string())?,
                    },
                    label,
                ));
                if *content {
                    let rel = e.path.strip_prefix("/").unwrap_or(&e.path);
                    fills.push((e.path.clone(), rel.to_path_buf()));
                }
            }
            Carry::Dev { flags, data, nodes } => {
                steps.push((
                    Step::Tmpfs {
                        dst,
                        flags: *flags,
                        data: CString::new(data.as_str()).map_err(|e| e.to_string())?,
                    },
                    label,
                ));
                for node in nodes {
                    match node {
                        DevNode::Device(p) => {
                            let dst = inside(p)?;
                            let label = p.display().to_string();
                            steps.push((Step::Touch { dst: dst.clone() }, label.clone()));
                            // Every world binds the same node: read-only,
                            // so its mode, owner and times stay as they
                            // are (reading and writing the device is not
                            // refused on a read-only mount).
                            steps.push((
                                Step::Bind {
                                    src: cpath(p)?,
                                    dst,
                                    remount: Some(*flags | libc::MS_RDONLY),
                                },
                                label,
                            ));
                        }
                        DevNode::Symlink(p, target) => steps.push((
                            Step::Symlink {
                                target: cpath(target)?,
                                dst: inside(p)?,
                            },
                            p.display().to_string(),
                        )),
                        DevNode::Dir(p, mode) => steps.push((
                            Step::Mkdir {
                                dst: inside(p)?,
                                mode: *mode,
                            },
                            p.display().to_string(),
                        )),
                    }
                }
            }
        }
    }
    let (steps, labels): (Vec<Step>, Vec<String>) = steps.into_iter().unzip();
    let root_c = cpath(&root)?;
    let (ready_r, ready_w) = sys::pipe().map_err(|e| io("a pipe", e))?;
    let (go_r, go_w) = sys::pipe().map_err(|e| io("a pipe", e))?;
    // The builder runs as the commands' user (root), as the world's
    // files are theirs, and so that the agent, whose files are root's
    // too (its filesystem uid), may open its `/proc/PID/ns/mnt` and `root`.
    let as_user = crate::ids::command_plan();
    // SAFETY: the child branch below only makes raw system calls on data
    // prepared above, then `_exit`s.
    let pid = unsafe { sys::fork() }.map_err(|e| io("the world's builder", e))?;
    if pid == 0 {
        drop(ready_r);
        drop(go_w);
        child(
            &as_user,
            &overlay,
            &root_c,
            &steps,
            ready_w.as_raw_fd(),
            go_r.as_raw_fd(),
        );
    }
    reaper.adopted();
    drop(ready_w);
    drop(go_r);
    let mut status = [0u8; 8];
    let n = sys::read_raw(ready_r.as_raw_fd(), &mut status).map_err(|e| io("the world", e))?;
    if n != 8 {
        return Err("the world's builder died before it finished".into());
    }
    let step = u32::from_le_bytes([status[0], status[1], status[2], status[3]]);
    let errno = i32::from_le_bytes([status[4], status[5], status[6], status[7]]);
    if step != 0 {
        return Err(describe_failure(step, errno, &labels));
    }
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let ns = fs::File::open(proc_dir.join("ns/mnt")).map_err(|e| io("the world's namespace", e))?;
    let root_fd = open_dir(&proc_dir.join("root")).map_err(|e| io("the world's root", e))?;
    for (content, rel) in fills {
        copy_into(&content, &proc_dir.join("root").join(rel))?;
    }
    // The builder exits when `go` closes (it is reaped as an orphan).
    drop(go_w);
    Ok(World {
        ns: ns.into(),
        root: root_fd,
        cwd: base.cwd.clone(),
    })
}

/// The step that makes `e`'s mount point, when `e` is mounted inside a
/// mount the world makes afresh (a tmpfs, `/dev`), where it does not
/// exist yet: Kubernetes binds `/dev/termination-log`, a file no device
/// list carries. Directories directly in `/dev` are made with its nodes.
fn mount_point(base: &Base, e: &Entry, dst: CString) -> Option<Step> {
    if !matches!(e.carry, Carry::Bind | Carry::File) {
        return None;
    }
    let fresh_parent = base.entries.iter().find(|o| {
        matches!(o.carry, Carry::Dev { .. } | Carry::Tmpfs { .. })
            && o.path != e.path
            && e.path.starts_with(&o.path)
    })?;
    let meta = fs::symlink_metadata(&e.path).ok()?;
    if meta.is_dir() {
        let made_with_dev = matches!(fresh_parent.carry, Carry::Dev { .. })
            && e.path.parent() == Some(fresh_parent.path.as_path());
        return (!made_with_dev).then_some(Step::Mkdir {
            dst,
            mode: meta.mode() & 0o7777,
        });
    }
    Some(Step::Touch { dst })
}

fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    Ok(fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(path)?
        .into())
}

/// Copies the children of `from` into the existing directory `to`, but
/// never the state.
fn copy_into(from: &Path, to: &Path) -> Result<(), String> {
    let entries = fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| e.to_string())?;
        let path = entry.path();
        if path == Path::new(STATE) {
            continue;
        }
        copy_tree(&path, &to.join(entry.file_name()))?;
    }
    Ok(())
}

fn describe_failure(step: u32, errno: i32, labels: &[String]) -> String {
    let e = io::Error::from_raw_os_error(errno);
    match step {
        1 => format!("cannot make the world's mount namespace: {e}"),
        2 => format!("cannot make the world's mounts private: {e}"),
        3 => format!("cannot mount the overlay over the root file system: {e}"),
        5 => format!("cannot enter the world's root: {e}"),
        6 => format!("cannot move the world's root over /: {e}"),
        7 => format!("cannot enter the world's root: {e}"),
        9 => format!("cannot become the commands' user: {e}"),
        s if s >= 100 => {
            let what = labels
                .get((s - 100) as usize)
                .map(String::as_str)
                .unwrap_or("?");
            format!("cannot carry the mount {what} into the world: {e}")
        }
        s => format!("building the world failed at step {s}: {e}"),
    }
}

/// The builder: a forked, single-threaded child. Reports `[step, errno]`
/// (step 0: ready) on `ready`, then waits for `go` to close.
fn child(
    as_user: &crate::ids::Plan,
    overlay: &[CString; 2],
    root: &CString,
    steps: &[Step],
    ready: RawFd,
    go: RawFd,
) -> ! {
    let fail = |step: u32, e: io::Error| -> ! {
        let errno = e.raw_os_error().unwrap_or(0);
        let mut buf = [0u8; 8];
        buf[..4].copy_from_slice(&step.to_le_bytes());
        buf[4..].copy_from_slice(&errno.to_le_bytes());
        sys::write_all_raw(ready, &buf);
        sys::exit_child(1)
    };
    if let Err(e) = as_user.apply_in_child(&[], false) {
        fail(9, e);
    }
    // The parent reads our namespace and root through /proc/PID, which a
    // non-dumpable process does not allow; no command runs during a reset.
    if let Err(e) = sys::set_dumpable() {
        fail(8, e);
    }
    if let Err(e) = sys::unshare_mount_ns() {
        fail(1, e);
    }
    if let Err(e) = sys::mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None) {
        fail(2, e);
    }
    let mounted = sys::mount(
        Some(c"overlay"),
        root,
        Some(c"overlay"),
        0,
        Some(&overlay[0]),
    )
    .or_else(|e| {
        if e.raw_os_error() == Some(libc::EINVAL) {
            sys::mount(
                Some(c"overlay"),
                root,
                Some(c"overlay"),
                0,
                Some(&overlay[1]),
            )
        } else {
            Err(e)
        }
    });
    if let Err(e) = mounted {
        fail(3, e);
    }
    for (i, step) in steps.iter().enumerate() {
        let code = 100 + i as u32;
        let res = match step {
            Step::Bind { src, dst, remount } => {
                sys::mount(Some(src), dst, None, libc::MS_BIND, None).and_then(|()| match remount {
                    Some(flags) => sys::mount(
                        None,
                        dst,
                        None,
                        libc::MS_BIND | libc::MS_REMOUNT | flags,
                        None,
                    ),
                    None => Ok(()),
                })
            }
            Step::Tmpfs { dst, flags, data } => {
                sys::mount(Some(c"tmpfs"), dst, Some(c"tmpfs"), *flags, Some(data))
            }
            Step::Touch { dst } => sys::touch(dst),
            Step::Symlink { target, dst } => sys::symlink(target, dst),
            Step::Mkdir { dst, mode } => sys::mkdir(dst, *mode),
        };
        if let Err(e) = res {
            fail(code, e);
        }
    }
    // Docker's seccomp profile has no pivot_root: the new root is moved
    // over `/` instead (setns finds the mount on top of a namespace's
    // root), and the builder chroots into it.
    if let Err(e) = sys::chdir(root) {
        fail(5, e);
    }
    if let Err(e) = sys::mount(Some(c"."), c"/", None, libc::MS_MOVE, None) {
        fail(6, e);
    }
    if let Err(e) = sys::chroot_here() {
        fail(7, e);
    }
    let _ = sys::chdir(c"/");
    sys::write_all_raw(ready, &[0u8; 8]);
    let mut b = [0u8; 1];
    let _ = sys::read_raw(go, &mut b);
    sys::exit_child(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_delta_is_named_by_one_or_two_plain_components() {
        for ok in ["a.tar", "0af9.tar", "x_y-z.1"] {
            assert!(shared_name_ok(ok), "{ok}");
        }
        for bad in [
            "",
            "/abs.tar",
            "a/",
            "../x",
            "a/../b",
            "a/b/c",
            ".",
            "..",
            "a/.",
            "a b",
            "a\0b",
            "ü",
            "123-456/0af9.tar",
        ] {
            assert!(!shared_name_ok(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_mount_inside_a_fresh_mount_gets_its_mount_point() {
        let dir = std::env::temp_dir().join(format!("corral-mp-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("sub")).expect("dirs");
        fs::write(dir.join("termination-log"), b"").expect("file");
        let entry = |path: PathBuf, carry: Carry| Entry {
            path,
            read_only: false,
            flags: 0,
            carry,
        };
        let base = Base {
            entries: vec![
                entry(
                    dir.clone(),
                    Carry::Dev {
                        flags: 0,
                        data: String::new(),
                        nodes: Vec::new(),
                    },
                ),
                entry(dir.join("termination-log"), Carry::File),
                entry(dir.join("sub"), Carry::Bind),
                entry(dir.join("sub/deeper"), Carry::Bind),
                entry(PathBuf::from("/etc/hosts"), Carry::File),
            ],
            cwd: PathBuf::from("/"),
            root_mode: 0o755,
            root_owner: (0, 0),
            shared: Vec::new(),
        };
        let dst = || CString::new("/x").expect("c");
        // A file under the fresh mount: made empty, then bound over.
        assert!(matches!(
            mount_point(&base, &base.entries[1], dst()),
            Some(Step::Touch { .. })
        ));
        // A directory directly in /dev comes with its nodes.
        assert!(mount_point(&base, &base.entries[2], dst()).is_none());
        // Not there (or outside any fresh mount): nothing to make.
        assert!(mount_point(&base, &base.entries[3], dst()).is_none());
        assert!(mount_point(&base, &base.entries[4], dst()).is_none());
        assert!(mount_point(&base, &base.entries[0], dst()).is_none());
        fs::create_dir_all(dir.join("sub/deeper")).expect("deeper");
        assert!(matches!(
            mount_point(&base, &base.entries[3], dst()),
            Some(Step::Mkdir { .. })
        ));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_refused_mount_names_what_confines_the_agent() {
        let denied = io::Error::from_raw_os_error(libc::EACCES);
        let hint = confinement_hint(&denied, Some("cri-containerd.apparmor.d (enforce)\n"), "2");
        assert!(
            hint.contains("AppArmor profile 'cri-containerd.apparmor.d (enforce)'"),
            "{hint}"
        );
        let eperm = io::Error::from_raw_os_error(libc::EPERM);
        for unconfined in [None, Some("unconfined\n"), Some("")] {
            let hint = confinement_hint(&eperm, unconfined, "2");
            assert!(hint.contains("seccomp filter"), "{hint}");
            assert_eq!(confinement_hint(&eperm, unconfined, "0"), "");
        }
        // Not a refusal: nothing confines, something else is wrong.
        let other = io::Error::from_raw_os_error(libc::EINVAL);
        assert_eq!(
            confinement_hint(&other, Some("docker-default (enforce)"), "2"),
            ""
        );
    }

    #[test]
    fn parses_docker_mountinfo() {
        let info = "\
1 0 0:1 / / rw,relatime - fuse.fuse-overlayfs fuse-overlayfs rw,user_id=0
2 1 0:2 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
3 1 0:3 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755,inode64
4 3 0:4 / /dev/shm rw,nosuid,nodev,noexec,relatime - tmpfs shm rw,size=65536k,inode64
5 1 8:1 /containers/x/hosts /etc/hosts rw,relatime - ext4 /dev/vda rw
6 2 0:3 /null /proc/kcore ro,nosuid - tmpfs tmpfs rw,size=65536k
7 1 0:9 / /my\\040dir rw - tmpfs tmpfs rw,size=1024k,mode=1777,uid=5
";
        let m = parse_mountinfo(info);
        assert_eq!(m.len(), 7);
        assert_eq!(m[0].path, Path::new("/"));
        assert_eq!(
            m[3].flags,
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC
        );
        assert!(m[5].read_only);
        assert_eq!(m[6].path, Path::new("/my dir"));
        assert_eq!(
            tmpfs_data(&m[6].super_options),
            "size=1024k,mode=1777,uid=5"
        );
        assert!(fresh_tmpfs(&m[3].path));
        assert!(!fresh_tmpfs(&m[2].path));
        assert!(!fresh_tmpfs(&m[5].path));
        assert!(!fresh_tmpfs(Path::new("/sys/firmware")));
    }

    #[test]
    fn unescapes_only_octal_triples() {
        assert_eq!(unescape("a\\040b"), b"a b");
        assert_eq!(unescape("a\\04"), b"a\\04");
        assert_eq!(unescape("\\134x"), b"\\x");
    }
}
