//! What commands may not do to the agent: a seccomp filter every command is
//! spawned under (on top of the container's own profile).
//!
//! Commands usually run as the same user as PID 1, and several system calls
//! act on any process of one's own user, non-dumpable or not: a command
//! could lower PID 1's resource limits (`RLIMIT_CPU` makes the kernel kill
//! it, `RLIMIT_NOFILE` starves it), demote its scheduling (`SCHED_IDLE`
//! plus busy loops starve its dead-man switch), or trace a later command
//! (a grader) and rewrite its exit code. The filter refuses, with EPERM:
//! - `prlimit64`, `sched_setparam`, `sched_setattr` and
//!   `sched_setaffinity` on any process but the caller (pid 0), and
//!   `sched_setscheduler` there to any policy but `SCHED_OTHER` (the
//!   default, which ZeroMQ sets on its own threads by tid);
//! - `setpriority` and `ioprio_set` for anything but the caller (which
//!   "process", who 0), since "every process of my user" includes PID 1;
//! - `ptrace`, `process_vm_readv` and `process_vm_writev` outright;
//! - any signal to PID 1: `kill`, `tkill`, `rt_sigqueueinfo` and
//!   `pidfd_open` with pid 1, `tgkill` and `rt_tgsigqueueinfo` with thread
//!   group 1. Linux already drops a signal from inside the PID namespace
//!   that its init has no handler for, SIGKILL and SIGSTOP included, but
//!   gVisor delivers them (a command's `kill -KILL 1` ended the sandbox);
//!   refused here, a command gets the same answer under both. A `tkill`
//!   aimed at another of the agent's threads by its thread id is not
//!   covered (the filter cannot tell the caller's threads from the agent's).
//! - a namespace of its own: `unshare` and `clone` with any `CLONE_NEW*`
//!   flag, and `setns` outright (its type 0 joins a namespace of any type).
//!   Inside a new user namespace a process holds every capability, and
//!   gVisor does not hold such a process to `RLIMIT_NPROC`, the process
//!   limit under that tier: a command forked past `limits.pids` there,
//!   each process costing gVisor host tasks. Docker's own profile refuses
//!   the same under runc; runsc does not apply it. `clone3` answers ENOSYS
//!   (its flags are behind a pointer a filter cannot read; C libraries
//!   and runtimes then fall back to `clone`).
//!
//! The filter is built for the x86_64 system-call ABI: a call through the
//! i386 ABI (`int 0x80`) kills the calling process (so 32-bit programs do
//! not run in sandboxes), and x32 calls (the number's bit 30 set, same
//! architecture tag) are refused by a second, hand-written filter, on
//! kernels that enable that ABI at all.
//!
//! Installing a filter needs no privilege only under no-new-privileges, so
//! the filter applies when PID 1 runs with it (the default, and always for
//! API clients); a sandbox whose profile turns it off runs commands
//! unfiltered.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// `which` of setpriority(2) for a single process.
const PRIO_PROCESS: u64 = 0;
/// `which` of ioprio_set(2) for a single process.
const IOPRIO_WHO_PROCESS: u64 = 1;

/// The agent's pid in its sandbox.
const AGENT_PID: u64 = 1;

static FILTER: OnceLock<Option<Vec<BpfProgram>>> = OnceLock::new();

/// `__X32_SYSCALL_BIT`.
const X32_BIT: u32 = 0x4000_0000;
/// `AUDIT_ARCH_X86_64`.
const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;

/// Builds the filter once (at start, before any command), or none when this
/// process lacks no-new-privileges. `pristine`: the agent holds the extra
/// capabilities of in-place reset, so commands also get
/// [`pristine_filter`]. Returns why it could not be built.
pub fn init(pristine: bool) -> Result<bool, String> {
    let mut err = None;
    let built = FILTER.get_or_init(|| {
        if !no_new_privs() {
            return None;
        }
        let programs = build().and_then(|p| {
            let mut all = vec![p, x32_guard(), clone3_enosys()?];
            if pristine {
                all.push(pristine_filter()?);
            }
            Ok(all)
        });
        match programs {
            Ok(p) => Some(p),
            Err(e) => {
                err = Some(e);
                None
            }
        }
    });
    match err {
        Some(e) => Err(e),
        None => Ok(built.is_some()),
    }
}

/// The filters for commands, if they apply. Safe to call between fork and
/// exec: it only reads an initialised `OnceLock`.
pub fn filters() -> Option<&'static [BpfProgram]> {
    FILTER.get().and_then(Option::as_deref)
}

/// Namespace flags of clone(2) and unshare(2). `CLONE_NEWTIME` is
/// unshare's alone (clone's low byte is the exit signal, and no signal
/// number has that bit), so refusing it to clone refuses nothing else.
const NAMESPACE_FLAGS: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP) as u64
    | 0x80; // CLONE_NEWTIME

/// What a sandbox started for in-place reset adds for commands. Docker's
/// default seccomp profile opens a set of system calls to a container
/// that has CAP_SYS_ADMIN or CAP_SYS_CHROOT; commands drop both
/// capabilities, but some of those calls need none in a namespace of
/// one's own (which every sandbox's filter refuses already: [`build`]).
/// So commands get them refused (EPERM) exactly as in a sandbox without
/// the capabilities: `mount`, `umount2`, `pivot_root`, `chroot`, the new
/// mount API (`open_tree`, `move_mount`, `fsopen`, `fsconfig`,
/// `fsmount`, `fspick`, `mount_setattr`), `bpf`, `perf_event_open`,
/// `fanotify_init`, `lookup_dcookie`, `name_to_handle_at`, `quotactl`,
/// `quotactl_fd`, `sethostname`, `setdomainname`, `syslog`, `vhangup`.
fn pristine_filter() -> Result<BpfProgram, String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for nr in [
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_chroot,
        libc::SYS_open_tree,
        libc::SYS_move_mount,
        libc::SYS_fsopen,
        libc::SYS_fsconfig,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_mount_setattr,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_fanotify_init,
        libc::SYS_lookup_dcookie,
        libc::SYS_name_to_handle_at,
        libc::SYS_quotactl,
        libc::SYS_quotactl_fd,
        libc::SYS_sethostname,
        libc::SYS_setdomainname,
        libc::SYS_syslog,
        libc::SYS_vhangup,
    ] {
        rules.insert(nr, Vec::new());
    }
    compile(SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        TargetArch::x86_64,
    ))
}

/// `clone3` answers ENOSYS: its flags are behind a pointer a filter
/// cannot read, and on ENOSYS glibc, musl and language runtimes fall
/// back to `clone`, whose flags [`build`] checks.
fn clone3_enosys() -> Result<BpfProgram, String> {
    compile(SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        TargetArch::x86_64,
    ))
}

/// One rule per namespace flag (a rule matches when all its conditions
/// hold, and a call when any rule does): "some `CLONE_NEW*` flag is set
/// in argument 0". Both calls take the flags as their first argument,
/// and every namespace flag is in its low 32 bits.
fn namespace_flag_rules() -> Result<Vec<SeccompRule>, String> {
    (0..32)
        .map(|bit| 1u64 << bit)
        .filter(|flag| NAMESPACE_FLAGS & flag != 0)
        .map(|flag| rule(vec![cond(0, SeccompCmpOp::MaskedEq(flag), flag)?]))
        .collect()
}

fn compile(filter: Result<SeccompFilter, seccompiler::BackendError>) -> Result<BpfProgram, String> {
    filter
        .and_then(TryInto::try_into)
        .map_err(|e| e.to_string())
}

/// Refuses every x32-ABI call: load the architecture, and for x86_64 the
/// number; EPERM when bit 30 is set, else allow.
fn x32_guard() -> BpfProgram {
    let stmt = |code: u32, k: u32| seccompiler::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code: u32, k: u32, jt: u8, jf: u8| seccompiler::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    // Offsets into struct seccomp_data: nr at 0, arch at 4.
    vec![
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 4),
        jump(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            AUDIT_ARCH_X86_64,
            0,
            3,
        ),
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0),
        jump(libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K, X32_BIT, 0, 1),
        stmt(
            libc::BPF_RET | libc::BPF_K,
            libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        ),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
    ]
}

/// Asked of the kernel, not read from `/proc/self/status`: gVisor's status
/// file has no `NoNewPrivs` line although the flag is set, and reading it
/// there left commands under gVisor without the filter.
fn no_new_privs() -> bool {
    // SAFETY: PR_GET_NO_NEW_PRIVS takes no pointer and only reads the
    // calling thread's flag.
    unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1 }
}

fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, String> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value).map_err(|e| e.to_string())
}

fn rule(conditions: Vec<SeccompCondition>) -> Result<SeccompRule, String> {
    SeccompRule::new(conditions).map_err(|e| e.to_string())
}

fn build() -> Result<BpfProgram, String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    // Refused when the first argument (a pid) is not 0, i.e. not the caller.
    // sched_setscheduler to SCHED_OTHER (priority 0, the default policy,
    // which demotes nothing) is allowed on any thread: ZeroMQ (and so every
    // Jupyter kernel) sets it on its own threads by their tid and aborts
    // when refused.
    rules.insert(
        libc::SYS_sched_setscheduler,
        vec![rule(vec![
            cond(0, SeccompCmpOp::Ne, 0)?,
            cond(1, SeccompCmpOp::Ne, libc::SCHED_OTHER as u64)?,
        ])?],
    );
    for nr in [
        libc::SYS_prlimit64,
        libc::SYS_sched_setparam,
        libc::SYS_sched_setattr,
        libc::SYS_sched_setaffinity,
    ] {
        rules.insert(nr, vec![rule(vec![cond(0, SeccompCmpOp::Ne, 0)?])?]);
    }
    rules.insert(
        libc::SYS_setpriority,
        vec![
            rule(vec![cond(0, SeccompCmpOp::Ne, PRIO_PROCESS)?])?,
            rule(vec![cond(1, SeccompCmpOp::Ne, 0)?])?,
        ],
    );
    rules.insert(
        libc::SYS_ioprio_set,
        vec![
            rule(vec![cond(0, SeccompCmpOp::Ne, IOPRIO_WHO_PROCESS)?])?,
            rule(vec![cond(1, SeccompCmpOp::Ne, 0)?])?,
        ],
    );
    // Signals to PID 1 (the agent), by pid or by thread group.
    for nr in [
        libc::SYS_kill,
        libc::SYS_tkill,
        libc::SYS_tgkill,
        libc::SYS_rt_sigqueueinfo,
        libc::SYS_rt_tgsigqueueinfo,
        libc::SYS_pidfd_open,
    ] {
        rules.insert(nr, vec![rule(vec![cond(0, SeccompCmpOp::Eq, AGENT_PID)?])?]);
    }
    // A namespace of its own: inside a user namespace the caller holds
    // every capability (and gVisor then stops counting its processes).
    rules.insert(libc::SYS_unshare, namespace_flag_rules()?);
    rules.insert(libc::SYS_clone, namespace_flag_rules()?);
    // Refused outright.
    for nr in [
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        // Joins a namespace; type 0 admits any type.
        libc::SYS_setns,
    ] {
        rules.insert(nr, Vec::new());
    }
    compile(SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        TargetArch::x86_64,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filters_build() {
        let p = build().expect("filter");
        assert!(!p.is_empty());
        assert!(!pristine_filter().expect("pristine filter").is_empty());
        assert!(!clone3_enosys().expect("clone3 filter").is_empty());
        assert_eq!(x32_guard().len(), 6);
    }

    /// What a command under every sandbox's filters gets from each call,
    /// in a child of this test (the filters cannot be removed once set):
    /// (unshare(CLONE_NEWUSER), unshare(CLONE_FILES), setns, clone with
    /// CLONE_NEWUSER, clone3, a plain fork), each 0 or the errno.
    fn under_the_filters() -> [i32; 6] {
        let programs = [
            build().expect("filter"),
            x32_guard(),
            clone3_enosys().expect("clone3"),
        ];
        let mut pipe = [0; 2];
        // SAFETY: a pipe of two fresh descriptors into a local array.
        assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
        // SAFETY: the child makes only raw system calls and `_exit`s; it
        // allocates nothing and takes no lock another thread may hold.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: the calls below take integers or pointers into this
            // frame; a refused one returns -1 and sets errno.
            unsafe {
                let errno = |r: libc::c_long| {
                    if r < 0 {
                        *libc::__errno_location()
                    } else {
                        0
                    }
                };
                let mut out = [-1i32; 6];
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
                    && programs
                        .iter()
                        .all(|p| seccompiler::apply_filter(p).is_ok())
                {
                    out[0] = errno(libc::unshare(libc::CLONE_NEWUSER).into());
                    out[1] = errno(libc::unshare(libc::CLONE_FILES).into());
                    out[2] = errno(libc::syscall(libc::SYS_setns, -1, 0));
                    let clone = |flags: libc::c_int| {
                        let r = libc::syscall(libc::SYS_clone, flags | libc::SIGCHLD, 0, 0, 0, 0);
                        if r == 0 {
                            libc::_exit(0);
                        }
                        if r > 0 {
                            libc::waitpid(r as libc::pid_t, std::ptr::null_mut(), 0);
                        }
                        errno(r)
                    };
                    out[3] = clone(libc::CLONE_NEWUSER);
                    // clone_args of size 64 (version 0): flags and exit
                    // signal only; the filter answers before reading it.
                    let args = [0u64, 0, 0, 0, libc::SIGCHLD as u64, 0, 0, 0];
                    let r = libc::syscall(libc::SYS_clone3, args.as_ptr(), 64usize);
                    if r == 0 {
                        libc::_exit(0);
                    }
                    out[4] = errno(r);
                    out[5] = clone(0);
                }
                libc::write(pipe[1], out.as_ptr().cast(), std::mem::size_of_val(&out));
                libc::_exit(0);
            }
        }
        assert!(pid > 0, "fork");
        // SAFETY: reading into a local array of its size from our pipe;
        // waiting for our own child.
        unsafe {
            libc::close(pipe[1]);
            let mut out = [0i32; 6];
            let n = libc::read(
                pipe[0],
                out.as_mut_ptr().cast(),
                std::mem::size_of_val(&out),
            );
            libc::close(pipe[0]);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
            assert_eq!(
                n as usize,
                std::mem::size_of_val(&out),
                "the child answered"
            );
            out
        }
    }

    #[test]
    fn commands_make_no_namespace_and_still_fork() {
        let [user, files, setns, clone_user, clone3, fork] = under_the_filters();
        assert_eq!(user, libc::EPERM, "unshare(CLONE_NEWUSER)");
        assert_eq!(files, 0, "unshare(CLONE_FILES) makes no namespace");
        assert_eq!(setns, libc::EPERM, "setns");
        assert_eq!(clone_user, libc::EPERM, "clone(CLONE_NEWUSER)");
        assert_eq!(
            clone3,
            libc::ENOSYS,
            "clone3, so that libc falls back to clone"
        );
        assert_eq!(fork, 0, "a plain clone (fork)");
    }
}
