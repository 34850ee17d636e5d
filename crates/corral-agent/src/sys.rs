//! Thin, safe wrappers over the few libc calls std does not offer.
//!
//! Every `unsafe` block of the agent lives here, each with the reason it is
//! sound, so the rest of the crate is plain safe Rust.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// The signals PID 1 takes over: blocked in every thread, collected by one
/// thread with `sigwaitinfo` and forwarded to the sandbox's processes.
pub const FORWARDED: [libc::c_int; 6] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// The calling process's real user id.
#[cfg(test)]
pub fn getuid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// The calling process's pid.
pub fn getpid() -> i32 {
    // SAFETY: getpid has no preconditions and cannot fail.
    unsafe { libc::getpid() }
}

/// The calling process's process group id.
pub fn getpgrp() -> i32 {
    // SAFETY: getpgrp has no preconditions and cannot fail.
    unsafe { libc::getpgrp() }
}

/// The calling process's session id, or `None` if it cannot be read.
pub fn getsid() -> Option<i32> {
    // SAFETY: getsid(0) only queries the calling process.
    let sid = unsafe { libc::getsid(0) };
    (sid > 0).then_some(sid)
}

/// `kill(2)`. Errors are returned, not interpreted: callers decide whether
/// `ESRCH` (already gone) matters.
pub fn kill(pid: i32, sig: i32) -> io::Result<()> {
    // SAFETY: kill takes plain integers; the kernel validates them.
    cvt(unsafe { libc::kill(pid, sig) }).map(drop)
}

fn sigset(signals: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: sigset_t is a plain bit array; an all-zero value is valid
    // storage and sigemptyset initialises it properly right after.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is valid, writable storage for a sigset_t; sigemptyset and
    // sigaddset with valid signal numbers cannot fail.
    unsafe {
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
    }
    set
}

/// Blocks `signals` in the calling thread; threads spawned afterwards inherit
/// the mask, which is why `init` calls this before starting any thread.
/// Returns the mask before, for [`set_signal_mask`].
pub fn block_signals(signals: &[libc::c_int]) -> io::Result<libc::sigset_t> {
    let set = sigset(signals);
    // SAFETY: sigset_t is plain data; pthread_sigmask fills it in.
    let mut before: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is an initialised sigset_t, `before` valid storage.
    let ret = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut before) };
    if ret != 0 {
        return Err(io::Error::from_raw_os_error(ret));
    }
    Ok(before)
}

/// Makes `mask` (from [`block_signals`]) the calling thread's signal mask.
pub fn set_signal_mask(mask: &libc::sigset_t) -> io::Result<()> {
    // SAFETY: `mask` is an initialised sigset_t; a null old-set pointer is allowed.
    let ret = unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, mask, std::ptr::null_mut()) };
    if ret != 0 {
        return Err(io::Error::from_raw_os_error(ret));
    }
    Ok(())
}

/// Waits for one of `signals` (which must be blocked); returns it and the
/// sender's pid as this pid namespace sees it: 0 when the sender lives
/// outside the sandbox (the daemon, the runtime, the kernel).
pub fn sigwaitinfo(signals: &[libc::c_int]) -> io::Result<(libc::c_int, i32)> {
    let set = sigset(signals);
    // SAFETY: siginfo_t is plain data for which all-zero is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: both pointers point to valid, initialised locals.
        let sig = unsafe { libc::sigwaitinfo(&set, &mut info) };
        if sig >= 0 {
            // SAFETY: si_pid is valid to read for the SI_USER/SI_QUEUE/
            // SI_TKILL signals sent with kill(2)/tgkill(2), and is 0 for
            // kernel-generated ones, whose union we never interpret otherwise.
            let pid = unsafe { info.si_pid() };
            return Ok((sig, pid));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Bytes waiting to be read on `fd` (a pipe or socket).
pub fn bytes_readable(fd: RawFd) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the valid pointer.
    cvt(unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) })?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// The next offset at or after `from` in `fd` where data (`whence`
/// `SEEK_DATA`) or a hole (`SEEK_HOLE`) starts; `None` past the last data.
pub fn seek_data_or_hole(
    fd: BorrowedFd<'_>,
    from: u64,
    whence: libc::c_int,
) -> io::Result<Option<u64>> {
    let from =
        libc::off_t::try_from(from).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: lseek on a descriptor the caller holds open; no memory is passed.
    let at = unsafe { libc::lseek(fd.as_raw_fd(), from, whence) };
    if at < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENXIO) => Ok(None),
            _ => Err(e),
        };
    }
    Ok(Some(at as u64))
}

/// Makes this process non-dumpable: without CAP_SYS_PTRACE (which no
/// sandbox has) nothing can ptrace it or open its `/proc/PID/fd/*`,
/// `/proc/PID/mem` or `/proc/PID/environ`, even as the same uid.
pub fn set_non_dumpable() -> io::Result<()> {
    // SAFETY: PR_SET_DUMPABLE takes plain integer arguments.
    cvt(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) }).map(drop)
}

/// Puts the calling (forked, not yet exec'd) child into a standard signal
/// state: empty mask, SIGPIPE at its default. Only async-signal-safe calls,
/// because it runs between fork and exec of a multi-threaded parent.
pub fn reset_signals_in_child() -> io::Result<()> {
    // SAFETY: sigemptyset/pthread_sigmask/signal are async-signal-safe and
    // operate on a local set; nothing here allocates or takes locks.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        let ret = libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        if ret != 0 {
            return Err(io::Error::from_raw_os_error(ret));
        }
        if libc::signal(libc::SIGPIPE, libc::SIG_DFL) == libc::SIG_ERR {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Makes the calling (forked, not yet exec'd) child the OOM killer's
/// preferred victim over the agent (adj 500 of 1000), so a
/// command that exhausts memory is killed itself rather than taking the
/// sandbox's control path down. Raising one's own score needs no privilege.
/// Best effort: a missing or read-only /proc changes nothing else.
pub fn prefer_oom_kill_in_child() {
    const PATH: &[u8] = b"/proc/self/oom_score_adj\0";
    const VALUE: &[u8] = b"500";
    // SAFETY: open/write/close are async-signal-safe; PATH is NUL-terminated
    // and VALUE outlives the call.
    unsafe {
        let fd = libc::open(PATH.as_ptr().cast(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd >= 0 {
            libc::write(fd, VALUE.as_ptr().cast(), VALUE.len());
            libc::close(fd);
        }
    }
}

/// Sets `RLIMIT_NPROC` (soft and hard) of a forked child to `n`;
/// async-signal-safe.
pub fn limit_processes_in_child(n: u64) -> io::Result<()> {
    let limit = libc::rlimit {
        rlim_cur: n,
        rlim_max: n,
    };
    // SAFETY: setrlimit reads one valid struct and is async-signal-safe.
    cvt(unsafe { libc::setrlimit(libc::RLIMIT_NPROC, &limit) }).map(drop)
}

/// Makes the process `cmd` spawns receive SIGKILL when the thread that
/// spawned it ends (`PR_SET_PDEATHSIG`): a kernel never outlives its
/// `corral-agent kernel` relay.
pub fn die_with_parent(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches no memory of ours.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Sets `O_NONBLOCK` on `fd`'s open file description.
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    let raw = fd.as_raw_fd();
    // SAFETY: `raw` is a live descriptor for the lifetime of `fd`; F_GETFL and
    // F_SETFL take no pointers.
    unsafe {
        let flags = cvt(libc::fcntl(raw, libc::F_GETFL))?;
        cvt(libc::fcntl(raw, libc::F_SETFL, flags | libc::O_NONBLOCK))?;
    }
    Ok(())
}

/// `poll(2)` over `fds`, retrying on `EINTR`. `None` waits forever.
/// Returns how many entries have events.
pub fn poll(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> io::Result<usize> {
    let ms = match timeout {
        None => -1,
        // Round up so a wait never ends just before a deadline and spins.
        Some(d) => i32::try_from(d.as_micros().div_ceil(1000)).unwrap_or(i32::MAX),
    };
    loop {
        // SAFETY: `fds` is a valid, exclusively borrowed slice of pollfd and
        // its length is passed along with it.
        let ret = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if ret >= 0 {
            return Ok(ret as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// A pollfd entry asking for `events` on `fd`.
pub fn pollfd(fd: RawFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// A non-blocking, close-on-exec eventfd: lets one thread wake another that
/// sleeps in `poll`.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// A fresh eventfd with counter 0.
    pub fn new() -> io::Result<Self> {
        // SAFETY: eventfd takes plain flags and returns a new descriptor or -1.
        let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
        // SAFETY: `fd` was just returned by eventfd, so we own it exclusively.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the eventfd readable (wakes a poller).
    pub fn notify(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our own descriptor. A
        // failure can only be EAGAIN (counter saturated), which still leaves
        // the eventfd readable, so the result is deliberately ignored.
        unsafe {
            libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8);
        }
    }

    /// Resets the counter so the eventfd is no longer readable.
    pub fn clear(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into a valid u64. EAGAIN (nothing
        // pending) is the only expected failure and means already clear.
        unsafe {
            libc::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8);
        }
    }

    /// The descriptor, for `poll`.
    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Blocks until some child of this process has terminated, without reaping
/// it (`WNOWAIT`). `Err` with `ECHILD` when there are no children at all.
pub fn wait_any_child_exit() -> io::Result<()> {
    // SAFETY: siginfo_t is plain data; zeroed is valid storage for the kernel
    // to fill in.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is valid, writable storage; P_ALL ignores the id.
    cvt(unsafe { libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOWAIT) }).map(drop)
}

/// The pid of a child that has terminated and waits to be reaped, left
/// unreaped (so its `/proc` entry can still be read); `None` when no child
/// is waiting (or there are no children).
pub fn exited_child() -> Option<i32> {
    loop {
        // SAFETY: siginfo_t is plain data; zeroed is valid storage for the
        // kernel to fill in (and reads as "no child" when it fills nothing).
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is valid, writable storage; P_ALL ignores the id.
        let r = unsafe {
            libc::waitid(
                libc::P_ALL,
                0,
                &mut info,
                libc::WEXITED | libc::WNOWAIT | libc::WNOHANG,
            )
        };
        if r == -1 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return None;
        }
        // SAFETY: waitid succeeded, so `info` holds a SIGCHLD siginfo (or
        // the zeroes it started with when no child was waiting), whose
        // si_pid field is the one read here.
        let pid = unsafe { info.si_pid() };
        return (pid > 0).then_some(pid);
    }
}

/// Reaps `pid` if it has terminated: its raw status and what it used (its
/// own and that of every descendant it waited for).
pub fn reap(pid: i32) -> Option<(libc::c_int, Rusage)> {
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: rusage is plain data; zeroed is valid storage.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `status` and `ru` are valid, writable storage.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
        if r == pid {
            return Some((status, Rusage::from(&ru)));
        }
        if r == -1 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return None;
    }
}

/// What reaped processes used: CPU time and the largest resident set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rusage {
    /// CPU time in user mode.
    pub user: Duration,
    /// CPU time in the kernel.
    pub system: Duration,
    /// The largest resident set of one process, in KiB (Linux's unit).
    pub max_rss_kib: u64,
}

impl Rusage {
    /// Adds `other`'s CPU time; keeps the larger resident set.
    pub fn add(&mut self, other: Rusage) {
        self.user += other.user;
        self.system += other.system;
        self.max_rss_kib = self.max_rss_kib.max(other.max_rss_kib);
    }
}

fn timeval(t: &libc::timeval) -> Duration {
    // Negative fields never come from the kernel; read them as zero.
    let secs = u64::try_from(t.tv_sec).unwrap_or(0);
    let micros = u64::try_from(t.tv_usec).unwrap_or(0);
    Duration::from_secs(secs) + Duration::from_micros(micros)
}

impl From<&libc::rusage> for Rusage {
    fn from(ru: &libc::rusage) -> Self {
        Rusage {
            user: timeval(&ru.ru_utime),
            system: timeval(&ru.ru_stime),
            max_rss_kib: u64::try_from(ru.ru_maxrss).unwrap_or(0),
        }
    }
}

/// The magic number of the file system `file` lives on (`statfs`'s
/// `f_type`): tells a cgroup file from one a command planted elsewhere.
pub fn fs_magic(file: &std::fs::File) -> io::Result<i64> {
    // SAFETY: statfs is plain data; zeroed is valid storage.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: the descriptor is open for the call's duration and `st` is
    // valid, writable storage.
    cvt(unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) })?;
    #[allow(clippy::unnecessary_cast)] // the field's type differs by target
    Ok(st.f_type as i64)
}

/// How a reaped process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// It called exit with this code.
    Code(i32),
    /// A signal with this number killed it.
    Signal(i32),
}

impl ExitStatus {
    /// Decodes a raw `waitpid` status (exited or killed; we never ask for
    /// stop reports).
    pub fn from_raw(status: libc::c_int) -> Self {
        if libc::WIFSIGNALED(status) {
            ExitStatus::Signal(libc::WTERMSIG(status))
        } else {
            ExitStatus::Code(libc::WEXITSTATUS(status))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_wait_statuses() {
        // Layout per wait(2): exit code in bits 8..16, signal in bits 0..7.
        assert_eq!(ExitStatus::from_raw(3 << 8), ExitStatus::Code(3));
        assert_eq!(ExitStatus::from_raw(0), ExitStatus::Code(0));
        assert_eq!(ExitStatus::from_raw(9), ExitStatus::Signal(9));
        assert_eq!(ExitStatus::from_raw(15 | 0x80), ExitStatus::Signal(15));
    }

    #[test]
    fn eventfd_wakes_poll_and_clears() {
        let e = EventFd::new().expect("eventfd");
        let mut fds = [pollfd(e.raw(), libc::POLLIN)];
        assert_eq!(poll(&mut fds, Some(Duration::ZERO)).expect("poll"), 0);
        e.notify();
        e.notify();
        assert_eq!(poll(&mut fds, Some(Duration::ZERO)).expect("poll"), 1);
        e.clear();
        let mut fds = [pollfd(e.raw(), libc::POLLIN)];
        assert_eq!(poll(&mut fds, Some(Duration::ZERO)).expect("poll"), 0);
    }
}

/// Gives the calling process a mount namespace of its own (a copy of the
/// current one). Must be called while the process has a single thread.
pub fn unshare_mount_ns() -> io::Result<()> {
    // SAFETY: unshare takes a flag word.
    cvt(unsafe { libc::unshare(libc::CLONE_NEWNS) }).map(drop)
}

/// mount(2) with C strings.
pub fn mount(
    source: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> io::Result<()> {
    let p = |s: Option<&CStr>| s.map_or(std::ptr::null(), CStr::as_ptr);
    // SAFETY: every pointer is a NUL-terminated string that outlives the
    // call, or null where mount(2) accepts null. Async-signal-safe.
    cvt(unsafe { libc::mount(p(source), target.as_ptr(), p(fstype), flags, p(data).cast()) })
        .map(drop)
}

/// chdir(2) with a C string; async-signal-safe.
pub fn chdir(path: &CStr) -> io::Result<()> {
    // SAFETY: path is NUL-terminated.
    cvt(unsafe { libc::chdir(path.as_ptr()) }).map(drop)
}

/// chroot(2) to the current directory; async-signal-safe.
pub fn chroot_here() -> io::Result<()> {
    // SAFETY: the argument is a NUL-terminated string.
    cvt(unsafe { libc::chroot(c".".as_ptr()) }).map(drop)
}

/// Moves the calling thread into the mount namespace `fd` refers to (its
/// root and working directory become that namespace's root). In a forked
/// child this is the whole process; async-signal-safe.
pub fn setns_mount(fd: RawFd) -> io::Result<()> {
    // SAFETY: setns takes an fd and a flag word.
    cvt(unsafe { libc::setns(fd, libc::CLONE_NEWNS) }).map(drop)
}

/// Version 3 of the capability ABI (64-bit sets).
const CAP_V3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// A thread's capability sets as 64-bit masks (bit N: capability N).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapSets {
    /// What it uses now.
    pub effective: u64,
    /// What it may use.
    pub permitted: u64,
    /// What an exec may pass on.
    pub inheritable: u64,
}

/// The calling thread's capability sets; async-signal-safe.
pub fn capget() -> io::Result<CapSets> {
    let mut header = CapHeader {
        version: CAP_V3,
        pid: 0,
    };
    let mut data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capget writes two CapData through a valid pointer for V3.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut header as *mut CapHeader,
            data.as_mut_ptr(),
        )
    };
    cvt(ret as libc::c_int)?;
    let join = |lo: u32, hi: u32| u64::from(lo) | (u64::from(hi) << 32);
    Ok(CapSets {
        effective: join(data[0].effective, data[1].effective),
        permitted: join(data[0].permitted, data[1].permitted),
        inheritable: join(data[0].inheritable, data[1].inheritable),
    })
}

/// Sets the calling thread's capability sets; async-signal-safe.
pub fn capset(sets: CapSets) -> io::Result<()> {
    let mut header = CapHeader {
        version: CAP_V3,
        pid: 0,
    };
    let word = |m: u64, i: u32| (m >> (32 * i)) as u32;
    let data = [0, 1].map(|i| CapData {
        effective: word(sets.effective, i),
        permitted: word(sets.permitted, i),
        inheritable: word(sets.inheritable, i),
    });
    // SAFETY: capset reads two CapData through a valid pointer for V3.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_capset,
            &mut header as *mut CapHeader,
            data.as_ptr(),
        )
    };
    cvt(ret as libc::c_int).map(drop)
}

/// Makes the calling thread (and, as it is called before any other
/// thread exists or in a forked child, its process) `uid`/`gid` with
/// the supplementary `groups`: real, effective and saved ids, and the
/// filesystem ids with them. Raw system calls, so only this thread
/// changes (the C library would broadcast to every thread) and the call
/// is async-signal-safe between fork and exec.
pub fn set_ids(uid: u32, gid: u32, groups: &[u32]) -> io::Result<()> {
    // SAFETY: setgroups reads `groups.len()` gids from a valid pointer;
    // setresgid/setresuid take integers.
    unsafe {
        cvt(libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) as libc::c_int)?;
        cvt(libc::syscall(libc::SYS_setresgid, gid, gid, gid) as libc::c_int)?;
        cvt(libc::syscall(libc::SYS_setresuid, uid, uid, uid) as libc::c_int)?;
    }
    Ok(())
}

/// Sets the real and saved uid and gid of the calling thread (and, as it
/// is called before any other thread exists or in a forked child, its
/// process) to `uid` and `gid`, leaving the effective ones; raw system
/// calls, async-signal-safe.
pub fn set_real_ids(uid: u32, gid: u32) -> io::Result<()> {
    const KEEP: u32 = u32::MAX;
    // SAFETY: setresgid/setresuid take integers (-1: unchanged).
    unsafe {
        cvt(libc::syscall(libc::SYS_setresgid, gid, KEEP, gid) as libc::c_int)?;
        cvt(libc::syscall(libc::SYS_setresuid, uid, KEEP, uid) as libc::c_int)?;
    }
    Ok(())
}

/// Sets the effective uid and gid of the calling thread (before any
/// other thread exists), leaving the real and saved ones; raw system
/// calls.
pub fn set_effective_ids(uid: u32, gid: u32) -> io::Result<()> {
    const KEEP: u32 = u32::MAX;
    // SAFETY: setresgid/setresuid take integers (-1: unchanged).
    unsafe {
        cvt(libc::syscall(libc::SYS_setresgid, KEEP, gid, KEEP) as libc::c_int)?;
        cvt(libc::syscall(libc::SYS_setresuid, KEEP, uid, KEEP) as libc::c_int)?;
    }
    Ok(())
}

/// Keeps (or stops keeping) the permitted capabilities when every uid
/// leaves 0 (`PR_SET_KEEPCAPS`); async-signal-safe.
pub fn keep_caps(keep: bool) -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    cvt(unsafe { libc::prctl(libc::PR_SET_KEEPCAPS, libc::c_ulong::from(keep), 0, 0, 0) }).map(drop)
}

/// Whether this kernel has ambient capabilities (gVisor's answers EINVAL).
pub fn ambient_supported() -> bool {
    // SAFETY: prctl with integer arguments; only asks.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_IS_SET as libc::c_ulong,
            0,
            0,
            0,
        ) >= 0
    }
}

/// Raises capability `cap` into the ambient set (kept across an exec
/// that is not root's); async-signal-safe.
pub fn raise_ambient(cap: u32) -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    cvt(unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_RAISE as libc::c_ulong,
            cap as libc::c_ulong,
            0,
            0,
        )
    })
    .map(drop)
}

/// Sets the calling thread's supplementary groups; async-signal-safe.
pub fn set_groups(groups: &[u32]) -> io::Result<()> {
    // SAFETY: setgroups reads `groups.len()` gids from a valid pointer.
    cvt(unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) } as libc::c_int)
        .map(drop)
}

/// Drops capability `cap` from the calling thread's bounding set (needs
/// CAP_SETPCAP); async-signal-safe.
pub fn drop_bounding(cap: u32) -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    cvt(unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) }).map(drop)
}

/// Empties the calling thread's ambient set; async-signal-safe. A kernel
/// without ambient capabilities (gVisor answers EINVAL) has none to
/// clear.
pub fn clear_ambient() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    let ret = cvt(unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    });
    match ret {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        other => other.map(drop),
    }
}

/// The calling process's real, effective and saved uids.
pub fn getresuid() -> (u32, u32, u32) {
    let (mut r, mut e, mut s) = (0, 0, 0);
    // SAFETY: getresuid writes three integers through valid pointers.
    unsafe { libc::getresuid(&mut r, &mut e, &mut s) };
    (r, e, s)
}

/// The calling process's supplementary groups.
pub fn getgroups() -> io::Result<Vec<u32>> {
    // SAFETY: with size 0 getgroups only counts.
    let n = cvt(unsafe { libc::getgroups(0, std::ptr::null_mut()) })?;
    let mut groups = vec![0 as libc::gid_t; n as usize];
    // SAFETY: the buffer holds `n` gids.
    let n = cvt(unsafe { libc::getgroups(n, groups.as_mut_ptr()) })?;
    groups.truncate(n as usize);
    Ok(groups)
}

/// The calling process's real group id.
pub fn getgid() -> u32 {
    // SAFETY: getgid has no preconditions and cannot fail.
    unsafe { libc::getgid() }
}

/// Drops the capabilities `caps` (numbers) from the calling, forked and
/// not yet exec'd child for good: when `bounding`, from its bounding set
/// (so exec as root does not give them back; CAP_SETPCAP, needed for that,
/// must come last in `caps`), from its effective, permitted and inheritable
/// sets, and clears the ambient set. Only raw system calls:
/// async-signal-safe.
pub fn drop_caps_in_child(caps: &[u32], bounding: bool) -> io::Result<()> {
    for &cap in caps.iter().filter(|_| bounding) {
        // SAFETY: prctl with integer arguments.
        cvt(unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) })?;
    }
    clear_ambient()?;
    let mask = caps
        .iter()
        .filter(|&&cap| cap < 64)
        .fold(0u64, |m, &cap| m | (1u64 << cap));
    let now = capget()?;
    capset(CapSets {
        effective: now.effective & !mask,
        permitted: now.permitted & !mask,
        inheritable: now.inheritable & !mask,
    })
}

/// Opens `path` (relative or absolute) as an `O_PATH` descriptor, resolved
/// as if `root` were the root directory: `..` and absolute symlinks cannot
/// leave it.
pub fn open_in_root(root: BorrowedFd<'_>, path: &CStr) -> io::Result<OwnedFd> {
    openat2(
        root,
        path,
        libc::O_PATH | libc::O_CLOEXEC,
        libc::RESOLVE_IN_ROOT,
    )
}

/// Opens the regular file `name` under the directory `dir` for reading,
/// resolved beneath it: no `..` out of it, no symlink, no other mount.
pub fn open_file_beneath(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<std::fs::File> {
    openat2(
        dir,
        name,
        libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NOCTTY,
        libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_XDEV,
    )
    .map(std::fs::File::from)
}

/// openat2(2): `path` from `dir`, with open `flags` and `resolve` flags.
fn openat2(
    dir: BorrowedFd<'_>,
    path: &CStr,
    flags: libc::c_int,
    resolve: u64,
) -> io::Result<OwnedFd> {
    let mut how: libc::open_how = {
        // SAFETY: open_how is plain data; all-zero is a valid value.
        unsafe { std::mem::zeroed() }
    };
    how.flags = flags as u64;
    how.resolve = resolve;
    // SAFETY: path is NUL-terminated; `how` is valid for its size.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    let fd = cvt(fd as libc::c_int)?;
    // SAFETY: openat2 returned a new descriptor we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Detaches the mount at `path` from this mount namespace (`MNT_DETACH`):
/// descriptors already open beneath it keep working. EINVAL when `path`
/// is no mount point.
pub fn umount_detach(path: &CStr) -> io::Result<()> {
    // SAFETY: path is NUL-terminated.
    cvt(unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) }).map(drop)
}

/// fork(2). In the child only async-signal-safe calls may follow (the
/// parent is multi-threaded), ending in `_exit`.
///
/// # Safety
/// The caller's child branch must only make async-signal-safe calls.
pub unsafe fn fork() -> io::Result<i32> {
    // SAFETY: forwarded to the caller's contract.
    cvt(unsafe { libc::fork() })
}

/// Ends a forked child at once, running no destructors or atexit hooks.
pub fn exit_child(code: i32) -> ! {
    // SAFETY: _exit is async-signal-safe and never returns.
    unsafe { libc::_exit(code) }
}

/// A pipe whose ends close on exec.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: both are new descriptors we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// write(2) of a whole small buffer; async-signal-safe.
pub fn write_all_raw(fd: RawFd, buf: &[u8]) {
    // SAFETY: buf is valid for its length. A short or failed write of a
    // status word to a pipe is reported by the reader as a short read.
    unsafe {
        libc::write(fd, buf.as_ptr().cast(), buf.len());
    }
}

/// read(2) into `buf`, retried on EINTR.
pub fn read_raw(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: buf is valid for writes of its length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Makes this (forked, builder) process dumpable again, so its parent can
/// open its `/proc/PID/ns/mnt` and `/proc/PID/root`; async-signal-safe.
pub fn set_dumpable() -> io::Result<()> {
    // SAFETY: PR_SET_DUMPABLE takes plain integer arguments.
    cvt(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) }).map(drop)
}

/// An extended attribute of `path` (not following a final symlink), or
/// `None` when it is absent or unreadable.
pub fn getxattr(path: &CStr, name: &CStr) -> Option<Vec<u8>> {
    let mut buf = [0u8; 64];
    // SAFETY: both names are NUL-terminated; buf is valid for its length.
    let n = unsafe {
        libc::lgetxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    usize::try_from(n)
        .ok()
        .map(|n| buf[..n.min(buf.len())].to_vec())
}

/// Sets extended attribute `name` of `path` (not following a final
/// symlink) to `value`.
pub fn setxattr(path: &CStr, name: &CStr, value: &[u8]) -> io::Result<()> {
    // SAFETY: both names are NUL-terminated; value is valid for its length.
    cvt(unsafe {
        libc::lsetxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })
    .map(drop)
}

/// Makes an overlay whiteout at `path`: a character device 0:0, which the
/// kernel lets a process make without CAP_MKNOD (and a device cgroup
/// allows).
pub fn mknod_whiteout(path: &CStr) -> io::Result<()> {
    // SAFETY: path is NUL-terminated; makedev(0, 0) is the whiteout device.
    cvt(unsafe { libc::mknod(path.as_ptr(), libc::S_IFCHR, libc::makedev(0, 0)) }).map(drop)
}

/// Creates an empty file (mode 0600) unless it exists; async-signal-safe.
pub fn touch(path: &CStr) -> io::Result<()> {
    // SAFETY: path is NUL-terminated; the descriptor is closed at once.
    let fd = cvt(unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            0o600,
        )
    })?;
    // SAFETY: fd was just opened by us.
    unsafe { libc::close(fd) };
    Ok(())
}

/// symlink(2); async-signal-safe.
pub fn symlink(target: &CStr, path: &CStr) -> io::Result<()> {
    // SAFETY: both are NUL-terminated.
    cvt(unsafe { libc::symlink(target.as_ptr(), path.as_ptr()) }).map(drop)
}

/// mkdir(2) with `mode` applied exactly (the umask cleared by a chmod);
/// async-signal-safe.
pub fn mkdir(path: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: path is NUL-terminated.
    cvt(unsafe { libc::mkdir(path.as_ptr(), mode) })?;
    // SAFETY: path is NUL-terminated.
    cvt(unsafe { libc::chmod(path.as_ptr(), mode) }).map(drop)
}

/// A kind of System V IPC object.
#[derive(Debug, Clone, Copy)]
pub enum Ipc {
    /// Shared memory segment.
    Shm,
    /// Semaphore set.
    Sem,
    /// Message queue.
    Msg,
}

/// Removes System V IPC object `id`.
pub fn ipc_remove(kind: Ipc, id: i32) -> io::Result<()> {
    // SAFETY: IPC_RMID takes no buffer (null is allowed for shm and msg;
    // semctl's fourth argument is unused).
    let ret = unsafe {
        match kind {
            Ipc::Shm => libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()),
            Ipc::Sem => libc::semctl(id, 0, libc::IPC_RMID),
            Ipc::Msg => libc::msgctl(id, libc::IPC_RMID, std::ptr::null_mut()),
        }
    };
    cvt(ret).map(drop)
}

/// Sets the access and modification times (seconds, nanoseconds) of
/// `path`, not following a final symlink and without opening it (a device
/// node such as `/dev/pts/ptmx` must not be opened).
pub fn set_times(path: &CStr, times: [(i64, i64); 2]) -> io::Result<()> {
    let ts = times.map(|(sec, nsec)| libc::timespec {
        tv_sec: sec as libc::time_t,
        tv_nsec: nsec as libc::c_long,
    });
    // SAFETY: path is NUL-terminated; `ts` holds the two timespecs
    // utimensat reads.
    cvt(unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            path.as_ptr(),
            ts.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

/// Every address of the network namespace's interfaces (IPv4 and IPv6,
/// loopback included), from `getifaddrs`.
pub fn local_addresses() -> io::Result<Vec<std::net::IpAddr>> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `list` is a valid out-pointer; on success getifaddrs fills it
    // with a list we free below with freeifaddrs, and nothing else.
    cvt(unsafe { libc::getifaddrs(&mut list) })?;
    let mut out = Vec::new();
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive
        // until freeifaddrs; each ifa_addr is null or points to a
        // sockaddr whose family says its real type and size.
        unsafe {
            let addr = (*cur).ifa_addr;
            if !addr.is_null() {
                match i32::from((*addr).sa_family) {
                    libc::AF_INET => {
                        let a = &*addr.cast::<libc::sockaddr_in>();
                        out.push(std::net::IpAddr::from(
                            u32::from_be(a.sin_addr.s_addr).to_be_bytes(),
                        ));
                    }
                    libc::AF_INET6 => {
                        let a = &*addr.cast::<libc::sockaddr_in6>();
                        out.push(std::net::IpAddr::from(a.sin6_addr.s6_addr));
                    }
                    _ => {}
                }
            }
            cur = (*cur).ifa_next;
        }
    }
    // SAFETY: `list` came from a successful getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(list) };
    Ok(out)
}

/// A new pseudo-terminal of `cols` x `rows`: (master, slave), both closing
/// on exec. The slave is opened through the master (`TIOCGPTPEER`), not by
/// a path under `/dev/pts` that a command could have replaced.
pub fn open_pty(cols: u16, rows: u16) -> io::Result<(OwnedFd, OwnedFd)> {
    // SAFETY: posix_openpt takes flags only; the result is a new descriptor
    // we own.
    let master =
        cvt(unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) })?;
    // SAFETY: `master` was just returned to us and nobody else owns it.
    let master = unsafe { OwnedFd::from_raw_fd(master) };
    // SAFETY: unlockpt takes a live descriptor and no pointers.
    cvt(unsafe { libc::unlockpt(master.as_raw_fd()) })?;
    set_window_size(master.as_raw_fd(), cols, rows)?;
    // SAFETY: TIOCGPTPEER takes open(2) flags by value and returns a new
    // descriptor we own.
    let peer = cvt(unsafe {
        libc::ioctl(
            master.as_raw_fd(),
            libc::TIOCGPTPEER,
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    });
    let slave = match peer {
        // SAFETY: as above, a new descriptor owned by nobody else.
        Ok(fd) => unsafe { OwnedFd::from_raw_fd(fd) },
        // gVisor has no TIOCGPTPEER: the slave by its number instead.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTTY | libc::EINVAL)) => {
            open_pty_slave_by_number(master.as_raw_fd())?
        }
        Err(e) => return Err(e),
    };
    Ok((master, slave))
}

/// The slave of `master` opened as `/dev/pts/N` (`TIOCGPTN`), where the
/// kernel cannot hand it over through the master. A command cannot put
/// another file there (devpts makes its own entries, and commands have no
/// mount rights); the descriptor is still checked to be a terminal, and a
/// symbolic link is not followed.
fn open_pty_slave_by_number(master: RawFd) -> io::Result<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut n: libc::c_uint = 0;
    // SAFETY: TIOCGPTN writes one unsigned int through the pointer, which
    // is valid for the call.
    cvt(unsafe { libc::ioctl(master, libc::TIOCGPTN, &mut n) })?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY | libc::O_NOFOLLOW)
        .open(format!("/dev/pts/{n}"))?;
    let slave = OwnedFd::from(file);
    // SAFETY: isatty takes a live descriptor and no pointers.
    if unsafe { libc::isatty(slave.as_raw_fd()) } != 1 {
        return Err(io::Error::other(format!("/dev/pts/{n} is not a terminal")));
    }
    Ok(slave)
}

/// Sets a terminal's size (`TIOCSWINSZ`); on a master the kernel sends the
/// terminal's foreground process group SIGWINCH.
pub fn set_window_size(fd: RawFd, cols: u16, rows: u16) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize through the pointer, which is
    // valid for the call.
    cvt(unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, &ws) })?;
    Ok(())
}

/// In a forked child before exec: leaves the agent's session for a new one
/// it leads and makes its stdin (a terminal's slave) the controlling
/// terminal. Only async-signal-safe calls.
pub fn take_terminal_in_child() -> io::Result<()> {
    // SAFETY: setsid and ioctl(TIOCSCTTY) take no pointers and are
    // async-signal-safe.
    unsafe {
        cvt(libc::setsid())?;
        cvt(libc::ioctl(0, libc::TIOCSCTTY, 0))?;
    }
    Ok(())
}
