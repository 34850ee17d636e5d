//! Files in and out of a sandbox: [`Sandbox::write_file`],
//! [`Sandbox::read_file`], [`Sandbox::list_dir`] (in `files/list.rs`),
//! [`Sandbox::upload_tar`], [`Sandbox::upload_dir`] and
//! [`Sandbox::download_tar`].
//!
//! Each runs corral's agent binary inside the sandbox as a tool
//! (`/.corral/corral-agent file-write PATH ...`, see the agent's `files.rs`)
//! through [`Sandbox::run`]; the bytes travel as the command's stdin or
//! stdout. So it works in every image, `FROM scratch` included, on tmpfs
//! mounts that Docker's archive API cannot see, and as the sandbox's user
//! under its limits. The agent's structured error report (the last stderr
//! line, decoded strictly by `corral_core::file_error`) becomes a typed
//! [`FileError`]; a command that did not complete (container lost, timeout)
//! keeps its typed [`Failure`].

// `FileError::Sandbox` carries a `Failure` by value, as `CommandResult` does,
// so callers match and compare it like every other failure; the copy of a
// few hundred bytes on an error path is nothing next to the file moved.
#![allow(clippy::result_large_err)]

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use corral_core::file_error::{FileErrorKind, FileErrorReport, MAX_REPORT_LINE};
use corral_core::protocol::AGENT_PATH;
use corral_core::{CommandResult, CommandSpec, Failure, FailureKind};

use crate::Sandbox;

mod list;

pub use list::{DirEntry, EntryKind};

/// Default cap of a file operation: 64 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 64 << 20;

/// Default time limit of a file operation: 120 s.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// Output budget of operations that print nothing but a one-line error.
const SMALL_OUTPUT: u64 = 64 * 1024;

/// How a file operation runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileOptions {
    /// Confine the operation to this absolute directory of the sandbox: the
    /// path (relative paths are taken from here) must resolve inside it
    /// after following symlinks, else [`FileError::Escapes`]. `None`: any
    /// absolute path.
    pub root: Option<String>,
    /// The most bytes written, read or archived (default 64 MiB); above it
    /// the operation fails with [`FileError::TooLarge`] and writes nothing.
    pub max_bytes: u64,
    /// Permission bits of a written file (e.g. `0o600`); `None` keeps a
    /// replaced file's mode and gives a new one `0o644`.
    pub mode: Option<u32>,
    /// Create missing parent directories of a written file.
    pub mkdirs: bool,
    /// Time limit of the whole operation inside the sandbox (default 120 s).
    pub timeout: Duration,
}

impl Default for FileOptions {
    fn default() -> Self {
        FileOptions {
            root: None,
            max_bytes: DEFAULT_MAX_BYTES,
            mode: None,
            mkdirs: false,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

/// Why a file operation failed. Every message names the sandbox and the path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileError {
    /// The path, its parent directory (without `mkdirs`) or the root does
    /// not exist in the sandbox.
    #[error("sandbox {sandbox}: {path:?} not found: {detail}")]
    NotFound {
        /// Sandbox id.
        sandbox: String,
        /// The path asked for.
        path: String,
        /// What is missing, as the agent said.
        detail: String,
    },
    /// Above `max_bytes`; nothing was written and nothing partial returned.
    #[error(
        "sandbox {sandbox}: {path:?} is too large: {size} bytes, above the cap of {max} bytes"
    )]
    TooLarge {
        /// Sandbox id.
        sandbox: String,
        /// The path asked for (the host directory for `upload_dir`).
        path: String,
        /// Its size in bytes; for input cut off at the cap while streaming,
        /// the bytes seen by then (a lower bound above `max`).
        size: u64,
        /// The cap, `FileOptions::max_bytes`.
        max: u64,
    },
    /// The path resolves outside `FileOptions::root` (through `..`, an
    /// absolute path or a symlink).
    #[error("sandbox {sandbox}: {path:?} escapes the root {root:?}: {detail}")]
    Escapes {
        /// Sandbox id.
        sandbox: String,
        /// The path asked for.
        path: String,
        /// The root it must stay in.
        root: String,
        /// Where it resolves, as the agent said.
        detail: String,
    },
    /// A tar entry that would land outside the target directory (absolute
    /// path, `..`, a link leading out) or of a kind corral does not extract
    /// (device, FIFO, sparse file). Nothing was extracted.
    #[error("sandbox {sandbox}: unsafe tar entry {entry:?} for {path:?}: {reason}")]
    Unsafe {
        /// Sandbox id.
        sandbox: String,
        /// The directory extracted into.
        path: String,
        /// The entry's name in the archive.
        entry: String,
        /// Why it was refused.
        reason: String,
    },
    /// A path rejected before anything ran.
    #[error("sandbox {sandbox}: invalid {field} {path:?}: {reason}")]
    InvalidPath {
        /// Sandbox id.
        sandbox: String,
        /// Which argument: `path`, `dir`, `root` or `host_dir`.
        field: &'static str,
        /// The value given.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An option rejected before anything ran.
    #[error("sandbox {sandbox}: invalid {field} '{value}' for {path:?}: {reason}")]
    InvalidOption {
        /// Sandbox id.
        sandbox: String,
        /// The path the operation was for.
        path: String,
        /// Which field of [`FileOptions`].
        field: &'static str,
        /// The value given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Anything else the agent reported: permission denied, read-only
    /// filesystem, a directory where a file was expected, no space left.
    #[error("sandbox {sandbox}: {path:?}: {message}")]
    Failed {
        /// Sandbox id.
        sandbox: String,
        /// The path asked for.
        path: String,
        /// The agent's message.
        message: String,
    },
    /// The host directory given to `upload_dir` could not be packed.
    #[error("sandbox {sandbox}: cannot pack host directory {}: {message}", path.display())]
    Host {
        /// Sandbox id.
        sandbox: String,
        /// The host directory.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// The operation did not complete: container lost, timeout, OOM, daemon
    /// unavailable, agent error. The failure's message names the path.
    #[error("{0}")]
    Sandbox(Failure),
}

impl FileError {
    /// This error as a typed failure: the inner failure for
    /// [`FileError::Sandbox`], `invalid_spec` for every path, size and
    /// filesystem problem (running it again would fail again).
    pub fn failure(&self) -> Failure {
        match self {
            FileError::Sandbox(f) => f.clone(),
            other => Failure::new(FailureKind::InvalidSpec, other.to_string()),
        }
    }

    /// Whether trying again may succeed (only for some sandbox failures,
    /// such as a lost container).
    pub fn retryable(&self) -> bool {
        matches!(self, FileError::Sandbox(f) if f.retryable())
    }
}

/// One file operation: what the agent is asked, for classifying its answer.
struct Call<'a> {
    sandbox: &'a str,
    /// The agent subcommand.
    op: &'static str,
    path: &'a str,
    opts: &'a FileOptions,
    /// Bytes sent, for a `too large` answer that could not measure them.
    input_len: Option<u64>,
}

impl Call<'_> {
    fn argv(&self, write_flags: bool) -> Vec<String> {
        let mut argv = vec![AGENT_PATH.to_string(), self.op.to_string()];
        if let Some(root) = &self.opts.root {
            argv.extend(["--root".to_string(), root.clone()]);
        }
        argv.extend(["--max".to_string(), self.opts.max_bytes.to_string()]);
        if write_flags {
            if let Some(mode) = self.opts.mode {
                argv.extend(["--mode".to_string(), format!("{mode:o}")]);
            }
            if self.opts.mkdirs {
                argv.push("--mkdirs".to_string());
            }
        }
        // The path may start with '-'.
        argv.extend(["--".to_string(), self.path.to_string()]);
        argv
    }

    fn too_large(&self, size: u64) -> FileError {
        FileError::TooLarge {
            sandbox: self.sandbox.to_string(),
            path: self.path.to_string(),
            size,
            max: self.opts.max_bytes,
        }
    }

    /// Turns the agent's result into the bytes it printed or a typed error.
    fn outcome(&self, r: CommandResult) -> Result<Vec<u8>, FileError> {
        if let Some(mut f) = r.failure {
            f.message = format!("{} (corral-agent {} {:?})", f.message, self.op, self.path);
            return Err(FileError::Sandbox(f));
        }
        if r.exit_code == Some(0) {
            if r.stdout_truncated || r.stdout_total_bytes > self.opts.max_bytes {
                return Err(self.too_large(r.stdout_total_bytes));
            }
            return Ok(r.stdout);
        }
        Err(self.agent_error(&r))
    }

    /// The typed error of a file command that ended without success, from
    /// the report on the last line of its stderr. The report is trusted only
    /// when it decodes strictly and its kind matches the exit status;
    /// otherwise (an agent that does not know the command, a crash, a
    /// signal) the error is generic: `Failed` for status 1, else a retryable
    /// `agent_error`, both quoting stderr.
    fn agent_error(&self, r: &CommandResult) -> FileError {
        // The report must reach us whole, also through the smallest output
        // budget a file command gets.
        const _: () = assert!(MAX_REPORT_LINE as u64 * 2 < SMALL_OUTPUT);
        let (sandbox, path) = (self.sandbox.to_string(), self.path.to_string());
        let report = FileErrorReport::decode(&r.stderr)
            .ok()
            .filter(|rep| r.exit_code == Some(rep.kind.exit_code()));
        let Some(rep) = report else {
            let stderr = String::from_utf8_lossy(&r.stderr).trim().to_string();
            if r.exit_code == Some(1) {
                return FileError::Failed {
                    sandbox,
                    path,
                    message: stderr,
                };
            }
            return self.generic(r, &stderr);
        };
        match (rep.kind, rep.entry, rep.reason) {
            (FileErrorKind::NotFound, ..) => FileError::NotFound {
                sandbox,
                path,
                detail: rep.message,
            },
            (FileErrorKind::TooLarge, ..) => self.too_large(
                rep.size
                    .or(self.input_len)
                    .unwrap_or_else(|| self.opts.max_bytes.saturating_add(1)),
            ),
            (FileErrorKind::Escapes, ..) => FileError::Escapes {
                sandbox,
                path,
                root: self.opts.root.clone().unwrap_or_else(|| "/".to_string()),
                detail: rep.message,
            },
            (FileErrorKind::UnsafeEntry, Some(entry), Some(reason)) => FileError::Unsafe {
                sandbox,
                path,
                entry,
                reason,
            },
            (FileErrorKind::Io, ..) => FileError::Failed {
                sandbox,
                path,
                message: rep.message,
            },
            // Usage errors cannot come from arguments validated here: an
            // agent misbehaving. (An unsafe entry without its fields does
            // not decode; the arm only keeps the match whole.)
            (FileErrorKind::Usage | FileErrorKind::UnsafeEntry, ..) => {
                self.generic(r, &rep.message)
            }
        }
    }

    /// The error of an agent that did not answer as a file command does.
    fn generic(&self, r: &CommandResult, detail: &str) -> FileError {
        FileError::Sandbox(Failure::new(
            FailureKind::AgentError,
            format!(
                "sandbox {}: corral-agent {} {:?} ended with exit code {:?}, signal {:?}: {detail}",
                self.sandbox, self.op, self.path, r.exit_code, r.signal
            ),
        ))
    }
}

/// Checks a path argument and the options before anything runs.
fn validate(
    sandbox: &str,
    field: &'static str,
    path: &str,
    opts: &FileOptions,
) -> Result<(), FileError> {
    let bad_path = |field: &'static str, value: &str, reason: &str| FileError::InvalidPath {
        sandbox: sandbox.to_string(),
        field,
        path: value.to_string(),
        reason: reason.to_string(),
    };
    let bad_option = |field: &'static str, value: String, reason: &str| FileError::InvalidOption {
        sandbox: sandbox.to_string(),
        path: path.to_string(),
        field,
        value,
        reason: reason.to_string(),
    };
    if path.is_empty() {
        return Err(bad_path(field, path, "a path is required"));
    }
    if path.contains('\0') {
        return Err(bad_path(field, path, "must not contain NUL bytes"));
    }
    match &opts.root {
        None if !path.starts_with('/') => {
            return Err(bad_path(
                field,
                path,
                "must be absolute when no root is set",
            ))
        }
        None => {}
        Some(root) if root.is_empty() || root.contains('\0') || !root.starts_with('/') => {
            return Err(bad_path(
                "root",
                root,
                "must be an absolute path without NUL bytes",
            ))
        }
        Some(_) => {}
    }
    if opts.max_bytes == 0 {
        return Err(bad_option("max_bytes", "0".into(), "must be at least 1"));
    }
    if let Some(mode) = opts.mode.filter(|m| *m > 0o7777) {
        return Err(bad_option(
            "mode",
            format!("{mode:o}"),
            "must be permission bits, at most 0o7777",
        ));
    }
    if opts.timeout.is_zero() {
        return Err(bad_option("timeout", "0s".into(), "must be above zero"));
    }
    Ok(())
}

impl Sandbox {
    /// Writes `bytes` to `path` in the sandbox, atomically (a temporary file
    /// in the same directory, then a rename): readers see the old content or
    /// the new, never a mix. Binary-safe; refused above `opts.max_bytes`.
    pub async fn write_file(
        &self,
        path: &str,
        bytes: &[u8],
        opts: &FileOptions,
    ) -> Result<(), FileError> {
        let call = self.call("file-write", "path", path, opts, Some(bytes.len() as u64))?;
        if bytes.len() as u64 > opts.max_bytes {
            return Err(call.too_large(bytes.len() as u64));
        }
        let cmd = CommandSpec::argv(call.argv(true))
            .stdin(bytes)
            .timeout(opts.timeout)
            .max_output(SMALL_OUTPUT);
        call.outcome(self.run(&cmd).await).map(drop)
    }

    /// Reads the regular file `path` from the sandbox. A file above
    /// `opts.max_bytes` is an error naming its size; never a partial read.
    pub async fn read_file(&self, path: &str, opts: &FileOptions) -> Result<Vec<u8>, FileError> {
        let call = self.call("file-read", "path", path, opts, None)?;
        self.fetch(&call).await
    }

    /// Extracts the tar archive `tar` under the directory `dir` (created if
    /// missing). Every entry is checked before anything is written: an
    /// absolute path, a `..` component or a link leading out of `dir` is
    /// [`FileError::Unsafe`] and nothing is extracted. The archive may be at
    /// most `opts.max_bytes` long.
    pub async fn upload_tar(
        &self,
        dir: &str,
        tar: &[u8],
        opts: &FileOptions,
    ) -> Result<(), FileError> {
        let call = self.call("tar-extract", "dir", dir, opts, Some(tar.len() as u64))?;
        if tar.len() as u64 > opts.max_bytes {
            return Err(call.too_large(tar.len() as u64));
        }
        let cmd = CommandSpec::argv(call.argv(false))
            .stdin(tar)
            .timeout(opts.timeout)
            .max_output(SMALL_OUTPUT);
        call.outcome(self.run(&cmd).await).map(drop)
    }

    /// Packs the host directory `host_dir` (recursively, symlinks kept as
    /// links) and extracts it under `dir` in the sandbox, like
    /// [`Sandbox::upload_tar`]. The archive may be at most
    /// `opts.max_bytes` long.
    pub async fn upload_dir(
        &self,
        host_dir: &Path,
        dir: &str,
        opts: &FileOptions,
    ) -> Result<(), FileError> {
        // Checked before the (possibly long) packing.
        self.call("tar-extract", "dir", dir, opts, None)?;
        let host_err = |message: String| FileError::Host {
            sandbox: self.id().to_string(),
            path: host_dir.to_path_buf(),
            message,
        };
        let src = host_dir.to_path_buf();
        let max = opts.max_bytes;
        let packed = tokio::task::spawn_blocking(move || pack_dir(&src, max))
            .await
            .map_err(|e| host_err(format!("the packing task failed: {e}")))?;
        match packed {
            Ok(tar) => self.upload_tar(dir, &tar, opts).await,
            Err(Pack::TooLarge(size)) => Err(FileError::TooLarge {
                sandbox: self.id().to_string(),
                path: host_dir.display().to_string(),
                size,
                max,
            }),
            Err(Pack::Io(e)) => Err(host_err(e.to_string())),
        }
    }

    /// A tar archive of `path` in the sandbox: a file as one entry named by
    /// its file name, a directory as its contents (recursively, names
    /// relative to it, symlinks kept as links; sockets, FIFOs and devices
    /// left out). An archive above `opts.max_bytes` is an error naming its
    /// size.
    pub async fn download_tar(&self, path: &str, opts: &FileOptions) -> Result<Vec<u8>, FileError> {
        let call = self.call("tar-create", "path", path, opts, None)?;
        self.fetch(&call).await
    }

    /// Validates and describes one operation.
    fn call<'a>(
        &'a self,
        op: &'static str,
        field: &'static str,
        path: &'a str,
        opts: &'a FileOptions,
        input_len: Option<u64>,
    ) -> Result<Call<'a>, FileError> {
        validate(self.id(), field, path, opts)?;
        Ok(Call {
            sandbox: self.id(),
            op,
            path,
            opts,
            input_len,
        })
    }

    /// Runs an operation whose answer is on stdout. One byte of budget
    /// above the cap, so an answer cut short can never pass for whole, and
    /// never less than [`SMALL_OUTPUT`]: stderr shares the budget, and a
    /// small cap must not cut the agent's error report.
    async fn fetch(&self, call: &Call<'_>) -> Result<Vec<u8>, FileError> {
        let cmd = CommandSpec::argv(call.argv(false))
            .timeout(call.opts.timeout)
            .max_output(call.opts.max_bytes.saturating_add(1).max(SMALL_OUTPUT));
        call.outcome(self.run(&cmd).await)
    }
}

/// Why packing a host directory stopped.
enum Pack {
    /// The archive passed the cap after this many bytes.
    TooLarge(u64),
    Io(io::Error),
}

/// A `Vec` that refuses to grow past a cap.
struct CappedVec {
    buf: Vec<u8>,
    max: u64,
    /// Bytes offered when the cap was passed.
    over: Option<u64>,
}

impl Write for CappedVec {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let total = self.buf.len() as u64 + data.len() as u64;
        if total > self.max {
            self.over = Some(total);
            return Err(io::Error::other("the archive is above the cap"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A tar of `dir`'s contents, at most `max` bytes.
fn pack_dir(dir: &Path, max: u64) -> Result<Vec<u8>, Pack> {
    let meta = std::fs::metadata(dir).map_err(Pack::Io)?;
    if !meta.is_dir() {
        return Err(Pack::Io(io::Error::other("not a directory")));
    }
    let mut b = tar::Builder::new(CappedVec {
        buf: Vec::new(),
        max,
        over: None,
    });
    b.follow_symlinks(false);
    let packed = b.append_dir_all(".", dir).and_then(|()| b.finish());
    let over = b.get_ref().over;
    match (packed, over) {
        (_, Some(size)) => Err(Pack::TooLarge(size)),
        (Err(e), None) => Err(Pack::Io(e)),
        (Ok(()), None) => b.into_inner().map(|v| v.buf).map_err(Pack::Io),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_core::file_error::REPORT_PREFIX;

    fn opts() -> FileOptions {
        FileOptions::default()
    }

    fn call<'a>(op: &'static str, opts: &'a FileOptions) -> Call<'a> {
        Call {
            sandbox: "sb-1",
            op,
            path: "/w/f",
            opts,
            input_len: None,
        }
    }

    fn exited(code: i32, stdout: &[u8], stderr: &str) -> CommandResult {
        CommandResult {
            exit_code: Some(code),
            stdout: stdout.to_vec(),
            stdout_total_bytes: stdout.len() as u64,
            stderr: stderr.as_bytes().to_vec(),
            ..CommandResult::default()
        }
    }

    #[test]
    fn argv_puts_flags_before_the_path() {
        let o = FileOptions {
            root: Some("/w".into()),
            max_bytes: 10,
            mode: Some(0o640),
            mkdirs: true,
            ..opts()
        };
        let c = Call {
            path: "-odd",
            ..call("file-write", &o)
        };
        assert_eq!(
            c.argv(true),
            [
                AGENT_PATH,
                "file-write",
                "--root",
                "/w",
                "--max",
                "10",
                "--mode",
                "640",
                "--mkdirs",
                "--",
                "-odd"
            ]
        );
        assert!(!c.argv(false).contains(&"--mkdirs".to_string()));
    }

    /// A failed command whose stderr ends with `report`.
    fn reported(report: &FileErrorReport) -> CommandResult {
        exited(
            report.kind.exit_code(),
            b"",
            &format!("{}\n", report.encode()),
        )
    }

    fn report(kind: FileErrorKind, message: &str) -> FileErrorReport {
        FileErrorReport::new(kind, message)
    }

    #[test]
    fn reports_become_typed_errors() {
        let o = FileOptions {
            root: Some("/w".into()),
            ..opts()
        };
        let c = call("file-read", &o);
        assert_eq!(c.outcome(exited(0, b"\0\xff", "")), Ok(b"\0\xff".to_vec()));

        let rep = FileErrorReport {
            path: Some("/w/f".into()),
            ..report(FileErrorKind::NotFound, "not found: \"/w/f\" (read: x)")
        };
        let e = c.outcome(reported(&rep)).expect_err("not found");
        assert!(
            matches!(&e, FileError::NotFound { path, detail, .. } if path == "/w/f" && detail == "not found: \"/w/f\" (read: x)"),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("sb-1") && e.to_string().contains("/w/f"),
            "{e}"
        );

        // The size comes from its field; the message is not read.
        let rep = FileErrorReport {
            path: Some("/w/f".into()),
            size: Some(2048),
            limit: Some(1024),
            ..report(FileErrorKind::TooLarge, "too large: \"/w/ is 9 bytes\" ...")
        };
        let e = c.outcome(reported(&rep)).expect_err("too large");
        assert!(
            matches!(e, FileError::TooLarge { size: 2048, max, .. } if max == DEFAULT_MAX_BYTES),
            "{e:?}"
        );
        // Without a size: the bytes sent, else just above the cap.
        let unsized_rep = FileErrorReport { size: None, ..rep };
        let e = c.outcome(reported(&unsized_rep)).expect_err("too large");
        assert!(
            matches!(e, FileError::TooLarge { size, .. } if size == DEFAULT_MAX_BYTES + 1),
            "{e:?}"
        );
        let sent = Call {
            input_len: Some(DEFAULT_MAX_BYTES + 7),
            ..call("file-write", &o)
        };
        let e = sent.outcome(reported(&unsized_rep)).expect_err("too large");
        assert!(
            matches!(e, FileError::TooLarge { size, .. } if size == DEFAULT_MAX_BYTES + 7),
            "{e:?}"
        );

        let rep = FileErrorReport {
            path: Some("../x".into()),
            root: Some("/real/w".into()),
            ..report(
                FileErrorKind::Escapes,
                "escapes root: \"../x\" resolves to \"/x\", outside the root \"/real/w\"",
            )
        };
        let e = c.outcome(reported(&rep)).expect_err("escapes");
        // The root is the one the caller gave, not the agent's canonical one.
        assert!(
            matches!(&e, FileError::Escapes { root, detail, .. } if root == "/w" && detail.contains("\"/x\"")),
            "{e:?}"
        );

        let rep = FileErrorReport {
            entry: Some("../e\"vil\nx".into()),
            reason: Some("a '..' component".into()),
            ..report(FileErrorKind::UnsafeEntry, "unsafe entry ...")
        };
        let e = c.outcome(reported(&rep)).expect_err("unsafe");
        assert!(
            matches!(&e, FileError::Unsafe { entry, reason, .. } if entry == "../e\"vil\nx" && reason == "a '..' component"),
            "{e:?}"
        );

        let rep = report(
            FileErrorKind::Io,
            "cannot write \"/w/f\": Read-only file system (os error 30)",
        );
        let e = c.outcome(reported(&rep)).expect_err("io");
        assert!(
            matches!(&e, FileError::Failed { message, .. } if message.contains("Read-only")),
            "{e:?}"
        );
        assert_eq!(e.failure().kind, FailureKind::InvalidSpec);
        assert!(!e.retryable());

        // Usage errors cannot come from validated arguments: the agent is
        // at fault.
        let rep = report(FileErrorKind::Usage, "unexpected argument '--x'");
        let e = c.outcome(reported(&rep)).expect_err("usage");
        assert_eq!(e.failure().kind, FailureKind::AgentError);
        assert!(e.to_string().contains("'--x'"), "{e}");

        // An agent that does not know the command.
        let e = c
            .outcome(exited(
                2,
                b"",
                "corral-agent: unknown subcommand 'file-read'\nusage: ...",
            ))
            .expect_err("2");
        assert_eq!(e.failure().kind, FailureKind::AgentError);
    }

    #[test]
    fn a_missing_or_forged_report_is_the_generic_error() {
        let o = opts();
        let c = call("file-read", &o);
        let good = FileErrorReport {
            path: Some("/w/f".into()),
            ..report(FileErrorKind::NotFound, "not found: \"/w/f\"")
        };
        let p = REPORT_PREFIX;
        let garbage = [
            String::new(),
            // The old English line is no longer read.
            "corral-agent: not found: \"/w/f\"".to_string(),
            format!("{p}{{\"kind\":\"not_found\",\"message\":\"m\",\"path\":\"/w/f\""),
            format!("{p}{{\"kind\":\"segfault\",\"message\":\"m\"}}"),
            format!("{p}{{\"kind\":\"not_found\",\"message\":\"m\"}}"),
            format!("{p}{{\"kind\":\"unsafe_entry\",\"message\":\"m\",\"entry\":\"e\"}}"),
            format!("{p}{{\"kind\":\"not_found\",\"message\":\"m\",\"path\":\"/w/f\",\"x\":1}}"),
            // A good report that is not the last line.
            format!("{}\nsomething else", good.encode()),
            // Oversized: padding JSON would accept, and a line without end.
            format!("{}{}", good.encode(), " ".repeat(MAX_REPORT_LINE)),
            "\u{1}".repeat(1 << 20),
            format!("{p}{}", "\u{ffff}\"[{".repeat(100_000)),
        ];
        for stderr in &garbage {
            for code in [3, 4, 5, 2, 9, 255] {
                let e = c
                    .outcome(exited(code, b"", stderr))
                    .expect_err("non-zero exit");
                assert_eq!(
                    e.failure().kind,
                    FailureKind::AgentError,
                    "code {code}, stderr {:?}: {e:?}",
                    &stderr[..stderr.len().min(80)]
                );
                assert!(e.retryable());
            }
            // Status 1 stays a plain failure, quoting stderr.
            let e = c.outcome(exited(1, b"", stderr)).expect_err("1");
            assert!(
                matches!(&e, FileError::Failed { message, .. } if *message == stderr.trim()),
                "{e:?}"
            );
        }
        // A valid report whose kind disagrees with the status is not trusted.
        let e = c
            .outcome(exited(5, b"", &good.encode()))
            .expect_err("mismatch");
        assert_eq!(e.failure().kind, FailureKind::AgentError);
        // Killed by a signal, with a good report: still generic.
        let mut r = exited(3, b"", &good.encode());
        r.exit_code = None;
        r.signal = Some(9);
        let e = c.outcome(r).expect_err("signal");
        assert_eq!(e.failure().kind, FailureKind::AgentError);
        // And the good report, for contrast.
        let e = c.outcome(exited(3, b"", &good.encode())).expect_err("3");
        assert!(matches!(e, FileError::NotFound { .. }), "{e:?}");
    }

    #[test]
    fn sandbox_failures_keep_their_kind_and_name_the_path() {
        let o = opts();
        let lost = CommandResult::failed(
            Failure::new(FailureKind::ContainerLost, "sandbox sb-1: container gone"),
            Duration::ZERO,
        );
        let e = call("file-write", &o).outcome(lost).expect_err("lost");
        assert_eq!(e.failure().kind, FailureKind::ContainerLost);
        assert!(e.retryable());
        assert!(e.to_string().contains("/w/f"), "{e}");
    }

    #[test]
    fn a_truncated_answer_is_too_large_never_short() {
        let o = FileOptions {
            max_bytes: 4,
            ..opts()
        };
        let mut r = exited(0, b"abcd", "");
        r.stdout_truncated = true;
        r.stdout_total_bytes = 9;
        let e = call("file-read", &o).outcome(r).expect_err("truncated");
        assert!(
            matches!(
                e,
                FileError::TooLarge {
                    size: 9,
                    max: 4,
                    ..
                }
            ),
            "{e:?}"
        );
    }

    #[test]
    fn validation_names_the_field() {
        let err = |path: &str, o: &FileOptions| validate("sb", "path", path, o).expect_err(path);
        let o = opts();
        assert!(matches!(
            err("", &o),
            FileError::InvalidPath { field: "path", .. }
        ));
        assert!(matches!(
            err("/a\0b", &o),
            FileError::InvalidPath { field: "path", .. }
        ));
        assert!(matches!(
            err("rel", &o),
            FileError::InvalidPath { field: "path", .. }
        ));
        let rooted = FileOptions {
            root: Some("w".into()),
            ..opts()
        };
        assert!(matches!(
            err("rel", &rooted),
            FileError::InvalidPath { field: "root", .. }
        ));
        let zero = FileOptions {
            max_bytes: 0,
            ..opts()
        };
        let e = err("/a", &zero);
        assert!(
            matches!(
                e,
                FileError::InvalidOption {
                    field: "max_bytes",
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("max_bytes"), "{e}");
        let mode = FileOptions {
            mode: Some(0o17777),
            ..opts()
        };
        assert!(matches!(
            err("/a", &mode),
            FileError::InvalidOption { field: "mode", .. }
        ));
        assert_eq!(err("", &o).failure().kind, FailureKind::InvalidSpec);
        let ok = FileOptions {
            root: Some("/w".into()),
            ..opts()
        };
        assert_eq!(validate("sb", "path", "rel/x", &ok), Ok(()));
    }
}
