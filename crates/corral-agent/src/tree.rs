//! Killing a command's whole process tree.
//!
//! Killing the command's process group is not enough: a command may start
//! children in groups or sessions of their own (`setsid`, job control shells,
//! daemons). So the tree is found by following parent links in `/proc`, and
//! must be collected *before* anything is killed, because a killed parent's
//! children are re-parented to PID 1 at once and the links are lost.

use std::collections::{HashMap, HashSet};

use crate::sys;

/// One line of `/proc/<pid>/stat`, the fields we need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Process id.
    pub pid: i32,
    /// State letter (`R`, `S`, `Z`, ...).
    pub state: u8,
    /// Parent pid; 0 for processes whose parent is outside our pid namespace
    /// (such as `docker exec` sessions).
    pub ppid: i32,
    /// Process group id.
    pub pgrp: i32,
    /// Session id.
    pub session: i32,
    /// The kernel's per-task flags (`PF_*`); 0 when the line ends early.
    pub flags: u32,
}

/// `PF_EXITING`: the task is in `exit()`, past closing its files but
/// perhaps not yet a zombie.
const PF_EXITING: u32 = 0x4;

impl ProcStat {
    /// True once the process is on its way out: exiting, a zombie, or dead.
    pub fn dying(&self) -> bool {
        matches!(self.state, b'Z' | b'X' | b'x') || self.flags & PF_EXITING != 0
    }
}

/// Parses the content of `/proc/<pid>/stat`. `None` on anything unexpected.
pub fn parse_stat(line: &str) -> Option<ProcStat> {
    // The command name is in parentheses and may itself contain spaces and
    // parentheses, so split at the *last* ')'.
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    let pid = line.get(..open)?.trim().parse().ok()?;
    let mut rest = line.get(close + 1..)?.split_ascii_whitespace();
    let state = *rest.next()?.as_bytes().first()?;
    let ppid = rest.next()?.parse().ok()?;
    let pgrp = rest.next()?.parse().ok()?;
    let session = rest.next()?.parse().ok()?;
    // tty_nr and tpgid, then flags.
    let flags = rest.nth(2).and_then(|f| f.parse().ok()).unwrap_or(0);
    Some(ProcStat {
        pid,
        state,
        ppid,
        pgrp,
        session,
        flags,
    })
}

/// Every process visible in `/proc` right now. Processes vanishing while we
/// read are simply skipped.
pub fn scan() -> Vec<ProcStat> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|entry| {
        let entry = entry.ok()?;
        let name = entry.file_name();
        let name = name.to_str()?;
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        // Bytes, not a string: a process may give itself a name that is not
        // UTF-8, and must not become invisible (and unkillable) by it.
        let bytes = std::fs::read(entry.path().join("stat")).ok()?;
        parse_stat(&String::from_utf8_lossy(&bytes))
    })
    .collect()
}

/// `root` and all its descendants present in `procs`.
pub fn descendants(procs: &[ProcStat], root: i32) -> Vec<ProcStat> {
    let mut children: HashMap<i32, Vec<&ProcStat>> = HashMap::new();
    for p in procs {
        children.entry(p.ppid).or_default().push(p);
    }
    let mut out: Vec<ProcStat> = procs.iter().filter(|p| p.pid == root).copied().collect();
    let mut seen: HashSet<i32> = HashSet::from([root]);
    let mut queue = vec![root];
    while let Some(pid) = queue.pop() {
        for c in children.get(&pid).map(Vec::as_slice).unwrap_or_default() {
            if seen.insert(c.pid) {
                out.push(**c);
                queue.push(c.pid);
            }
        }
    }
    out
}

/// What to kill for the tree rooted at `root` (whose process group is
/// `root`, as every command gets a group of its own).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Targets {
    /// Process groups to signal as a whole.
    pub groups: Vec<i32>,
    /// Individual pids (the tree, and members of sessions it started).
    pub pids: Vec<i32>,
}

/// Works out the kill targets for `root` from a `/proc` snapshot, never
/// including the agent itself, its group or its session: signalling those
/// would take down PID 1 or every command at once.
pub fn targets(procs: &[ProcStat], root: i32, me: i32, my_pgrp: i32, my_sid: i32) -> Targets {
    let tree = descendants(procs, root);
    let ours = |id: i32| id <= 1 || id == me || id == my_pgrp || id == my_sid;
    let mut groups: Vec<i32> = std::iter::once(root)
        .chain(tree.iter().map(|p| p.pgrp))
        .filter(|&g| !ours(g))
        .collect();
    groups.sort_unstable();
    groups.dedup();
    let sessions: HashSet<i32> = tree
        .iter()
        .map(|p| p.session)
        .filter(|&s| !ours(s))
        .collect();
    let mut pids: Vec<i32> = tree
        .iter()
        .map(|p| p.pid)
        .chain(
            procs
                .iter()
                .filter(|p| sessions.contains(&p.session))
                .map(|p| p.pid),
        )
        .filter(|&p| p > 1 && p != me)
        .collect();
    pids.sort_unstable();
    pids.dedup();
    Targets { groups, pids }
}

/// SIGKILLs the process tree of the command whose main process is `root`.
pub fn kill_tree(root: i32) {
    let me = sys::getpid();
    let my_pgrp = sys::getpgrp();
    let my_sid = sys::getsid().unwrap_or(me);
    // Two rounds: a process may fork while the first round is being
    // delivered; its child shows up (still linked) in the second scan.
    for _ in 0..2 {
        let t = targets(&scan(), root, me, my_pgrp, my_sid);
        for g in &t.groups {
            // ESRCH (group already empty) is the expected failure.
            let _ = sys::kill(-g, libc::SIGKILL);
        }
        for p in &t.pids {
            let _ = sys::kill(*p, libc::SIGKILL);
        }
    }
}

/// Processes other than the agent with an open descriptor on one of the
/// pipes `inodes` (a pipe's two ends share one inode; `/proc/PID/fd/N`
/// reads `pipe:[INODE]`). Best effort: a process the agent may not inspect
/// (another user's, or one that made itself non-dumpable, while the agent
/// lacks CAP_SYS_PTRACE) is not found.
pub fn pipe_holders(inodes: &[u64]) -> Vec<i32> {
    let me = sys::getpid();
    let wanted: Vec<String> = inodes.iter().map(|i| format!("pipe:[{i}]")).collect();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|entry| {
        let entry = entry.ok()?;
        let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
        if pid <= 1 || pid == me {
            return None;
        }
        let fds = std::fs::read_dir(entry.path().join("fd")).ok()?;
        fds.filter_map(Result::ok)
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .any(|target| wanted.iter().any(|w| target.as_os_str() == w.as_str()))
            .then_some(pid)
    })
    .collect()
}

/// Kills every process in the sandbox but the agent and waits (up to
/// `within`) until none is left but zombies (which hold nothing, and the
/// reaper takes): what an exclusive command and a reset start from. Killing repeats, so a process forked while the first round
/// went out dies too. Returns false when something survived.
pub fn kill_all_others(within: std::time::Duration) -> bool {
    let me = sys::getpid();
    let until = std::time::Instant::now() + within;
    // Short waits first: killed processes are usually gone (and reaped)
    // within a millisecond or two.
    let mut pause = std::time::Duration::from_micros(200);
    loop {
        // From PID 1, kill(-1) reaches every other process in the namespace.
        let _ = sys::kill(-1, libc::SIGKILL);
        // A zombie holds nothing but its pid, and the reaper takes it.
        if !scan()
            .iter()
            .any(|p| p.pid != me && p.state != b'Z' && p.state != b'X')
        {
            return true;
        }
        if std::time::Instant::now() >= until {
            return false;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(std::time::Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: i32, ppid: i32, pgrp: i32, session: i32) -> ProcStat {
        ProcStat {
            pid,
            state: b'S',
            ppid,
            pgrp,
            session,
            flags: 0,
        }
    }

    #[test]
    fn parses_stat_with_awkward_names() {
        let s = parse_stat("42 (a) b (c)) S 1 42 1 0 -1 4194560 1101").expect("parses");
        assert_eq!(
            s,
            ProcStat {
                flags: 4194560,
                ..p(42, 1, 42, 1)
            }
        );
        assert!(!s.dying());
        let exiting = parse_stat("43 (x) R 1 42 1 0 -1 4194564 0").expect("parses");
        assert!(exiting.dying(), "PF_EXITING: {exiting:?}");
        let z = parse_stat("7 (sleep) Z 3 3 1 0").expect("parses");
        assert_eq!(z.state, b'Z');
        assert_eq!(parse_stat(""), None);
        assert_eq!(parse_stat("12 (x"), None);
        assert_eq!(parse_stat("12 (x) S"), None);
        assert_eq!(parse_stat("nope (x) S 1 2 3"), None);
    }

    #[test]
    fn targets_cover_groups_and_sessions_but_never_the_agent() {
        // Agent is pid 1, group 1, session 1. Command 10 (group 10) has a
        // child 11 in its group, and 11 started 12 with setsid (session 12),
        // which has its own child 13. 20 is an unrelated command; 30 a
        // `docker exec` session.
        let procs = vec![
            p(1, 0, 1, 1),
            p(10, 1, 10, 1),
            p(11, 10, 10, 1),
            p(12, 11, 12, 12),
            p(13, 12, 12, 12),
            p(20, 1, 20, 1),
            p(30, 0, 30, 30),
        ];
        let t = targets(&procs, 10, 1, 1, 1);
        assert_eq!(t.groups, vec![10, 12]);
        assert_eq!(t.pids, vec![10, 11, 12, 13]);
    }

    #[test]
    fn targets_of_a_vanished_root_still_name_its_group() {
        let t = targets(&[p(1, 0, 1, 1)], 10, 1, 1, 1);
        assert_eq!(t.groups, vec![10]);
        assert!(t.pids.is_empty());
    }

    #[test]
    fn handles_parent_cycles_without_looping() {
        // Impossible in a real snapshot, but /proc is read non-atomically.
        let procs = vec![p(5, 6, 5, 1), p(6, 5, 5, 1)];
        assert_eq!(descendants(&procs, 5).len(), 2);
    }
}
