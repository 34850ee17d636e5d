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
//! - `kill`, `tkill`, `tgkill`, `rt_sigqueueinfo`, `rt_tgsigqueueinfo`
//!   and `pidfd_open` aimed at pid 1, the agent (gVisor, unlike Linux,
//!   lets a namespace's own processes SIGKILL its init).
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

static FILTER: OnceLock<Option<Vec<BpfProgram>>> = OnceLock::new();

/// `__X32_SYSCALL_BIT`.
const X32_BIT: u32 = 0x4000_0000;
/// `AUDIT_ARCH_X86_64`.
const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;

/// Builds the filter once (at start, before any command), or none when this
/// process lacks no-new-privileges. `pristine`: the agent holds the extra
/// capabilities of in-place reset, so commands also get [`pristine`]'s
/// filters. Returns why it could not be built.
pub fn init(pristine: bool) -> Result<bool, String> {
    let mut err = None;
    let built = FILTER.get_or_init(|| {
        if !no_new_privs() {
            return None;
        }
        let programs = build().and_then(|p| {
            let mut all = vec![p, x32_guard()];
            if pristine {
                all.extend(pristine_filters()?);
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

/// Namespace flags of clone(2) and unshare(2).
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
/// capabilities, but some of those calls need none (creating a user
/// namespace, where one holds every capability, does not). So commands
/// get them refused exactly as in a sandbox without the capabilities:
/// - EPERM: `unshare`, `setns`, `mount`, `umount2`, `pivot_root`,
///   `chroot`, the new mount API (`open_tree`, `move_mount`, `fsopen`,
///   `fsconfig`, `fsmount`, `fspick`, `mount_setattr`), `bpf`,
///   `perf_event_open`, `fanotify_init`, `lookup_dcookie`,
///   `name_to_handle_at`, `quotactl`, `quotactl_fd`, `sethostname`,
///   `setdomainname`, `syslog`, `vhangup`, and `clone` with any
///   namespace flag;
/// - ENOSYS: `clone3` (its flags are behind a pointer a filter cannot
///   read; C libraries then fall back to `clone`).
fn pristine_filters() -> Result<Vec<BpfProgram>, String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for nr in [
        libc::SYS_unshare,
        libc::SYS_setns,
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
    // A rule matches when all its conditions hold, and a call when any
    // rule does: "some namespace flag is set" is one rule per flag.
    let mut clone_rules = Vec::new();
    for bit in 0..64 {
        let flag = 1u64 << bit;
        if NAMESPACE_FLAGS & flag != 0 {
            clone_rules.push(rule(vec![SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(flag),
                flag,
            )
            .map_err(|e| e.to_string())?])?);
        }
    }
    rules.insert(libc::SYS_clone, clone_rules);
    let eperm = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        TargetArch::x86_64,
    )
    .map_err(|e| e.to_string())?;
    let enosys = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        TargetArch::x86_64,
    )
    .map_err(|e| e.to_string())?;
    let compile = |f: SeccompFilter| -> Result<BpfProgram, String> {
        f.try_into()
            .map_err(|e: seccompiler::BackendError| e.to_string())
    };
    Ok(vec![compile(eperm)?, compile(enosys)?])
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
    // Signals aimed at PID 1, the agent. Under runc the kernel shields a
    // PID namespace's init from its own namespace's signals it has no
    // handler for; gVisor delivers SIGKILL to it regardless, which ended
    // the agent and the sandbox. Refusing the calls works under both:
    // `kill`, `tkill`, `rt_sigqueueinfo` and `pidfd_open` name the target
    // in the first argument, `tgkill` and `rt_tgsigqueueinfo` the thread
    // group in the first too.
    for nr in [
        libc::SYS_kill,
        libc::SYS_tkill,
        libc::SYS_tgkill,
        libc::SYS_rt_sigqueueinfo,
        libc::SYS_rt_tgsigqueueinfo,
        libc::SYS_pidfd_open,
    ] {
        rules.insert(nr, vec![rule(vec![cond(0, SeccompCmpOp::Eq, 1)?])?]);
    }
    // Refused outright.
    for nr in [
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
    ] {
        rules.insert(nr, Vec::new());
    }
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        TargetArch::x86_64,
    )
    .map_err(|e| e.to_string())?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filters_build() {
        let p = build().expect("filter");
        assert!(!p.is_empty());
        assert_eq!(pristine_filters().expect("pristine filters").len(), 2);
        assert_eq!(x32_guard().len(), 6);
    }
}
