//! A sandbox's delta: every change its commands made to its image's root
//! file system that its resets return to, kept in overlay form on the
//! agent's private state tmpfs so it can be a lower layer of every world
//! (a whiteout is a character device 0:0, an opaque directory carries
//! `trusted.overlay.opaque=y`).
//!
//! - [`merge`] folds a world's upper layer into the delta (the start-up
//!   commands' world at the first reset, every kept reset after).
//! - [`export`] writes the delta as a tar archive with OCI whiteouts
//!   (`.wh.NAME` deletes NAME, `.wh..wh..opq` hides what lies below its
//!   directory), the form snapshots travel in.
//! - [`import`] takes such an archive into an empty delta. Its bytes may
//!   come from a compromised sandbox, so every entry is checked as hostile
//!   input before anything is written: a path that climbs (`..`) or is
//!   absolute, a hard link, a device, FIFO or sparse file, a path at or
//!   under one of the sandbox's mount points (or a non-directory, a
//!   whiteout or an opaque directory above one, which would move the
//!   mount when a world is built), a duplicate; and nothing is ever written
//!   through a symbolic link (every parent is checked to be a directory the
//!   import made, and nothing else writes the state meanwhile). Symbolic
//!   links themselves are content: they are kept as they are and resolved
//!   only inside a world.
//!
//! Walks are iterative (an explicit stack), so a deep tree cannot exhaust
//! the thread's stack.

use std::ffi::{CString, OsStr};
use std::fs::{self, File, Metadata};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{
    chown, lchown, DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt,
};
use std::path::{Component, Path, PathBuf};

use corral_core::protocol::{DeltaError, DeltaErrorKind};
use tar::{Archive, Builder, EntryType, Header};

use crate::sys;

/// Marks an opaque directory in overlay form.
const OPAQUE: &std::ffi::CStr = c"trusted.overlay.opaque";
/// An OCI whiteout's name prefix.
const WH: &str = ".wh.";
/// An OCI opaque marker's name.
const WH_OPQ: &str = ".wh..wh..opq";

fn err(kind: DeltaErrorKind, message: impl Into<String>, path: Option<&Path>) -> DeltaError {
    DeltaError {
        kind,
        message: message.into(),
        path: path.map(|p| p.display().to_string()),
    }
}

fn io_err(what: &str, path: &Path, e: io::Error) -> DeltaError {
    err(
        DeltaErrorKind::Io,
        format!("cannot {what} {}: {e}", path.display()),
        Some(path),
    )
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path holds a NUL byte"))
}

/// Whether `meta` is an overlay whiteout.
pub fn is_whiteout(meta: &Metadata) -> bool {
    meta.file_type().is_char_device() && meta.rdev() == 0
}

/// Whether overlay directory `dir` hides everything below it.
pub fn is_opaque(dir: &Path) -> bool {
    let Ok(path) = cpath(dir) else {
        return false;
    };
    sys::getxattr(&path, OPAQUE).is_some_and(|v| v == b"y")
}

fn set_opaque(dir: &Path) -> io::Result<()> {
    sys::setxattr(&cpath(dir)?, OPAQUE, b"y")
}

fn make_whiteout(path: &Path) -> io::Result<()> {
    sys::mknod_whiteout(&cpath(path)?)
}

fn remove_any(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

fn set_owner_mode(path: &Path, meta: &Metadata) -> io::Result<()> {
    // The owner first: chown clears setuid and setgid bits.
    chown(path, Some(meta.uid()), Some(meta.gid()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(meta.mode() & 0o7777))
}

/// Copies a regular file or a symbolic link (mode, owner kept) to `to`,
/// which does not exist. Returns the bytes of content copied.
fn copy_leaf(from: &Path, to: &Path, meta: &Metadata) -> io::Result<u64> {
    if meta.file_type().is_symlink() {
        std::os::unix::fs::symlink(fs::read_link(from)?, to)?;
        lchown(to, Some(meta.uid()), Some(meta.gid()))?;
        return Ok(0);
    }
    let mut src = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(from)?;
    let mut dst = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(to)?;
    let n = copy_sparse(&mut src, &mut dst, meta.len())?;
    set_owner_mode(to, meta)?;
    Ok(n)
}

/// Copies a file of `len` bytes keeping its holes holes: only the data
/// segments are read and written (a sandbox's 64 GiB sparse file costs
/// the state tmpfs what it costs the sandbox, not 64 GiB of memory).
/// Returns the bytes of data copied.
fn copy_sparse(src: &mut File, dst: &mut File, len: u64) -> io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    use std::os::fd::AsFd;
    let mut at = 0u64;
    let mut copied = 0u64;
    while at < len {
        let data = match sys::seek_data_or_hole(src.as_fd(), at, libc::SEEK_DATA) {
            Ok(Some(d)) => d,
            Ok(None) => break,
            // A file system that cannot tell: copy the rest whole.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                src.seek(SeekFrom::Start(at))?;
                dst.seek(SeekFrom::Start(at))?;
                copied += io::copy(src, dst)?;
                break;
            }
            Err(e) => return Err(e),
        };
        let hole = sys::seek_data_or_hole(src.as_fd(), data, libc::SEEK_HOLE)?.unwrap_or(len);
        src.seek(SeekFrom::Start(data))?;
        dst.seek(SeekFrom::Start(data))?;
        copied += io::copy(&mut Read::take(&mut *src, hole.saturating_sub(data)), dst)?;
        at = hole;
    }
    dst.set_len(len)?;
    Ok(copied)
}

enum Step {
    /// Merge the children of upper directory `.0` into delta directory `.1`.
    Dir(PathBuf, PathBuf),
    /// Give delta directory `.0` the mode and owner of `.1` (after its
    /// children, so a read-only mode cannot stop them).
    Finish(PathBuf, Metadata),
}

/// Folds overlay upper layer `upper` into `delta`, so that `delta` over the
/// root file system shows what `upper` over (`delta` over the root file
/// system) showed. Returns the bytes of file content copied.
pub fn merge(upper: &Path, delta: &Path) -> Result<u64, String> {
    let mut bytes = 0;
    // Files of the upper layer with several names, by (device, inode):
    // linked again in the delta rather than copied once per name.
    let mut linked: std::collections::HashMap<(u64, u64), PathBuf> = Default::default();
    let mut stack = vec![Step::Dir(upper.to_path_buf(), delta.to_path_buf())];
    let fail = |what: &str, p: &Path, e: io::Error| format!("cannot {what} {}: {e}", p.display());
    while let Some(step) = stack.pop() {
        let (from, to) = match step {
            Step::Dir(from, to) => (from, to),
            Step::Finish(dir, meta) => {
                set_owner_mode(&dir, &meta).map_err(|e| fail("set the mode of", &dir, e))?;
                continue;
            }
        };
        let entries = fs::read_dir(&from).map_err(|e| fail("read", &from, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| fail("read", &from, e))?;
            let src = entry.path();
            let dst = to.join(entry.file_name());
            let meta = fs::symlink_metadata(&src).map_err(|e| fail("read", &src, e))?;
            let here = fs::symlink_metadata(&dst).ok();
            if is_whiteout(&meta) {
                remove_any(&dst).map_err(|e| fail("remove", &dst, e))?;
                make_whiteout(&dst).map_err(|e| fail("make a whiteout at", &dst, e))?;
                continue;
            }
            if meta.is_dir() {
                let opaque = is_opaque(&src);
                match &here {
                    Some(h) if h.is_dir() && !opaque => {}
                    _ => {
                        // What was there (a whiteout, a file, a directory an
                        // opaque one replaces) hid the root file system's
                        // own entry: so does the new directory.
                        let hid = here.is_some();
                        remove_any(&dst).map_err(|e| fail("remove", &dst, e))?;
                        fs::DirBuilder::new()
                            .mode(0o700)
                            .create(&dst)
                            .map_err(|e| fail("make", &dst, e))?;
                        if opaque || hid {
                            set_opaque(&dst).map_err(|e| fail("mark opaque", &dst, e))?;
                        }
                    }
                }
                stack.push(Step::Finish(dst.clone(), meta));
                stack.push(Step::Dir(src, dst));
                continue;
            }
            let ft = meta.file_type();
            if !(ft.is_file() || ft.is_symlink()) {
                eprintln!(
                    "corral-agent: a kept reset does not carry {} (not a file, directory or symlink)",
                    src.display()
                );
                continue;
            }
            remove_any(&dst).map_err(|e| fail("remove", &dst, e))?;
            if ft.is_file() && meta.nlink() > 1 {
                let key = (meta.dev(), meta.ino());
                if let Some(first) = linked.get(&key) {
                    fs::hard_link(first, &dst).map_err(|e| fail("link", &dst, e))?;
                    continue;
                }
                linked.insert(key, dst.clone());
            }
            bytes += copy_leaf(&src, &dst, &meta).map_err(|e| fail("copy", &src, e))?;
        }
    }
    Ok(bytes)
}

/// A writer that refuses to grow past `max` bytes.
struct Capped<W> {
    inner: W,
    written: u64,
    max: u64,
    over: bool,
}

impl<W: Write> Write for Capped<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.written.saturating_add(buf.len() as u64) > self.max {
            self.over = true;
            return Err(io::Error::other("the archive reached its limit"));
        }
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// What [`export`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// Bytes of the archive.
    pub bytes: u64,
    /// Its entries.
    pub entries: u64,
}

fn header(meta: &Metadata, kind: EntryType, size: u64) -> Header {
    let mut h = Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(meta.mode() & 0o7777);
    h.set_uid(u64::from(meta.uid()));
    h.set_gid(u64::from(meta.gid()));
    h.set_mtime(u64::try_from(meta.mtime()).unwrap_or(0));
    h.set_size(size);
    h
}

fn marker(meta: &Metadata) -> Header {
    let mut h = Header::new_gnu();
    h.set_entry_type(EntryType::Regular);
    h.set_mode(0o600);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(u64::try_from(meta.mtime()).unwrap_or(0));
    h.set_size(0);
    h
}

/// Writes `delta` to `out` as a tar archive with OCI whiteouts, in a fixed
/// order (a directory before its content, names sorted), at most `max`
/// bytes.
pub fn export(delta: &Path, out: impl Write, max: u64) -> Result<Written, DeltaError> {
    let mut builder = Builder::new(Capped {
        inner: out,
        written: 0,
        max,
        over: false,
    });
    let mut entries = 0u64;
    let result = export_into(&mut builder, delta, &mut entries).and_then(|()| {
        builder.finish().map_err(|e| {
            err(
                DeltaErrorKind::Io,
                format!("cannot end the archive: {e}"),
                None,
            )
        })
    });
    let capped = builder.get_ref();
    if capped.over {
        return Err(err(
            DeltaErrorKind::TooLarge,
            format!("the sandbox's changes exceed the limit of {max} bytes"),
            None,
        ));
    }
    result?;
    Ok(Written {
        bytes: capped.written,
        entries,
    })
}

fn export_into<W: Write>(
    builder: &mut Builder<Capped<W>>,
    delta: &Path,
    entries: &mut u64,
) -> Result<(), DeltaError> {
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = delta.join(&rel);
        let mut names: Vec<_> = fs::read_dir(&dir)
            .map_err(|e| io_err("read", &dir, e))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(|e| io_err("read", &dir, e))?;
        names.sort();
        let mut subdirs = Vec::new();
        for name in names {
            let path = dir.join(&name);
            let inside = rel.join(&name);
            let shown = Path::new("/").join(&inside);
            if name.as_bytes().starts_with(WH.as_bytes()) {
                return Err(err(
                    DeltaErrorKind::Unsupported,
                    format!(
                        "{} cannot be kept: a name starting with '{WH}' means a deletion in a snapshot",
                        shown.display()
                    ),
                    Some(&shown),
                ));
            }
            let meta = fs::symlink_metadata(&path).map_err(|e| io_err("read", &path, e))?;
            let ft = meta.file_type();
            let io = |e: io::Error| io_err("archive", &shown, e);
            if is_whiteout(&meta) {
                let mut name_wh = std::ffi::OsString::from(WH);
                name_wh.push(&name);
                let mut h = marker(&meta);
                builder
                    .append_data(&mut h, rel.join(name_wh), io::empty())
                    .map_err(io)?;
            } else if ft.is_dir() {
                let mut h = header(&meta, EntryType::Directory, 0);
                builder
                    .append_data(&mut h, &inside, io::empty())
                    .map_err(io)?;
                if is_opaque(&path) {
                    let mut h = marker(&meta);
                    builder
                        .append_data(&mut h, inside.join(WH_OPQ), io::empty())
                        .map_err(io)?;
                    *entries += 1;
                }
                subdirs.push(inside);
            } else if ft.is_symlink() {
                // The target byte for byte (the tar crate's own link
                // writer normalises paths: `/` would come back `//`).
                let target = fs::read_link(&path).map_err(io)?;
                let t = target.as_os_str().as_bytes();
                let mut h = header(&meta, EntryType::Symlink, 0);
                if t.len() >= 100 {
                    let mut long = Header::new_gnu();
                    long.set_entry_type(EntryType::GNULongLink);
                    long.as_old_mut().name[..13].copy_from_slice(b"././@LongLink");
                    long.set_mode(0o644);
                    long.set_uid(0);
                    long.set_gid(0);
                    long.set_mtime(0);
                    long.set_size(t.len() as u64 + 1);
                    long.set_cksum();
                    let mut data = t.to_vec();
                    data.push(0);
                    builder.append(&long, &data[..]).map_err(io)?;
                    h.set_link_name_literal(&t[..99]).map_err(io)?;
                } else {
                    h.set_link_name_literal(t).map_err(io)?;
                }
                builder
                    .append_data(&mut h, &inside, io::empty())
                    .map_err(io)?;
            } else if ft.is_file() {
                let file = fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&path)
                    .map_err(io)?;
                // One that cannot fit (a sparse file's holes count whole)
                // is refused before any of it is sent.
                let capped = builder.get_mut();
                if capped.written.saturating_add(meta.len()) > capped.max {
                    capped.over = true;
                    return Err(io(io::Error::other("the archive would pass its limit")));
                }
                let mut h = header(&meta, EntryType::Regular, meta.len());
                builder
                    .append_data(&mut h, &inside, file.take(meta.len()))
                    .map_err(io)?;
            } else {
                eprintln!(
                    "corral-agent: a snapshot does not carry {} (not a file, directory or symlink)",
                    shown.display()
                );
                continue;
            }
            *entries += 1;
        }
        // Popped in reverse: the first name's subtree comes first.
        stack.extend(subdirs.into_iter().rev());
    }
    Ok(())
}

/// What an entry of an imported archive does to the path it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effect {
    /// A plain directory (what was there stays visible below it).
    Dir,
    /// Replaces or hides what the image has at the path: a file, a link, a
    /// whiteout, an opaque directory.
    Replace,
}

/// Checks an entry's effect on `rel` against the sandbox's mount points
/// (relative to `/`, the root itself left out): nothing at or under one,
/// and nothing above one but a plain directory, or building a world would
/// mount into what the archive chose.
fn check_mounts(rel: &Path, effect: Effect, mounts: &[PathBuf]) -> Result<(), String> {
    if rel.as_os_str().is_empty() {
        return match effect {
            Effect::Dir => Ok(()),
            Effect::Replace => Err("it would hide the whole root file system".into()),
        };
    }
    for m in mounts {
        if rel.starts_with(m) {
            return Err(format!(
                "it is at or under the mount point /{}",
                m.display()
            ));
        }
        if effect == Effect::Replace && m.starts_with(rel) {
            return Err(format!(
                "it would replace or hide the directory above the mount point /{}",
                m.display()
            ));
        }
    }
    Ok(())
}

/// An entry's path as components below the root, or why it is refused.
fn entry_path(raw: &Path) -> Result<PathBuf, String> {
    let mut rel = PathBuf::new();
    for c in raw.components() {
        match c {
            Component::Normal(n) => rel.push(n),
            Component::CurDir => {}
            Component::ParentDir => return Err("it has a '..' component".into()),
            Component::RootDir | Component::Prefix(_) => return Err("it is absolute".into()),
        }
    }
    Ok(rel)
}

/// Checks that every parent of `rel` inside `delta` is a directory (never
/// a link, a file or a whiteout), making missing ones.
fn parents(delta: &Path, rel: &Path) -> Result<(), String> {
    let mut at = delta.to_path_buf();
    let Some(parent) = rel.parent() else {
        return Ok(());
    };
    for c in parent.components() {
        at.push(c);
        match fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(format!(
                    "it goes through {}, which is not a directory",
                    Path::new("/")
                        .join(at.strip_prefix(delta).unwrap_or(&at))
                        .display()
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::DirBuilder::new()
                    .mode(0o755)
                    .create(&at)
                    .map_err(|e| format!("cannot make {}: {e}", at.display()))?;
            }
            Err(e) => return Err(format!("cannot read {}: {e}", at.display())),
        }
    }
    Ok(())
}

/// What [`import`] took in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Imported {
    /// Entries of the archive.
    pub entries: u64,
    /// Bytes of file content.
    pub content: u64,
}

/// Extracts the tar archive on `input` (OCI whiteouts) into the empty
/// overlay-form directory `delta`, refusing (and stopping at) the first
/// entry that is not safe; `mounts` are the sandbox's mount points
/// relative to `/`. The caller clears `delta` after a failure.
pub fn import(delta: &Path, input: impl Read, mounts: &[PathBuf]) -> Result<Imported, DeltaError> {
    let mut archive = Archive::new(input);
    let mut done = Imported {
        entries: 0,
        content: 0,
    };
    // Directories get their mode and times once their content is in.
    let mut dirs: Vec<(PathBuf, u32, u64)> = Vec::new();
    let bad = |e: io::Error| {
        err(
            DeltaErrorKind::Io,
            format!("invalid tar archive: {e}"),
            None,
        )
    };
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        let raw = entry.path().map_err(bad)?.into_owned();
        let shown = Path::new("/").join(&raw);
        let refuse = |why: String| {
            err(
                DeltaErrorKind::UnsafeEntry,
                format!("archive entry {}: {why}", raw.display()),
                Some(&shown),
            )
        };
        let rel = entry_path(&raw).map_err(refuse)?;
        let kind = entry.header().entry_type();
        let name = rel.file_name().map(OsStr::as_bytes).unwrap_or(b"");
        done.entries += 1;
        if rel.as_os_str().is_empty() {
            if kind != EntryType::Directory {
                return Err(refuse("the root is not a directory".into()));
            }
            continue;
        }
        let header = entry.header();
        let mode = header.mode().map_err(bad)? & 0o7777;
        let uid = u32::try_from(header.uid().map_err(bad)?)
            .map_err(|_| refuse("its owner is out of range".into()))?;
        let gid = u32::try_from(header.gid().map_err(bad)?)
            .map_err(|_| refuse("its group is out of range".into()))?;
        let mtime = header.mtime().map_err(bad)?;
        let parent = rel.parent().unwrap_or(Path::new("")).to_path_buf();
        // OCI markers: the opaque directory and whiteouts.
        if name.starts_with(WH.as_bytes()) {
            if kind != EntryType::Regular || entry.size() != 0 {
                return Err(refuse("a whiteout marker that is not an empty file".into()));
            }
            if name == WH_OPQ.as_bytes() {
                check_mounts(&parent, Effect::Replace, mounts).map_err(refuse)?;
                parents(delta, &rel).map_err(refuse)?;
                let dir = delta.join(&parent);
                set_opaque(&dir).map_err(|e| io_err("mark opaque", &dir, e))?;
                continue;
            }
            let target = &name[WH.len()..];
            if target.is_empty() || target == b"." || target == b".." {
                return Err(refuse("a whiteout of no name".into()));
            }
            let gone = parent.join(OsStr::from_bytes(target));
            check_mounts(&gone, Effect::Replace, mounts).map_err(refuse)?;
            parents(delta, &gone).map_err(refuse)?;
            let at = delta.join(&gone);
            if fs::symlink_metadata(&at).is_ok() {
                return Err(refuse("it names a path the archive already holds".into()));
            }
            make_whiteout(&at).map_err(|e| io_err("make a whiteout at", &at, e))?;
            continue;
        }
        let effect = if kind == EntryType::Directory {
            Effect::Dir
        } else {
            Effect::Replace
        };
        check_mounts(&rel, effect, mounts).map_err(refuse)?;
        parents(delta, &rel).map_err(refuse)?;
        let at = delta.join(&rel);
        let existing = fs::symlink_metadata(&at).ok();
        match kind {
            EntryType::Directory => {
                match existing {
                    Some(m) if m.is_dir() => {}
                    Some(_) => {
                        return Err(refuse("it names a path the archive already holds".into()))
                    }
                    None => fs::DirBuilder::new()
                        .mode(0o700)
                        .create(&at)
                        .map_err(|e| io_err("make", &at, e))?,
                }
                chown(&at, Some(uid), Some(gid)).map_err(|e| io_err("set the owner of", &at, e))?;
                dirs.push((at, mode, mtime));
            }
            EntryType::Regular | EntryType::Continuous => {
                if existing.is_some() {
                    return Err(refuse("it names a path the archive already holds".into()));
                }
                let mut file = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&at)
                    .map_err(|e| io_err("make", &at, e))?;
                let n = io::copy(&mut entry, &mut file).map_err(bad)?;
                done.content += n;
                finish_file(&file, &at, uid, gid, mode, mtime)?;
            }
            EntryType::Symlink => {
                if existing.is_some() {
                    return Err(refuse("it names a path the archive already holds".into()));
                }
                let target = match entry.link_name_bytes() {
                    Some(t) if !t.is_empty() => PathBuf::from(OsStr::from_bytes(&t)),
                    _ => return Err(refuse("a link without a target".into())),
                };
                std::os::unix::fs::symlink(&target, &at).map_err(|e| io_err("make", &at, e))?;
                lchown(&at, Some(uid), Some(gid))
                    .map_err(|e| io_err("set the owner of", &at, e))?;
                let c = cpath(&at).map_err(|e| io_err("make", &at, e))?;
                let t = i64::try_from(mtime).unwrap_or(0);
                sys::set_times(&c, [(t, 0), (t, 0)])
                    .map_err(|e| io_err("set the times of", &at, e))?;
            }
            EntryType::Link => return Err(refuse("hard links are refused".into())),
            EntryType::GNUSparse => return Err(refuse("sparse files are refused".into())),
            other => return Err(refuse(format!("entries of type {other:?} are refused"))),
        }
    }
    // Deepest first, so setting a parent's times comes after its children.
    dirs.sort_by_key(|(p, _, _)| std::cmp::Reverse(p.components().count()));
    for (dir, mode, mtime) in dirs {
        fs::set_permissions(&dir, fs::Permissions::from_mode(mode))
            .map_err(|e| io_err("set the mode of", &dir, e))?;
        let c = cpath(&dir).map_err(|e| io_err("set the times of", &dir, e))?;
        let t = i64::try_from(mtime).unwrap_or(0);
        sys::set_times(&c, [(t, 0), (t, 0)]).map_err(|e| io_err("set the times of", &dir, e))?;
    }
    Ok(done)
}

fn finish_file(
    file: &File,
    at: &Path,
    uid: u32,
    gid: u32,
    mode: u32,
    mtime: u64,
) -> Result<(), DeltaError> {
    std::os::unix::fs::fchown(file, Some(uid), Some(gid))
        .map_err(|e| io_err("set the owner of", at, e))?;
    file.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(|e| io_err("set the mode of", at, e))?;
    let t = i64::try_from(mtime).unwrap_or(0);
    let c = cpath(at).map_err(|e| io_err("set the times of", at, e))?;
    sys::set_times(&c, [(t, 0), (t, 0)]).map_err(|e| io_err("set the times of", at, e))
}

/// Empties `dir` (a failed import's leftovers).
pub fn clear(dir: &Path) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        remove_any(&entry?.path())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mounts() -> Vec<PathBuf> {
        ["proc", "dev", "dev/shm", "etc/hosts", "tmp", "data/host"]
            .iter()
            .map(PathBuf::from)
            .collect()
    }

    #[test]
    fn entries_may_not_touch_mounts_or_what_holds_them() {
        let m = mounts();
        let ok = |p: &str, e| check_mounts(Path::new(p), e, &m);
        assert!(ok("etc/passwd", Effect::Replace).is_ok());
        assert!(ok("etc", Effect::Dir).is_ok());
        assert!(ok("data", Effect::Dir).is_ok());
        assert!(ok("", Effect::Dir).is_ok());
        for (p, e) in [
            ("etc/hosts", Effect::Replace),
            ("tmp/x", Effect::Replace),
            ("tmp", Effect::Dir),
            ("dev/shm/.corral-state/x", Effect::Replace),
            ("etc", Effect::Replace),
            ("data", Effect::Replace),
            ("", Effect::Replace),
        ] {
            let why = ok(p, e).expect_err(p);
            assert!(
                why.contains("mount point") || why.contains("root"),
                "{p}: {why}"
            );
        }
    }

    #[test]
    fn entry_paths_stay_below_the_root() {
        assert_eq!(entry_path(Path::new("./a/b")), Ok(PathBuf::from("a/b")));
        assert_eq!(entry_path(Path::new("./")), Ok(PathBuf::new()));
        assert!(entry_path(Path::new("a/../../b")).is_err());
        assert!(entry_path(Path::new("/etc/passwd")).is_err());
    }

    /// A fresh directory under `/dev/shm` (a tmpfs, as the state is),
    /// removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(what: &str) -> Scratch {
            let dir = std::env::temp_dir().join(format!(
                "corral-delta-{what}-{}-{:?}",
                std::process::id(),
                std::time::SystemTime::now()
            ));
            let dir = Path::new("/dev/shm").join(dir.file_name().expect("a name"));
            fs::create_dir_all(&dir).expect("scratch dir");
            Scratch(dir)
        }
        fn sub(&self, name: &str) -> PathBuf {
            let p = self.0.join(name);
            fs::create_dir_all(&p).expect("sub dir");
            p
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn as_root() -> bool {
        let root = sys::getuid() == 0;
        if !root {
            eprintln!("skipping: whiteouts and trusted xattrs need root");
        }
        root
    }

    /// What a tree holds: path, kind, mode, owner, content or target.
    fn describe(dir: &Path) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in fs::read_dir(&d).expect("read") {
                let p = e.expect("entry").path();
                let m = fs::symlink_metadata(&p).expect("lstat");
                let rel = p.strip_prefix(dir).expect("inside").display().to_string();
                let what = if is_whiteout(&m) {
                    "whiteout".to_string()
                } else if m.is_dir() {
                    stack.push(p.clone());
                    format!("dir opaque={}", is_opaque(&p))
                } else if m.file_type().is_symlink() {
                    format!("link {}", fs::read_link(&p).expect("link").display())
                } else {
                    format!("file {:?}", fs::read(&p).expect("read"))
                };
                out.push(format!(
                    "{rel} {what} {:o} {}:{}",
                    m.mode() & 0o7777,
                    m.uid(),
                    m.gid()
                ));
            }
        }
        out.sort();
        out
    }

    #[test]
    fn a_delta_survives_export_and_import_whole() {
        if !as_root() {
            return;
        }
        let s = Scratch::new("trip");
        let src = s.sub("src");
        fs::DirBuilder::new()
            .mode(0o750)
            .create(src.join("a"))
            .expect("a");
        chown(src.join("a"), Some(1000), Some(1000)).expect("chown");
        fs::write(src.join("a/f"), b"content").expect("f");
        fs::set_permissions(src.join("a/f"), fs::Permissions::from_mode(0o640)).expect("mode");
        std::os::unix::fs::symlink("/etc/passwd", src.join("link")).expect("link");
        std::os::unix::fs::symlink("/", src.join("root-link")).expect("link");
        std::os::unix::fs::symlink("a//./b/", src.join("odd-link")).expect("link");
        let long = format!("/{}", "x/".repeat(120));
        std::os::unix::fs::symlink(&long, src.join("long-link")).expect("link");
        let long_name = "n".repeat(150);
        fs::write(src.join(&long_name), b"long").expect("long name");
        make_whiteout(&src.join("gone")).expect("whiteout");
        fs::create_dir(src.join("o")).expect("o");
        set_opaque(&src.join("o")).expect("opaque");
        fs::write(src.join("o/x"), b"").expect("x");
        // A read-only directory with content: its mode comes last.
        fs::create_dir(src.join("ro")).expect("ro");
        fs::write(src.join("ro/y"), b"y").expect("y");
        fs::set_permissions(src.join("ro"), fs::Permissions::from_mode(0o500)).expect("mode");

        let mut archive = Vec::new();
        let w = export(&src, &mut archive, 1 << 20).expect("export");
        assert_eq!(w.bytes, archive.len() as u64);
        let dst = s.sub("dst");
        import(&dst, &archive[..], &[PathBuf::from("proc")]).expect("import");
        assert_eq!(describe(&dst), describe(&src));

        // Past the limit: a typed error, never a cut archive.
        let e = export(&src, &mut Vec::new(), 1024).expect_err("too large");
        assert_eq!(e.kind, DeltaErrorKind::TooLarge);
    }

    #[test]
    fn merging_upper_layers_keeps_deletions_and_replacements() {
        if !as_root() {
            return;
        }
        let s = Scratch::new("merge");
        let delta = s.sub("delta");
        fs::create_dir(delta.join("kept")).expect("kept");
        fs::write(delta.join("kept/old"), b"old").expect("old");
        make_whiteout(&delta.join("was-deleted")).expect("whiteout");
        fs::write(delta.join("file-then-dir"), b"f").expect("file");
        let upper = s.sub("upper");
        fs::create_dir(upper.join("kept")).expect("kept");
        make_whiteout(&upper.join("kept/old")).expect("whiteout");
        fs::write(upper.join("kept/new"), b"new").expect("new");
        fs::create_dir(upper.join("was-deleted")).expect("dir");
        fs::create_dir(upper.join("file-then-dir")).expect("dir");
        merge(&upper, &delta).expect("merge");
        let got = describe(&delta);
        let has = |line: &str| got.iter().any(|l| l.starts_with(line));
        assert!(has("kept dir opaque=false"), "{got:#?}");
        assert!(has("kept/old whiteout"), "{got:#?}");
        assert!(has("kept/new file"), "{got:#?}");
        // A directory where the delta hid the image's entry hides it too.
        assert!(has("was-deleted dir opaque=true"), "{got:#?}");
        assert!(has("file-then-dir dir opaque=true"), "{got:#?}");
    }

    /// A tar entry with a raw name (`..`, absolute: what the tar crate
    /// will not write itself).
    fn raw_entry(out: &mut Vec<u8>, name: &[u8], kind: EntryType, link: &[u8], data: &[u8]) {
        let mut h = Header::new_old();
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.as_old_mut().linkname[..link.len()].copy_from_slice(link);
        h.set_entry_type(kind);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_size(data.len() as u64);
        h.set_cksum();
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }

    #[test]
    fn hostile_archives_write_nothing_outside_the_delta() {
        if !as_root() {
            return;
        }
        let s = Scratch::new("hostile");
        let outside = s.sub("outside");
        let sentinel = outside.join("sentinel");
        fs::write(&sentinel, b"untouched").expect("sentinel");
        let mounts = vec![PathBuf::from("tmp"), PathBuf::from("data/host")];
        let link_to_outside = outside.display().to_string();
        // (path, type, link target, content) of each entry of an archive.
        type Entry<'a> = (&'a [u8], EntryType, &'a [u8], &'a [u8]);
        let cases: Vec<(&str, Vec<Entry>)> = vec![
            (
                "through a symlink",
                vec![
                    (b"evil", EntryType::Symlink, link_to_outside.as_bytes(), b""),
                    (b"evil/sentinel", EntryType::Regular, b"", b"owned"),
                ],
            ),
            (
                "a directory through a symlink",
                vec![
                    (b"evil", EntryType::Symlink, link_to_outside.as_bytes(), b""),
                    (b"evil/", EntryType::Directory, b"", b""),
                    (b"evil/new", EntryType::Regular, b"", b"owned"),
                ],
            ),
            (
                "climbing",
                vec![(b"../../outside/sentinel", EntryType::Regular, b"", b"owned")],
            ),
            (
                "absolute",
                vec![(b"/tmp/owned", EntryType::Regular, b"", b"owned")],
            ),
            (
                "a hard link",
                vec![(b"hl", EntryType::Link, b"/etc/shadow", b"")],
            ),
            ("a device", vec![(b"dev0", EntryType::Char, b"", b"")]),
            ("a fifo", vec![(b"fifo", EntryType::Fifo, b"", b"")]),
            (
                "under a mount point",
                vec![(b"tmp/x", EntryType::Regular, b"", b"x")],
            ),
            (
                "a link above a mount point",
                vec![(b"data", EntryType::Symlink, b"/", b"")],
            ),
            (
                "a whiteout above a mount point",
                vec![(b".wh.data", EntryType::Regular, b"", b"")],
            ),
            (
                "an opaque root",
                vec![(b".wh..wh..opq", EntryType::Regular, b"", b"")],
            ),
            (
                "a whiteout of '..'",
                vec![(b"a/.wh...", EntryType::Regular, b"", b"")],
            ),
            (
                "a duplicate",
                vec![
                    (b"twice", EntryType::Regular, b"", b"1"),
                    (b"twice", EntryType::Regular, b"", b"2"),
                ],
            ),
        ];
        for (what, entries) in cases {
            let delta = s.sub(&format!("delta-{}", what.replace(' ', "-")));
            let mut archive = Vec::new();
            for (name, kind, link, data) in entries {
                raw_entry(&mut archive, name, kind, link, data);
            }
            archive.extend_from_slice(&[0u8; 1024]);
            let e = import(&delta, &archive[..], &mounts).expect_err(what);
            assert_eq!(e.kind, DeltaErrorKind::UnsafeEntry, "{what}: {e:?}");
            assert_eq!(
                fs::read(&sentinel).expect("sentinel"),
                b"untouched",
                "{what}"
            );
            assert_eq!(
                fs::read_dir(&outside).expect("outside").count(),
                1,
                "{what}: something was written outside"
            );
        }
    }

    #[test]
    fn a_capped_writer_stops_at_its_limit() {
        let mut c = Capped {
            inner: Vec::new(),
            written: 0,
            max: 4,
            over: false,
        };
        assert!(c.write_all(b"abcd").is_ok());
        assert!(c.write_all(b"e").is_err());
        assert!(c.over);
        assert_eq!(c.inner, b"abcd");
    }
}
