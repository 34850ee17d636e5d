//! In-place reset: commands run in a disposable view of the file system.
//!
//! A sandbox started for it (`init --pristine`) gets three capabilities
//! more than usual, for the agent alone: CAP_SYS_ADMIN and CAP_SYS_CHROOT
//! (to build mount namespaces and move commands into them) and CAP_SETPCAP
//! (to take the other two out of every command's bounding set). PID 1
//! gives itself a private mount namespace at start, while it still has one
//! thread. Until the first reset, commands (the start-up commands) run in
//! it, on the real root file system.
//!
//! A reset kills every process but the agent, then builds a *world*: a
//! mount namespace whose root is an overlay with the container's root file
//! system (as the start-up commands left it) as its lower layer and an
//! empty directory on a private tmpfs (the state, mounted on a directory
//! of `/dev/shm` in the agent's namespace only) as its upper layer. Every other mount of
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
//! A reset that keeps the changes applies the upper layer to the
//! container's own root file system first (whiteouts become deletions,
//! opaque directories replace what was there), so later resets, and a
//! snapshot of the container, start from it.

use std::ffi::{CString, OsStr};
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{chown, DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use corral_core::protocol::{ResetReport, ResetSupport};

use crate::reaper::Reaper;
use crate::sys;

/// The agent's extra capabilities, in the order commands drop them
/// (CAP_SETPCAP last: dropping from the bounding set needs it).
pub const EXTRA_CAPS: [u32; 3] = [CAP_SYS_ADMIN, CAP_SYS_CHROOT, CAP_SETPCAP];
const CAP_SETPCAP: u32 = 8;
const CAP_SYS_CHROOT: u32 = 18;
const CAP_SYS_ADMIN: u32 = 21;

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
    base: Option<Base>,
    generation: u64,
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
}

/// Prepares PID 1 for resets. Call once, while the agent has one thread.
pub fn init(size: Option<u64>, filtered: bool) -> Pristine {
    let extra_caps = missing_extra_cap().is_none();
    let support = match readiness(filtered) {
        Ok(()) => ResetSupport {
            ready: true,
            reason: String::new(),
        },
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
    }
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
    let uid = field("Uid:");
    if uid.split_whitespace().next() != Some("0") {
        return Err(format!(
            "the sandbox runs as uid {}, not root",
            uid.split_whitespace().next().unwrap_or("?")
        ));
    }
    if let Some(cap) = missing_extra_cap() {
        return Err(format!(
            "the agent lacks capability {cap} (the sandbox was not created for in-place reset)"
        ));
    }
    sys::unshare_mount_ns().map_err(|e| format!("cannot make a mount namespace: {e}"))?;
    sys::mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)
        .map_err(|e| format!("cannot make mounts private: {e}"))
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

    /// The current world, held so that no reset replaces it meanwhile.
    pub fn current(&self) -> RwLockReadGuard<'_, Option<World>> {
        self.world.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Kills every process but the agent and starts a fresh world
    /// (first applying what changed to the root file system when `keep`).
    pub fn reset(&self, keep: bool, reaper: &Reaper) -> ResetReport {
        let started = Instant::now();
        let mut report = ResetReport::default();
        if !self.support.ready {
            report.error = Some(format!(
                "in-place reset is unavailable: {}",
                self.support.reason
            ));
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
        let result = self.next_world(&mut state, keep, reaper);
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
        reaper: &Reaper,
    ) -> Result<(World, u64), String> {
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
            if keep {
                kept = fold(&gen_dir(previous).join("upper"), Path::new("/"))?;
            }
            discard(gen_dir(previous));
        }
        state.generation += 1;
        let base = state.base.as_ref().ok_or("no base recorded")?;
        Ok((build(base, state.generation, reaper)?, kept))
    }

    /// At the first reset: what every world carries over, then the state
    /// tmpfs (in the agent's namespace only).
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
        // Nothing runs now, so nothing can race these: a leftover at the
        // state's path (a start-up command's, say) is removed, never
        // followed.
        let state = Path::new(STATE);
        if let Ok(meta) = fs::symlink_metadata(state) {
            let gone = if meta.is_dir() {
                fs::remove_dir_all(state)
            } else {
                fs::remove_file(state)
            };
            gone.map_err(|e| format!("cannot clear {STATE}: {e}"))?;
        }
        fs::DirBuilder::new()
            .mode(0o700)
            .create(state)
            .map_err(|e| format!("cannot make {STATE}: {e}"))?;
        let data = match self.size {
            Some(s) => format!("mode=700,size={s}"),
            None => "mode=700".to_string(),
        };
        let data = CString::new(data).map_err(|e| e.to_string())?;
        sys::mount(
            Some(c"corral-state"),
            &cpath(state)?,
            Some(c"tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV,
            Some(&data),
        )
        .map_err(|e| format!("cannot mount the reset state on {STATE}: {e}"))?;
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

/// Applies an overlay upper layer to `target` (the real root file
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
        let whiteout = meta.file_type().is_char_device() && meta.rdev() == 0;
        let replace = match &here {
            None => false,
            Some(h) => {
                whiteout || !(meta.is_dir() && h.is_dir()) || (meta.is_dir() && is_opaque(&src))
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

/// Whether an upper-layer directory hides everything below it.
fn is_opaque(dir: &Path) -> bool {
    let Ok(path) = CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    sys::getxattr(&path, c"trusted.overlay.opaque").is_some_and(|v| v == b"y")
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

    let overlay = CString::new(format!(
        "lowerdir=/,upperdir={},workdir={}",
        upper.display(),
        dir.join("work").display()
    ))
    .map_err(|e| e.to_string())?;

    // Each step with what it carries, for the error message.
    let mut steps: Vec<(Step, String)> = Vec::new();
    let mut fills = Vec::new();
    let inside = |p: &Path| cpath(&root.join(p.strip_prefix("/").unwrap_or(p)));
    for (i, e) in base.entries.iter().enumerate() {
        let label = e.path.display().to_string();
        let dst = inside(&e.path)?;
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
    // SAFETY: the child branch below only makes raw system calls on data
    // prepared above, then `_exit`s.
    let pid = unsafe { sys::fork() }.map_err(|e| io("the world's builder", e))?;
    if pid == 0 {
        drop(ready_r);
        drop(go_w);
        child(
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
fn child(overlay: &CString, root: &CString, steps: &[Step], ready: RawFd, go: RawFd) -> ! {
    let fail = |step: u32, e: io::Error| -> ! {
        let errno = e.raw_os_error().unwrap_or(0);
        let mut buf = [0u8; 8];
        buf[..4].copy_from_slice(&step.to_le_bytes());
        buf[4..].copy_from_slice(&errno.to_le_bytes());
        sys::write_all_raw(ready, &buf);
        sys::exit_child(1)
    };
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
    if let Err(e) = sys::mount(Some(c"overlay"), root, Some(c"overlay"), 0, Some(overlay)) {
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
