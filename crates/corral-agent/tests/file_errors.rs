//! The file commands' typed errors, as corral receives them: the static
//! agent run as an ordinary command inside a hardened container, its stderr
//! decoded with core's strict decoder.
//!
//! Each test makes its own container (removed by a guard even on failure)
//! and skips only when no Docker daemon answers.

// Each test binary uses its own part of the shared harness.
#[allow(dead_code)]
mod support;

use corral_core::file_error::{FileErrorKind, FileErrorReport, REPORT_PREFIX};
use corral_core::protocol::{Frame, FrameKind};
use support::{docker_available, req, Client, Opts, Outcome, Sandbox, AGENT_IN_CONTAINER};

macro_rules! need_docker {
    () => {
        if !docker_available() {
            return;
        }
    };
}

/// Runs the agent with `args`, feeding `stdin` when given.
fn agent(c: &mut Client, args: &[&str], stdin: Option<&[u8]>) -> Outcome {
    let argv: Vec<&str> = std::iter::once(AGENT_IN_CONTAINER)
        .chain(args.iter().copied())
        .collect();
    let mut r = req(&argv);
    let id = c.fresh_id();
    r.stdin = stdin.is_some();
    c.exec(id, &r);
    if let Some(bytes) = stdin {
        c.send(&Frame::new(FrameKind::Stdin, id, bytes.to_vec()));
        c.send(&Frame::new(FrameKind::StdinEof, id, Vec::new()));
    }
    c.wait(id)
}

/// The report of a failed file command, after checking that it is the only
/// stderr line and that the exit code is the one its kind has always had.
fn report(o: &Outcome, code: i32) -> FileErrorReport {
    assert_eq!(o.report().exit_code, Some(code), "{o:?}");
    let stderr = [o.stderr.clone(), o.stderr_tail.clone()].concat();
    let text = String::from_utf8_lossy(&stderr);
    assert!(
        text.starts_with(REPORT_PREFIX) && text.ends_with('\n') && text.lines().count() == 1,
        "stderr is not one report line: {text:?}"
    );
    FileErrorReport::decode(&stderr).unwrap_or_else(|e| panic!("{e}: {text:?}"))
}

/// A tar with one regular entry whose name is written raw, so a hostile
/// one survives (the tar crate refuses to build it otherwise).
fn raw_tar(name: &str) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_size(1);
    h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    h.set_cksum();
    b.append(&h, &b"x"[..]).expect("append");
    b.into_inner().expect("finish")
}

#[test]
fn file_commands_report_typed_errors() {
    need_docker!();
    let sb = Sandbox::start(Opts::default());
    let mut c = sb.client();
    let o = c.sh("mkdir -p /w/d && printf 0123456789 > /w/ten");
    assert_eq!(o.report().exit_code, Some(0), "{o:?}");

    let r = report(&agent(&mut c, &["file-read", "/w/missing"], None), 3);
    assert_eq!(r.kind, FileErrorKind::NotFound);
    assert_eq!(r.path.as_deref(), Some("/w/missing"));
    assert!(r.message.contains("\"/w/missing\""), "{r:?}");

    // A missing parent without --mkdirs names the directory.
    let o = agent(&mut c, &["file-write", "/w/no/f"], Some(b"x"));
    let r = report(&o, 3);
    assert_eq!(
        (r.kind, r.path.as_deref()),
        (FileErrorKind::NotFound, Some("/w/no"))
    );
    assert!(r.message.contains("--mkdirs"), "{r:?}");

    // A file of known size: size and cap.
    let o = agent(&mut c, &["file-read", "--max", "4", "/w/ten"], None);
    assert!(o.stdout.is_empty(), "sent part of a refused file");
    let r = report(&o, 4);
    assert_eq!(
        (r.kind, r.path.as_deref(), r.size, r.limit),
        (FileErrorKind::TooLarge, Some("/w/ten"), Some(10), Some(4))
    );
    // Streamed input: cut off at the cap, its size unknown.
    let o = agent(
        &mut c,
        &["file-write", "--max", "3", "/w/new"],
        Some(b"abcd"),
    );
    let r = report(&o, 4);
    assert_eq!(
        (r.kind, r.path.as_deref(), r.size, r.limit),
        (FileErrorKind::TooLarge, Some("/w/new"), None, Some(3))
    );
    assert_eq!(c.sh("test -e /w/new").report().exit_code, Some(1));

    // Out of the root through `..` and through a symlink.
    let r = report(
        &agent(&mut c, &["file-read", "--root", "/w/d", "../ten"], None),
        5,
    );
    assert_eq!(
        (r.kind, r.path.as_deref(), r.root.as_deref()),
        (FileErrorKind::Escapes, Some("../ten"), Some("/w/d"))
    );
    assert_eq!(c.sh("ln -s /etc /w/d/etc").report().exit_code, Some(0));
    let r = report(
        &agent(&mut c, &["file-read", "--root", "/w/d", "etc/passwd"], None),
        5,
    );
    assert_eq!(
        (r.kind, r.path.as_deref(), r.root.as_deref()),
        (FileErrorKind::Escapes, Some("etc/passwd"), Some("/w/d"))
    );
    assert!(r.message.contains("\"/etc/passwd\""), "{r:?}");

    // An archive climbing out: refused whole, nothing written.
    let o = agent(&mut c, &["tar-extract", "/w/x"], Some(&raw_tar("../evil")));
    let r = report(&o, 5);
    assert_eq!(
        (r.kind, r.entry.as_deref(), r.reason.as_deref()),
        (
            FileErrorKind::UnsafeEntry,
            Some("../evil"),
            Some("a '..' component")
        )
    );
    assert_eq!(
        c.sh("test -e /w/evil || test -e /w/x").report().exit_code,
        Some(1)
    );

    // Bad arguments are reported the same way.
    let r = report(&agent(&mut c, &["file-read", "/a", "--bogus"], None), 2);
    assert_eq!(r.kind, FileErrorKind::Usage);
    assert!(r.message.contains("'--bogus'"), "{r:?}");

    // A plain IO failure.
    let r = report(&agent(&mut c, &["file-read", "/w/d"], None), 1);
    assert_eq!(r.kind, FileErrorKind::Io);
    assert!(r.message.contains("is a directory"), "{r:?}");
}

#[test]
fn a_hostile_path_cannot_break_the_report_line() {
    need_docker!();
    let sb = Sandbox::start(Opts::default());
    let mut c = sb.client();
    // A newline and a fake report inside the path: still one line, and the
    // path comes back exactly.
    let path = format!("/w/a\n{REPORT_PREFIX}{{\"kind\":\"io\",\"message\":\"forged\"}}");
    let r = report(&agent(&mut c, &["file-read", &path], None), 3);
    assert_eq!(
        (r.kind, r.path.as_deref()),
        (FileErrorKind::NotFound, Some(path.as_str()))
    );
    // A path whose escaped form is longer than the line: clipped, still
    // decodable.
    let long = format!("/w{}", format!("/{}", "\u{1}".repeat(200)).repeat(15));
    let r = report(&agent(&mut c, &["file-read", &long], None), 3);
    assert_eq!(r.kind, FileErrorKind::NotFound);
    let got = r.path.expect("a path");
    assert!(
        got.ends_with('…') && long.starts_with(got.trim_end_matches('…')),
        "{got:?}"
    );
}
