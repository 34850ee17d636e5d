//! What the sandbox uses, read from inside: its own cgroup (v2, or the
//! controllers of v1) and its network namespace's interface counters. This
//! is how corral learns a sandbox's usage where the engine keeps no
//! accounting it can ask for (Kubernetes), and the same numbers Docker's
//! stats give, from the same kernel files.
//!
//! Every file is checked to live on the file system it must (cgroupfs,
//! cgroup2fs, procfs) before a byte of it is believed: on cgroup v1
//! `/sys/fs/cgroup` itself is a tmpfs a root command may write, so a file
//! planted there could otherwise pass for a counter. What cannot be read,
//! or is not on its file system, is left out of the report, never guessed.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use corral_core::protocol::SandboxUsage;

use crate::sys;

const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// `CGROUP_SUPER_MAGIC`: a cgroup v1 hierarchy.
const CGROUP1_MAGIC: i64 = 0x0027_e0eb;
/// `CGROUP2_SUPER_MAGIC`: the cgroup v2 hierarchy.
const CGROUP2_MAGIC: i64 = 0x6367_7270;
/// `PROC_SUPER_MAGIC`.
const PROC_MAGIC: i64 = 0x9fa0;
/// Values at or above this are "no limit" (v1 writes the largest page
/// multiple below 2^63).
const UNLIMITED: u64 = 1 << 60;
/// Largest file read; cgroup and proc counters are a few KiB at most.
const MAX_FILE: u64 = 1 << 20;

/// Reads everything this sandbox exposes about its usage now.
pub fn read() -> SandboxUsage {
    let mut u = match Cgroup::detect() {
        Cgroup::V2(dir) => v2(&dir),
        Cgroup::V1(dirs) => v1(&dirs),
        Cgroup::None => SandboxUsage {
            cgroup: "none".into(),
            ..SandboxUsage::default()
        },
    };
    if let Some(text) = read_on("/proc/net/dev", &[PROC_MAGIC]) {
        let (rx, tx) = parse_net_dev(&text);
        u.net_rx_bytes = Some(rx);
        u.net_tx_bytes = Some(tx);
    }
    u
}

/// Which cgroup interface the sandbox has, and where its own cgroup is.
#[derive(Debug)]
enum Cgroup {
    /// The unified hierarchy; the sandbox's cgroup directory.
    V2(PathBuf),
    /// Controllers by name (`memory`, `cpuacct`, ...), each the sandbox's
    /// directory in that hierarchy.
    V1(Vec<(String, PathBuf)>),
    None,
}

impl Cgroup {
    fn detect() -> Cgroup {
        let own = read_on("/proc/self/cgroup", &[PROC_MAGIC]).unwrap_or_default();
        if magic_of(Path::new(CGROUP_ROOT)) == Some(CGROUP2_MAGIC) {
            let path = own
                .lines()
                .find_map(|l| l.strip_prefix("0::"))
                .unwrap_or("/");
            return Cgroup::V2(own_dir(Path::new(CGROUP_ROOT), path));
        }
        let mut dirs = Vec::new();
        for line in own.lines() {
            // `ID:controller[,controller]:path`
            let mut parts = line.splitn(3, ':');
            let (Some(_), Some(names), Some(path)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            for name in names.split(',').filter(|n| !n.is_empty()) {
                // The hierarchy is mounted under its controllers' joined
                // name (`cpu,cpuacct`), often with a link per controller;
                // the directory itself is what is checked, never a link.
                for mount in [names, name] {
                    let root = Path::new(CGROUP_ROOT).join(mount);
                    if magic_of(&root) == Some(CGROUP1_MAGIC) {
                        dirs.push((name.to_string(), own_dir(&root, path)));
                        break;
                    }
                }
            }
        }
        if dirs.is_empty() {
            Cgroup::None
        } else {
            Cgroup::V1(dirs)
        }
    }
}

/// The sandbox's own directory in a hierarchy mounted at `root`: the mount
/// is usually the sandbox's cgroup itself (a cgroup namespace, or the
/// engine binding the sandbox's directory there); where the whole
/// hierarchy is visible, the directory `/proc/self/cgroup` names.
fn own_dir(root: &Path, path: &str) -> PathBuf {
    let rel = path.trim_start_matches('/');
    if rel.is_empty() || rel.split('/').any(|c| c == "..") {
        return root.to_path_buf();
    }
    let dir = root.join(rel);
    if magic_of(&dir).is_some_and(|m| m == CGROUP1_MAGIC || m == CGROUP2_MAGIC) {
        dir
    } else {
        root.to_path_buf()
    }
}

fn magic_of(path: &Path) -> Option<i64> {
    File::open(path).ok().and_then(|f| sys::fs_magic(&f).ok())
}

/// The file's text, when it lives on one of the file systems `magics`.
fn read_on(path: impl AsRef<Path>, magics: &[i64]) -> Option<String> {
    let file = File::open(path).ok()?;
    if !magics.contains(&sys::fs_magic(&file).ok()?) {
        return None;
    }
    let mut text = String::new();
    file.take(MAX_FILE).read_to_string(&mut text).ok()?;
    Some(text)
}

fn cgroup_file(dir: &Path, name: &str) -> Option<String> {
    read_on(dir.join(name), &[CGROUP1_MAGIC, CGROUP2_MAGIC])
}

/// A file holding one number (or `max`: `None`).
fn number(dir: &Path, name: &str) -> Option<u64> {
    cgroup_file(dir, name)?.trim().parse().ok()
}

/// A limit: `max`, or a value too large to be one, is none.
fn limit(dir: &Path, name: &str) -> Option<u64> {
    number(dir, name).filter(|v| *v < UNLIMITED)
}

/// The value of `key` in a flat keyed file (`memory.stat`, `cpu.stat`,
/// `memory.events`, `memory.oom_control`).
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut words = line.split_ascii_whitespace();
        (words.next() == Some(key))
            .then(|| words.next()?.parse().ok())
            .flatten()
    })
}

fn v2(dir: &Path) -> SandboxUsage {
    let stat = cgroup_file(dir, "memory.stat").unwrap_or_default();
    let current = number(dir, "memory.current");
    let (read, write) = cgroup_file(dir, "io.stat")
        .map(|t| parse_io_stat(&t))
        .unzip();
    SandboxUsage {
        cgroup: "v2".into(),
        cpu_ns: cgroup_file(dir, "cpu.stat")
            .and_then(|t| keyed(&t, "usage_usec"))
            .map(|us| us.saturating_mul(1000)),
        memory_bytes: current.map(|c| c.saturating_sub(keyed(&stat, "inactive_file").unwrap_or(0))),
        memory_peak_bytes: number(dir, "memory.peak"),
        memory_limit_bytes: limit(dir, "memory.max"),
        oom_kills: cgroup_file(dir, "memory.events").and_then(|t| keyed(&t, "oom_kill")),
        pids: number(dir, "pids.current"),
        pids_limit: limit(dir, "pids.max"),
        block_read_bytes: read,
        block_write_bytes: write,
        ..SandboxUsage::default()
    }
}

fn v1(dirs: &[(String, PathBuf)]) -> SandboxUsage {
    let dir = |name: &str| {
        dirs.iter()
            .find(|(n, _)| n == name)
            .map(|(_, d)| d.as_path())
    };
    let mut u = SandboxUsage {
        cgroup: "v1".into(),
        ..SandboxUsage::default()
    };
    if let Some(d) = dir("cpuacct") {
        u.cpu_ns = number(d, "cpuacct.usage");
    }
    if let Some(d) = dir("memory") {
        let stat = cgroup_file(d, "memory.stat").unwrap_or_default();
        u.memory_bytes = number(d, "memory.usage_in_bytes")
            .map(|c| c.saturating_sub(keyed(&stat, "total_inactive_file").unwrap_or(0)));
        u.memory_peak_bytes = number(d, "memory.max_usage_in_bytes");
        u.memory_limit_bytes = limit(d, "memory.limit_in_bytes");
        u.oom_kills = cgroup_file(d, "memory.oom_control").and_then(|t| keyed(&t, "oom_kill"));
    }
    if let Some(d) = dir("pids") {
        u.pids = number(d, "pids.current");
        u.pids_limit = limit(d, "pids.max");
    }
    if let Some(d) = dir("blkio") {
        // The throttle files count every device; the plain ones only with
        // the CFQ scheduler. The first one present is read.
        let text = [
            "blkio.throttle.io_service_bytes_recursive",
            "blkio.throttle.io_service_bytes",
            "blkio.io_service_bytes_recursive",
        ]
        .iter()
        .find_map(|name| cgroup_file(d, name));
        if let Some(text) = text {
            let (read, write) = parse_blkio(&text);
            u.block_read_bytes = Some(read);
            u.block_write_bytes = Some(write);
        }
    }
    u
}

/// v2's `io.stat`: `MAJ:MIN rbytes=N wbytes=N rios=N ...` per device.
fn parse_io_stat(text: &str) -> (u64, u64) {
    let (mut read, mut write) = (0u64, 0u64);
    for word in text.split_ascii_whitespace() {
        if let Some(v) = word.strip_prefix("rbytes=") {
            read = read.saturating_add(v.parse().unwrap_or(0));
        } else if let Some(v) = word.strip_prefix("wbytes=") {
            write = write.saturating_add(v.parse().unwrap_or(0));
        }
    }
    (read, write)
}

/// v1's `blkio.*io_service_bytes*`: `MAJ:MIN Op N` per device and
/// operation, and a `Total N` line.
fn parse_blkio(text: &str) -> (u64, u64) {
    let (mut read, mut write) = (0u64, 0u64);
    for line in text.lines() {
        let words: Vec<&str> = line.split_ascii_whitespace().collect();
        let [_, op, n] = words[..] else { continue };
        let n: u64 = n.parse().unwrap_or(0);
        match op {
            "Read" => read = read.saturating_add(n),
            "Write" => write = write.saturating_add(n),
            _ => {}
        }
    }
    (read, write)
}

/// `/proc/net/dev`: bytes received and sent over every interface but
/// loopback (what the engine counts too).
fn parse_net_dev(text: &str) -> (u64, u64) {
    let (mut rx, mut tx) = (0u64, 0u64);
    for line in text.lines() {
        let Some((name, counters)) = line.split_once(':') else {
            continue;
        };
        if name.trim() == "lo" || name.contains('|') {
            continue;
        }
        let fields: Vec<u64> = counters
            .split_ascii_whitespace()
            .map(|f| f.parse().unwrap_or(0))
            .collect();
        if fields.len() >= 9 {
            rx = rx.saturating_add(fields[0]);
            tx = tx.saturating_add(fields[8]);
        }
    }
    (rx, tx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_dev_counts_every_interface_but_loopback() {
        let text = "Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:  999999       9    0    0    0     0          0         0   999999       9    0    0    0     0       0          0
  eth0:    1296      16    0    0    0     0          0         0      648       8    0    0    0     0       0          0
  eth1:       4       1    0    0    0     0          0         0        2       1    0    0    0     0       0          0
";
        assert_eq!(parse_net_dev(text), (1300, 650));
        assert_eq!(parse_net_dev(""), (0, 0));
        assert_eq!(parse_net_dev("eth0: 1 2 3\n"), (0, 0));
    }

    #[test]
    fn block_io_of_both_versions() {
        let v1 = "8:0 Read 4096\n8:0 Write 8192\n8:0 Sync 0\n8:0 Total 12288\n8:16 Read 1\nTotal 12289\n";
        assert_eq!(parse_blkio(v1), (4097, 8192));
        let v2 = "8:0 rbytes=4096 wbytes=8192 rios=1 wios=2 dbytes=0 dios=0\n\
                  8:16 rbytes=1 wbytes=0 rios=1 wios=0 dbytes=0 dios=0\n";
        assert_eq!(parse_io_stat(v2), (4097, 8192));
        assert_eq!(parse_io_stat("8:0 rbytes=x\n"), (0, 0));
    }

    #[test]
    fn keyed_files() {
        let events = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\n";
        assert_eq!(keyed(events, "oom_kill"), Some(2));
        assert_eq!(keyed(events, "oom"), Some(2));
        assert_eq!(
            keyed("usage_usec 1500\nuser_usec 1000\n", "usage_usec"),
            Some(1500)
        );
        assert_eq!(keyed("usage_usec x\n", "usage_usec"), None);
        assert_eq!(keyed("", "usage_usec"), None);
    }

    #[test]
    fn a_path_that_climbs_out_is_not_followed() {
        assert_eq!(
            own_dir(Path::new("/nonexistent"), "/../x"),
            PathBuf::from("/nonexistent")
        );
        assert_eq!(
            own_dir(Path::new("/nonexistent"), "/"),
            PathBuf::from("/nonexistent")
        );
    }

    #[test]
    fn reading_here_says_which_cgroup_it_found() {
        // Whatever this machine has, the report names it and never panics.
        let u = read();
        assert!(["v1", "v2", "none"].contains(&u.cgroup.as_str()), "{u:?}");
        // A file not on a cgroup file system is never believed.
        let dir = std::env::temp_dir().join(format!("corral-usage-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("memory.current"), "123\n").expect("write");
        assert_eq!(number(&dir, "memory.current"), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
