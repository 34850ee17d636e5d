//! What commands may not do to the agent: a seccomp filter every command is
//! spawned under (on top of the container's own profile).
//!
//! Commands usually run as the same user as PID 1, and several system calls
//! act on any process of one's own user, non-dumpable or not: a command
//! could lower PID 1's resource limits (`RLIMIT_CPU` makes the kernel kill
//! it, `RLIMIT_NOFILE` starves it), demote its scheduling (`SCHED_IDLE`
//! plus busy loops starve its dead-man switch), or trace a later command
//! (a grader) and rewrite its exit code. The filter refuses, with EPERM:
//! - `prlimit64`, `sched_setscheduler`, `sched_setparam`, `sched_setattr`
//!   and `sched_setaffinity` on any process but the caller (pid 0);
//! - `setpriority` and `ioprio_set` for anything but the caller (which
//!   "process", who 0), since "every process of my user" includes PID 1;
//! - `ptrace`, `process_vm_readv` and `process_vm_writev` outright.
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

static FILTER: OnceLock<Option<[BpfProgram; 2]>> = OnceLock::new();

/// `__X32_SYSCALL_BIT`.
const X32_BIT: u32 = 0x4000_0000;
/// `AUDIT_ARCH_X86_64`.
const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;

/// Builds the filter once (at start, before any command), or none when this
/// process lacks no-new-privileges. Returns why it could not be built.
pub fn init() -> Result<bool, String> {
    let mut err = None;
    let built = FILTER.get_or_init(|| {
        if !no_new_privs() {
            return None;
        }
        match build() {
            Ok(p) => Some([p, x32_guard()]),
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
pub fn filters() -> Option<&'static [BpfProgram; 2]> {
    FILTER.get().and_then(Option::as_ref)
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

fn no_new_privs() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .any(|l| l.starts_with("NoNewPrivs:") && l.trim_end().ends_with('1'))
    })
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
    for nr in [
        libc::SYS_prlimit64,
        libc::SYS_sched_setscheduler,
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
        assert_eq!(x32_guard().len(), 6);
    }
}
