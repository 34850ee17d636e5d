//! [`Sandbox::list_dir`]: a directory's entries, through the agent's
//! `file-list` (ten NUL-ended fields per entry: type, size, mode, name,
//! symlink target, modification time, uid, gid, owner and group names; see
//! the agent's `listing.rs`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use corral_core::{Failure, FailureKind};

use super::{FileError, FileOptions};
use crate::Sandbox;

/// What a directory entry is (as `lstat` says: symlinks are not followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (its target is in [`DirEntry::target`]).
    Symlink,
    /// A FIFO, socket or device.
    Other,
}

impl EntryKind {
    /// `file`, `dir`, `symlink` or `other`.
    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::File => "file",
            EntryKind::Dir => "dir",
            EntryKind::Symlink => "symlink",
            EntryKind::Other => "other",
        }
    }

    fn parse(s: &[u8]) -> Option<EntryKind> {
        match s {
            b"file" => Some(EntryKind::File),
            b"dir" => Some(EntryKind::Dir),
            b"symlink" => Some(EntryKind::Symlink),
            b"other" => Some(EntryKind::Other),
            _ => None,
        }
    }
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// The entry's name (bytes that are not UTF-8 become U+FFFD).
    pub name: String,
    /// File, directory, symlink or other.
    pub kind: EntryKind,
    /// Size in bytes (of the link itself for a symlink).
    pub size: u64,
    /// Permission bits, e.g. `0o644`.
    pub mode: u32,
    /// A symlink's target as stored (not resolved); `None` for other kinds.
    pub target: Option<String>,
    /// Last modification (of the link itself for a symlink).
    pub modified: SystemTime,
    /// Numeric owner.
    pub uid: u32,
    /// Numeric group.
    pub gid: u32,
    /// The owner's name in the sandbox's `/etc/passwd`; `None` when the
    /// uid is not named there.
    pub owner: Option<String>,
    /// The group's name in the sandbox's `/etc/group`; `None` when the gid
    /// is not named there.
    pub group: Option<String>,
}

/// `SECONDS.NANOSECONDS` since the epoch (seconds may be negative).
fn parse_time(f: &[u8]) -> Option<SystemTime> {
    let (secs, nanos) = std::str::from_utf8(f).ok()?.split_once('.')?;
    let secs: i64 = secs.parse().ok()?;
    let nanos: u32 = nanos.parse().ok().filter(|n| *n < 1_000_000_000)?;
    let base = if secs >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(secs.unsigned_abs()))?
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(secs.unsigned_abs()))?
    };
    base.checked_add(Duration::from_nanos(u64::from(nanos)))
}

/// Decodes the agent's listing; `None` when it is malformed.
fn parse(out: &[u8]) -> Option<Vec<DirEntry>> {
    if out.is_empty() {
        return Some(Vec::new());
    }
    let body = out.strip_suffix(&[0])?;
    let fields: Vec<&[u8]> = body.split(|b| *b == 0).collect();
    if !fields.len().is_multiple_of(10) {
        return None;
    }
    let text = |f: &[u8]| String::from_utf8_lossy(f).into_owned();
    let name = |f: &[u8]| (!f.is_empty()).then(|| text(f));
    let number = |f: &[u8]| std::str::from_utf8(f).ok()?.parse::<u32>().ok();
    fields
        .chunks(10)
        .map(|f| {
            let kind = EntryKind::parse(f[0])?;
            let size = std::str::from_utf8(f[1]).ok()?.parse().ok()?;
            let mode = u32::from_str_radix(std::str::from_utf8(f[2]).ok()?, 8).ok()?;
            if f[3].is_empty() {
                return None;
            }
            Some(DirEntry {
                name: text(f[3]),
                kind,
                size,
                mode,
                target: (kind == EntryKind::Symlink).then(|| text(f[4])),
                modified: parse_time(f[5])?,
                uid: number(f[6])?,
                gid: number(f[7])?,
                owner: name(f[8]),
                group: name(f[9]),
            })
        })
        .collect()
}

impl Sandbox {
    /// The entries of the directory `path` (symlinks to directories are
    /// followed to reach it, and checked against `opts.root`), sorted by
    /// name, `.` and `..` left out. Entries are described without following
    /// symlinks. A listing above `opts.max_bytes` (about 20 bytes plus the
    /// name per entry) is [`FileError::TooLarge`], never a partial list.
    pub async fn list_dir(
        &self,
        path: &str,
        opts: &FileOptions,
    ) -> Result<Vec<DirEntry>, FileError> {
        let call = self.call("file-list", "path", path, opts, None)?;
        let out = self.fetch(&call).await?;
        parse(&out).ok_or_else(|| {
            FileError::Sandbox(Failure::new(
                FailureKind::AgentError,
                format!(
                    "sandbox {}: corral-agent file-list {path:?} printed a malformed listing ({} bytes)",
                    self.id(),
                    out.len()
                ),
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_agent_format() {
        assert_eq!(parse(b""), Some(Vec::new()));
        let out =
            b"dir\x004096\x00755\x00a b\x00\x001700000000.000000005\x000\x000\x00root\x00root\x00\
                    symlink\x003\x00777\x00l\x00../t\x00-1.500000000\x001000\x0050\x00user\x00\x00\
                    file\x000\x00644\x00n\nx\xff\x00\x000.000000000\x0065534\x0065534\x00\x00\x00";
        let got = parse(out).expect("valid");
        assert_eq!(got.len(), 3);
        assert_eq!(
            got[0],
            DirEntry {
                name: "a b".into(),
                kind: EntryKind::Dir,
                size: 4096,
                mode: 0o755,
                target: None,
                modified: UNIX_EPOCH + Duration::new(1_700_000_000, 5),
                uid: 0,
                gid: 0,
                owner: Some("root".into()),
                group: Some("root".into()),
            }
        );
        assert_eq!(got[1].target.as_deref(), Some("../t"));
        assert_eq!(
            got[1].modified,
            UNIX_EPOCH - Duration::from_secs(1) + Duration::from_millis(500)
        );
        assert_eq!((got[1].uid, got[1].gid), (1000, 50));
        assert_eq!(
            (got[1].owner.as_deref(), got[1].group.as_deref()),
            (Some("user"), None)
        );
        assert_eq!((got[2].owner.clone(), got[2].uid), (None, 65534));
        assert_eq!(got[1].kind.as_str(), "symlink");
        assert_eq!(got[2].name, "n\nx\u{fffd}");
        assert_eq!(got[2].mode, 0o644);
    }

    #[test]
    fn rejects_malformed_listings() {
        // One good entry's last five fields, after each bad head.
        const TAIL: &str = "1.000000000\x000\x000\x00root\x00root\x00";
        let good = format!("file\x000\x00644\x00f\x00\x00{TAIL}");
        assert!(parse(good.as_bytes()).is_some());
        for bad in [
            "dir\x004096\x00755\x00a\x00\x00".to_string(), // five fields
            format!("file\x000\x00644\x00f\x00\x00{TAIL}extra"), // no final NUL
            format!("pipe\x000\x00644\x00p\x00\x00{TAIL}"), // unknown type
            format!("file\x00-1\x00644\x00f\x00\x00{TAIL}"), // bad size
            format!("file\x000\x00999\x00f\x00\x00{TAIL}"), // not octal
            format!("file\x000\x00644\x00\x00\x00{TAIL}"), // empty name
            good.replace("1.000000000", "1"),              // no nanoseconds
            good.replace("1.000000000", "1.1000000000"),   // nanoseconds above 1 s
            good.replace("\x000\x000\x00", "\x00x\x000\x00"), // bad uid
        ] {
            assert_eq!(parse(bad.as_bytes()), None, "{bad:?}");
        }
    }
}
