//! `file-write` and `file-read` (and the shared parts of `tar-extract` and
//! `tar-create`, see `tarball.rs`, and `file-list`, see `listing.rs`): the
//! agent as a file tool in its sandbox.
//!
//! corral moves files by running this binary, which every sandbox has at
//! `/.corral/corral-agent`, as an ordinary command: bytes travel through the
//! command's stdin and stdout. That works in images without a shell or
//! coreutils (`FROM scratch`) and on tmpfs mounts, which Docker's archive API
//! cannot see, and it runs as the sandbox's user with the sandbox's limits.
//!
//! Every failure is one line on stderr, a
//! [`corral_core::file_error::FileErrorReport`] (`corral-agent-error:
//! {json}`: kind, message, path, root, entry, reason, size, cap), and an exit
//! code (1 IO, 2 usage, 3 not found, 4 too large, 5 escapes the root or
//! unsafe entry; [`Fail::code`], kept for anyone reading only the status). corral reads the kind and the fields, never the message, which
//! is for people: paths in it are `{:?}`-quoted so they read unambiguously.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::SystemTime;

use corral_core::file_error::{FileErrorKind, FileErrorReport};

use crate::{listing, tarball};

/// Default cap of every file operation: 64 MiB.
pub const DEFAULT_MAX: u64 = 64 << 20;

/// Mode of a new file when `--mode` is not given and no file is replaced.
const DEFAULT_FILE_MODE: u32 = 0o644;

/// Which file operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `file-write`: stdin to a file, atomically.
    Write,
    /// `file-read`: a file to stdout.
    Read,
    /// `tar-extract`: a tar on stdin into a directory.
    TarExtract,
    /// `tar-create`: a file or directory as a tar on stdout.
    TarCreate,
    /// `file-list`: a directory's entries on stdout.
    List,
}

impl Op {
    /// The operation a subcommand names, if it names one.
    pub fn from_name(name: &str) -> Option<Op> {
        match name {
            "file-write" => Some(Op::Write),
            "file-read" => Some(Op::Read),
            "tar-extract" => Some(Op::TarExtract),
            "tar-create" => Some(Op::TarCreate),
            "file-list" => Some(Op::List),
            _ => None,
        }
    }

    /// The subcommand's name.
    pub fn name(self) -> &'static str {
        match self {
            Op::Write => "file-write",
            Op::Read => "file-read",
            Op::TarExtract => "tar-extract",
            Op::TarCreate => "tar-create",
            Op::List => "file-list",
        }
    }
}

/// One file command, as parsed from the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRequest {
    /// What to do.
    pub op: Op,
    /// The file or directory; relative paths need `root`.
    pub path: String,
    /// `--root`: the path must resolve inside this directory.
    pub root: Option<String>,
    /// `--mode` (file-write): permission bits of the written file; without
    /// it a replaced file keeps its mode and a new one gets 0644.
    pub mode: Option<u32>,
    /// `--mkdirs` (file-write): create missing parent directories.
    pub mkdirs: bool,
    /// `--max`: the most bytes read, written or streamed.
    pub max: u64,
}

/// Why a file command failed: the report it writes as its last stderr
/// line, whose kind also gives the exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fail {
    /// What corral reads: the kind, the fields and a message for people
    /// (boxed: every function of the file tool returns it in its `Err`).
    pub report: Box<FileErrorReport>,
}

impl Fail {
    fn new(kind: FileErrorKind, message: String) -> Fail {
        Fail {
            report: Box::new(FileErrorReport::new(kind, message)),
        }
    }

    /// The exit code of its kind (1 IO, 2 usage, 3 not found, 4 too large,
    /// 5 escapes the root or unsafe entry).
    pub fn code(&self) -> i32 {
        self.report.kind.exit_code()
    }

    pub(crate) fn usage(message: impl Into<String>) -> Fail {
        Fail::new(FileErrorKind::Usage, message.into())
    }

    pub(crate) fn not_found(path: &Path, detail: &str) -> Fail {
        let mut message = format!("not found: {path:?}");
        if !detail.is_empty() {
            message.push_str(&format!(" ({detail})"));
        }
        let mut fail = Fail::new(FileErrorKind::NotFound, message);
        fail.report.path = Some(text(path));
        fail
    }

    /// `what` names `path` for people (the file, or "input for" it); `size`
    /// is exact when known.
    pub(crate) fn too_large(path: &Path, what: &str, size: Option<u64>, max: u64) -> Fail {
        let message = match size {
            Some(size) => {
                format!("too large: {what} is {size} bytes, above the cap of {max} bytes")
            }
            None => format!("too large: {what} exceeds the cap of {max} bytes"),
        };
        let mut fail = Fail::new(FileErrorKind::TooLarge, message);
        fail.report.path = Some(text(path));
        fail.report.size = size;
        fail.report.limit = Some(max);
        fail
    }

    pub(crate) fn escapes(path: &Path, resolved: &Path, root: &Path) -> Fail {
        let mut fail = Fail::new(
            FileErrorKind::Escapes,
            format!("escapes root: {path:?} resolves to {resolved:?}, outside the root {root:?}"),
        );
        fail.report.path = Some(text(path));
        fail.report.root = Some(text(root));
        fail
    }

    pub(crate) fn unsafe_entry(entry: &Path, reason: &str) -> Fail {
        let mut fail = Fail::new(
            FileErrorKind::UnsafeEntry,
            format!("unsafe entry {entry:?}: {reason}"),
        );
        fail.report.entry = Some(text(entry));
        fail.report.reason = Some(reason.to_string());
        fail
    }

    /// Any IO error: "not found" when it is one, else `cannot <what>`.
    pub(crate) fn io(what: &str, path: &Path, e: &io::Error) -> Fail {
        if e.kind() == io::ErrorKind::NotFound {
            return Fail::not_found(path, &format!("{what}: {e}"));
        }
        let mut fail = Fail::other(format!("cannot {what} {path:?}: {e}"));
        fail.report.path = Some(text(path));
        fail
    }

    pub(crate) fn other(message: String) -> Fail {
        Fail::new(FileErrorKind::Io, message)
    }
}

/// A path as report text (the message quotes it exactly; this field only
/// needs to be readable and matchable).
fn text(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// Writes `fail`'s report as one line on stderr and returns its exit code.
/// The file commands write nothing else on stderr, so the report is the last
/// line, where corral looks for it.
pub fn report(fail: &Fail) -> i32 {
    let mut line = fail.report.encode();
    line.push('\n');
    // Nowhere to report a failure to report: the exit code stays.
    let _ = io::stderr().write_all(line.as_bytes());
    fail.code()
}

/// Runs a file command with the process's stdin and stdout; returns the exit
/// code after writing any error as a report line.
pub fn run(req: &FileRequest) -> i32 {
    let result = match req.op {
        Op::Write => std_file(io::stdin().as_fd()).and_then(|mut i| write_file(req, &mut i)),
        Op::Read => std_file(io::stdout().as_fd()).and_then(|mut o| read_file(req, &mut o)),
        Op::TarExtract => {
            std_file(io::stdin().as_fd()).and_then(|mut i| tarball::extract(req, &mut i))
        }
        Op::TarCreate => {
            std_file(io::stdout().as_fd()).and_then(|mut o| tarball::create(req, &mut o))
        }
        Op::List => std_file(io::stdout().as_fd()).and_then(|mut o| listing::list(req, &mut o)),
    };
    match result {
        Ok(()) => 0,
        Err(fail) => report(&fail),
    }
}

/// A duplicate of stdin or stdout as a plain `File`: unbuffered (std's
/// stdout flushes at every newline, which binary data is full of).
fn std_file(fd: std::os::fd::BorrowedFd<'_>) -> Result<File, Fail> {
    fd.try_clone_to_owned()
        .map(File::from)
        .map_err(|e| Fail::other(format!("cannot use the standard streams: {e}")))
}

/// The checked location of a request's path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The path with every existing component's symlinks resolved; the
    /// components that do not exist yet are appended as given (`.` and `..`
    /// applied lexically).
    pub path: PathBuf,
    /// The canonical root, with `--root`.
    pub root: Option<PathBuf>,
}

/// Resolves `path` and checks it stays inside `root`. Without a root the
/// path must be absolute; with one, a relative path is taken relative to it.
pub fn resolve(path: &str, root: Option<&str>) -> Result<Resolved, Fail> {
    if path.is_empty() {
        return Err(Fail::usage("invalid path '': a path is required"));
    }
    let given = Path::new(path);
    let (root, joined) = match root {
        Some("") => return Err(Fail::usage("invalid value '' for '--root'")),
        Some(r) => {
            let canonical =
                fs::canonicalize(r).map_err(|e| Fail::io("resolve the root", Path::new(r), &e))?;
            if !canonical.is_dir() {
                return Err(Fail::other(format!("root {r:?} is not a directory")));
            }
            let joined = canonical.join(given);
            (Some(canonical), joined)
        }
        None if !given.is_absolute() => {
            return Err(Fail::usage(format!(
                "invalid path {path:?}: must be absolute when no --root is given"
            )))
        }
        None => (None, given.to_path_buf()),
    };
    let resolved = canonicalize_prefix(&joined).map_err(|e| Fail::io("resolve", given, &e))?;
    if let Some(root) = &root {
        if !resolved.starts_with(root) {
            return Err(Fail::escapes(given, &resolved, root));
        }
    }
    Ok(Resolved {
        path: resolved,
        root,
    })
}

/// Canonicalizes the longest existing prefix of the absolute path `p` and
/// appends the rest lexically. A `..` after a missing component cannot be
/// resolved by the kernel either, so applying it lexically loses nothing.
pub fn canonicalize_prefix(p: &Path) -> io::Result<PathBuf> {
    let comps: Vec<Component<'_>> = p.components().collect();
    for n in (1..=comps.len()).rev() {
        let prefix: PathBuf = comps[..n].iter().collect();
        match fs::canonicalize(&prefix) {
            Ok(mut resolved) => {
                for c in &comps[n..] {
                    match c {
                        Component::Normal(name) => resolved.push(name),
                        Component::ParentDir => {
                            resolved.pop();
                        }
                        Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
                    }
                }
                return Ok(resolved);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        "path is not absolute",
    ))
}

/// Creates `dir` and its missing parents (0755 before the umask). A
/// component that exists must be a real directory, not a symlink: `dir` was
/// resolved, so a symlink appearing now is a race lost to someone else.
pub fn make_dirs(dir: &Path) -> Result<(), Fail> {
    let mut cur = PathBuf::new();
    for c in dir.components() {
        cur.push(c);
        match fs::symlink_metadata(&cur) {
            Ok(m) if m.is_dir() => continue,
            Ok(_) => {
                return Err(Fail::other(format!(
                    "cannot create {dir:?}: {cur:?} is not a directory"
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(Fail::io("create directory", &cur, &e)),
        }
        match DirBuilder::new().mode(0o755).create(&cur) {
            Ok(()) => {}
            // Created by someone else meanwhile: fine if it is a directory.
            Err(e)
                if e.kind() == io::ErrorKind::AlreadyExists
                    && fs::symlink_metadata(&cur).is_ok_and(|m| m.is_dir()) => {}
            Err(e) => return Err(Fail::io("create directory", &cur, &e)),
        }
    }
    Ok(())
}

/// `file-write`: stdin to `req.path` through a temporary file in the same
/// directory and a rename, so readers see the old file or the new one.
pub fn write_file(req: &FileRequest, input: &mut impl Read) -> Result<(), Fail> {
    let r = resolve(&req.path, req.root.as_deref())?;
    let (Some(dir), Some(name)) = (r.path.parent(), r.path.file_name()) else {
        return Err(Fail::other(format!(
            "cannot write {:?}: is a directory",
            r.path
        )));
    };
    match fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(Fail::other(format!(
                "cannot write {:?}: {dir:?} is not a directory",
                r.path
            )))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound && req.mkdirs => make_dirs(dir)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Fail::not_found(
                dir,
                &format!("the parent directory of {:?}; --mkdirs creates it", r.path),
            ))
        }
        Err(e) => return Err(Fail::io("write into", dir, &e)),
    }
    let existing_mode = match fs::symlink_metadata(&r.path) {
        Ok(m) if m.is_dir() => {
            return Err(Fail::other(format!(
                "cannot write {:?}: is a directory",
                r.path
            )))
        }
        Ok(m) if m.is_file() => Some(m.permissions().mode() & 0o7777),
        // A symlink here dangles (resolve followed the others): it is
        // replaced, never followed.
        Ok(m) if m.file_type().is_symlink() => None,
        Ok(_) => {
            return Err(Fail::other(format!(
                "cannot write {:?}: not a regular file",
                r.path
            )))
        }
        Err(_) => None,
    };
    let mode = req.mode.or(existing_mode).unwrap_or(DEFAULT_FILE_MODE);
    let what = format!("input for {:?}", r.path);
    write_atomic(dir, name.as_ref(), input, mode, req.max, &what, None)
}

/// Writes `input` (at most `max` bytes, else a `too_large` failure and nothing
/// written) to `dir/name` with `mode`, through a temporary file created with
/// `O_EXCL|O_NOFOLLOW` and renamed over the target (which replaces a symlink
/// rather than following it). `mtime`, when given, is set on the file.
pub fn write_atomic(
    dir: &Path,
    name: &Path,
    input: &mut impl Read,
    mode: u32,
    max: u64,
    what: &str,
    mtime: Option<SystemTime>,
) -> Result<(), Fail> {
    let target = dir.join(name);
    let (tmp, mut file) = create_temp(dir, name)?;
    let guard = RemoveOnDrop(Some(tmp.clone()));
    copy_capped(input, &mut file, max).map_err(|e| match e {
        CopyError::TooLarge => Fail::too_large(&target, what, None, max),
        CopyError::Read(e) => Fail::other(format!("cannot read the {what}: {e}")),
        CopyError::Write(e) => Fail::io("write", &target, &e),
    })?;
    file.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(|e| Fail::io("set the mode of", &target, &e))?;
    if let Some(t) = mtime {
        file.set_modified(t)
            .map_err(|e| Fail::io("set the mtime of", &target, &e))?;
    }
    drop(file);
    fs::rename(&tmp, &target).map_err(|e| Fail::io("write", &target, &e))?;
    guard.disarm();
    Ok(())
}

/// Creates a fresh temporary file next to `dir/name`.
fn create_temp(dir: &Path, name: &Path) -> Result<(PathBuf, File), Fail> {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let pid = std::process::id();
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name.as_os_str());
        tmp_name.push(format!(".corral-{pid}-{n}"));
        let tmp = dir.join(tmp_name);
        let opened = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp);
        match opened {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < u32::MAX => continue,
            Err(e) => return Err(Fail::io("write", &dir.join(name), &e)),
        }
    }
}

/// Removes a temporary file unless disarmed.
struct RemoveOnDrop(Option<PathBuf>);

impl RemoveOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = fs::remove_file(p);
        }
    }
}

/// Why [`copy_capped`] stopped.
#[derive(Debug)]
pub enum CopyError {
    /// More than the cap arrived.
    TooLarge,
    /// Reading the input failed.
    Read(io::Error),
    /// Writing the output failed.
    Write(io::Error),
}

/// Copies all of `input` to `out`, failing as soon as more than `max` bytes
/// arrive. Returns the bytes copied.
pub fn copy_capped(
    input: &mut impl Read,
    out: &mut impl Write,
    max: u64,
) -> Result<u64, CopyError> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut total: u64 = 0;
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(CopyError::Read(e)),
        };
        total += n as u64;
        if total > max {
            return Err(CopyError::TooLarge);
        }
        out.write_all(&buf[..n]).map_err(CopyError::Write)?;
    }
}

/// Opens an existing file for reading without following a symlink in its
/// last component and without blocking on a FIFO.
pub fn open_read(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
}

/// `file-read`: `req.path` to `out`, after checking it is a regular file no
/// larger than the cap (so a refused file sends no bytes at all).
pub fn read_file(req: &FileRequest, out: &mut impl Write) -> Result<(), Fail> {
    let r = resolve(&req.path, req.root.as_deref())?;
    if fs::symlink_metadata(&r.path).is_ok_and(|m| m.file_type().is_symlink()) {
        // resolve followed every symlink that leads somewhere.
        return Err(Fail::not_found(
            &r.path,
            "a symbolic link to a missing target",
        ));
    }
    let mut file = open_read(&r.path).map_err(|e| Fail::io("read", &r.path, &e))?;
    let meta = file.metadata().map_err(|e| Fail::io("read", &r.path, &e))?;
    if meta.is_dir() {
        return Err(Fail::other(format!(
            "cannot read {:?}: is a directory",
            r.path
        )));
    }
    if !meta.is_file() {
        return Err(Fail::other(format!(
            "cannot read {:?}: not a regular file",
            r.path
        )));
    }
    let size = meta.len();
    if size > req.max {
        return Err(Fail::too_large(
            &r.path,
            &format!("{:?}", r.path),
            Some(size),
            req.max,
        ));
    }
    if size == 0 {
        // A file that states no size (/proc, /sys) has its content only
        // when read: read it whole within the cap, then send it.
        let mut content = Vec::new();
        (&mut file)
            .take(req.max.saturating_add(1))
            .read_to_end(&mut content)
            .map_err(|e| Fail::io("read", &r.path, &e))?;
        if content.len() as u64 > req.max {
            return Err(Fail::too_large(
                &r.path,
                &format!("{:?}", r.path),
                None,
                req.max,
            ));
        }
        out.write_all(&content)
            .map_err(|e| Fail::other(format!("cannot send {:?}: {e}", r.path)))?;
    } else {
        // Exactly `size` bytes: a file growing meanwhile cannot break the cap.
        io::copy(&mut (&mut file).take(size), out)
            .map_err(|e| Fail::other(format!("cannot send {:?}: {e}", r.path)))?;
    }
    out.flush()
        .map_err(|e| Fail::other(format!("cannot send {:?}: {e}", r.path)))?;
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fresh directory on the host, removed when dropped.
    pub(crate) struct TempDir(pub PathBuf);

    impl TempDir {
        pub(crate) fn new(tag: &str) -> TempDir {
            static N: AtomicU32 = AtomicU32::new(0);
            let n = N.fetch_add(1, Ordering::Relaxed);
            let p =
                std::env::temp_dir().join(format!("corral-files-{tag}-{}-{n}", std::process::id()));
            let _ = fs::remove_dir_all(&p);
            fs::create_dir_all(&p).expect("create temp dir");
            // The canonical form, so comparisons with resolved paths hold
            // even when the temp dir sits behind a symlink.
            TempDir(fs::canonicalize(&p).expect("canonicalize temp dir"))
        }

        pub(crate) fn s(&self) -> String {
            self.0.display().to_string()
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    pub(crate) fn req(op: Op, path: &str, root: Option<&str>) -> FileRequest {
        FileRequest {
            op,
            path: path.to_string(),
            root: root.map(String::from),
            mode: None,
            mkdirs: false,
            max: DEFAULT_MAX,
        }
    }

    #[test]
    fn relative_paths_resolve_under_the_root() {
        let t = TempDir::new("rel");
        fs::create_dir(t.0.join("sub")).expect("mkdir");
        let r = resolve("sub/./new.txt", Some(&t.s())).expect("inside");
        assert_eq!(r.path, t.0.join("sub/new.txt"));
        assert_eq!(r.root.as_deref(), Some(t.0.as_path()));
        // An absolute path inside the root is fine too.
        let abs = t.0.join("sub/x").display().to_string();
        assert_eq!(
            resolve(&abs, Some(&t.s())).expect("abs").path,
            t.0.join("sub/x")
        );
        // Missing components with `..` behind them stay inside.
        let r = resolve("missing/../sub/y", Some(&t.s())).expect("inside");
        assert_eq!(r.path, t.0.join("sub/y"));
    }

    #[test]
    fn dot_dot_and_absolute_paths_outside_the_root_escape() {
        let t = TempDir::new("esc");
        fs::create_dir(t.0.join("root")).expect("mkdir");
        let root = t.0.join("root").display().to_string();
        for path in ["../x", "a/../../x", "missing/../../x", "/etc/passwd", ".."] {
            let e = resolve(path, Some(&root)).expect_err(path);
            assert_eq!(e.report.kind, FileErrorKind::Escapes, "{path}: {e:?}");
            assert!(e.report.message.starts_with("escapes root: "), "{e:?}");
            assert!(e.report.message.contains(&format!("{path:?}")), "{e:?}");
            assert!(e.report.message.contains(&format!("{root:?}")), "{e:?}");
            assert_eq!(e.report.path.as_deref(), Some(path), "{e:?}");
            assert_eq!(e.report.root.as_deref(), Some(root.as_str()), "{e:?}");
        }
        // A sibling whose name extends the root's is outside it.
        fs::create_dir(t.0.join("rootx")).expect("mkdir");
        let e = resolve("../rootx/f", Some(&root)).expect_err("sibling");
        assert_eq!(e.report.kind, FileErrorKind::Escapes);
    }

    #[test]
    fn symlinks_are_resolved_before_the_root_check() {
        let t = TempDir::new("link");
        let root = t.0.join("root");
        fs::create_dir_all(root.join("in")).expect("mkdir");
        fs::create_dir(t.0.join("outside")).expect("mkdir");
        std::os::unix::fs::symlink(t.0.join("outside"), root.join("out")).expect("symlink");
        std::os::unix::fs::symlink("in", root.join("alias")).expect("symlink");
        let rs = root.display().to_string();
        let e = resolve("out/secret", Some(&rs)).expect_err("via symlink");
        assert_eq!(e.report.kind, FileErrorKind::Escapes);
        assert!(
            e.report
                .message
                .contains(&format!("{:?}", t.0.join("outside/secret"))),
            "{e:?}"
        );
        // A symlink that stays inside is followed.
        assert_eq!(
            resolve("alias/f", Some(&rs)).expect("inside").path,
            root.join("in/f")
        );
        // The root itself may be reached through a symlink.
        std::os::unix::fs::symlink(&root, t.0.join("rootlink")).expect("symlink");
        let via = t.0.join("rootlink").display().to_string();
        assert_eq!(
            resolve("in/g", Some(&via)).expect("inside").path,
            root.join("in/g")
        );
    }

    #[test]
    fn bad_paths_and_roots_are_named() {
        let e = resolve("relative", None).expect_err("relative without root");
        assert_eq!(e.report.kind, FileErrorKind::Usage);
        assert!(e.report.message.contains("\"relative\""), "{e:?}");
        assert_eq!(
            resolve("", None).expect_err("empty").report.kind,
            FileErrorKind::Usage
        );
        let e = resolve("x", Some("/nonexistent-corral-root")).expect_err("missing root");
        assert_eq!(e.report.kind, FileErrorKind::NotFound);
        assert!(
            e.report.message.contains("/nonexistent-corral-root"),
            "{e:?}"
        );
    }

    #[test]
    fn write_is_atomic_capped_and_keeps_modes() {
        let t = TempDir::new("write");
        let path = t.0.join("f.bin").display().to_string();
        let data: Vec<u8> = (0..=255u8).collect();
        write_file(&req(Op::Write, &path, None), &mut &data[..]).expect("write");
        assert_eq!(fs::read(&path).expect("read back"), data);
        let mode = |p: &str| fs::metadata(p).expect("stat").permissions().mode() & 0o7777;
        assert_eq!(mode(&path), DEFAULT_FILE_MODE);

        // --mode sets it; a later write without --mode keeps it.
        let mut r = req(Op::Write, &path, None);
        r.mode = Some(0o751);
        write_file(&r, &mut &b"x"[..]).expect("write");
        assert_eq!(mode(&path), 0o751);
        write_file(&req(Op::Write, &path, None), &mut &b"y"[..]).expect("write");
        assert_eq!(mode(&path), 0o751);

        // Above the cap: an error naming the cap, the old file untouched and
        // no temporary file left behind.
        let mut r = req(Op::Write, &path, None);
        r.max = 3;
        let e = write_file(&r, &mut &b"abcd"[..]).expect_err("too large");
        assert_eq!(e.report.kind, FileErrorKind::TooLarge);
        assert!(e.report.message.contains("cap of 3 bytes"), "{e:?}");
        // Streamed input: the cap is known, the size is not.
        assert_eq!((e.report.size, e.report.limit), (None, Some(3)));
        assert_eq!(e.report.path.as_deref(), Some(path.as_str()));
        assert_eq!(fs::read(&path).expect("read"), b"y");
        let names: Vec<_> = fs::read_dir(&t.0)
            .expect("ls")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from("f.bin")]);
        // Exactly the cap is fine.
        write_file(&r, &mut &b"abc"[..]).expect("at the cap");
    }

    #[test]
    fn write_needs_the_parent_unless_mkdirs() {
        let t = TempDir::new("mkdirs");
        let mut r = req(Op::Write, "a/b/c.txt", Some(&t.s()));
        let e = write_file(&r, &mut &b"x"[..]).expect_err("no parent");
        assert_eq!(e.report.kind, FileErrorKind::NotFound);
        assert!(e.report.message.contains("--mkdirs"), "{e:?}");
        r.mkdirs = true;
        write_file(&r, &mut &b"x"[..]).expect("mkdirs");
        assert_eq!(fs::read(t.0.join("a/b/c.txt")).expect("read"), b"x");
        let e = write_file(&req(Op::Write, "a", Some(&t.s())), &mut &b"x"[..]).expect_err("dir");
        assert!(e.report.message.contains("is a directory"), "{e:?}");
    }

    #[test]
    fn write_replaces_a_dangling_symlink_instead_of_following_it() {
        let t = TempDir::new("dangle");
        let root = t.0.join("root");
        fs::create_dir(&root).expect("mkdir");
        let outside = t.0.join("outside-target");
        std::os::unix::fs::symlink(&outside, root.join("l")).expect("symlink");
        write_file(
            &req(Op::Write, "l", Some(&root.display().to_string())),
            &mut &b"x"[..],
        )
        .expect("write");
        assert!(!outside.exists(), "followed the symlink out of the root");
        assert!(fs::symlink_metadata(root.join("l"))
            .expect("stat")
            .is_file());
    }

    #[test]
    fn files_that_state_no_size_are_read_whole() {
        // procfs says 0 bytes for what it has.
        assert_eq!(fs::metadata("/proc/self/status").expect("stat").len(), 0);
        let mut out = Vec::new();
        read_file(&req(Op::Read, "/proc/self/status", None), &mut out).expect("read");
        assert!(String::from_utf8_lossy(&out).contains("Pid:"), "{out:?}");
        // Within the cap still.
        let mut r = req(Op::Read, "/proc/self/status", None);
        r.max = 8;
        let e = read_file(&r, &mut Vec::new()).expect_err("too large");
        assert_eq!(e.report.kind, FileErrorKind::TooLarge);
    }

    #[test]
    fn read_checks_size_and_kind_first() {
        let t = TempDir::new("read");
        let f = t.0.join("f");
        fs::write(&f, b"hello").expect("write");
        let fs_ = f.display().to_string();
        let mut out = Vec::new();
        read_file(&req(Op::Read, &fs_, None), &mut out).expect("read");
        assert_eq!(out, b"hello");

        let mut r = req(Op::Read, &fs_, None);
        r.max = 4;
        let mut out = Vec::new();
        let e = read_file(&r, &mut out).expect_err("too large");
        assert_eq!(e.report.kind, FileErrorKind::TooLarge);
        assert!(
            e.report
                .message
                .contains("is 5 bytes, above the cap of 4 bytes"),
            "{e:?}"
        );
        assert_eq!(
            (e.report.path.as_deref(), e.report.size, e.report.limit),
            (Some(fs_.as_str()), Some(5), Some(4))
        );
        assert!(out.is_empty(), "streamed part of a refused file");

        let e = read_file(&req(Op::Read, &t.s(), None), &mut Vec::new()).expect_err("dir");
        assert_eq!(e.report.kind, FileErrorKind::Io);
        assert!(e.report.message.contains("is a directory"), "{e:?}");
        let missing = t.0.join("missing").display().to_string();
        let e = read_file(&req(Op::Read, &missing, None), &mut Vec::new()).expect_err("missing");
        assert_eq!(e.report.kind, FileErrorKind::NotFound);
        assert!(e.report.message.starts_with("not found: "), "{e:?}");
    }

    #[test]
    fn copy_capped_stops_past_the_cap() {
        let mut out = Vec::new();
        assert_eq!(copy_capped(&mut &b"abc"[..], &mut out, 3).ok(), Some(3));
        assert!(matches!(
            copy_capped(&mut &b"abcd"[..], &mut Vec::new(), 3),
            Err(CopyError::TooLarge)
        ));
    }
}
