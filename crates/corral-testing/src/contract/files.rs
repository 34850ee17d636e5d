//! Contract cases for files: binary-safe round trips, tmpfs and a
//! read-only root, caps, missing paths, root escapes, modes, listings, and
//! a sandbox lost mid-use.

use std::time::Duration;

use corral::{CommandSpec, FailureKind, FileError, FileOptions};
use corral_core::file_error::{FileErrorKind, FileErrorReport};

use super::{out, text, Case};

pub(super) fn opts() -> FileOptions {
    FileOptions::default()
}

pub(super) fn rooted(root: &str) -> FileOptions {
    FileOptions {
        root: Some(root.to_string()),
        ..FileOptions::default()
    }
}

/// Deterministic pseudo-random bytes (xorshift64).
pub(super) fn random_bytes(n: usize, mut seed: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        v.extend_from_slice(&seed.to_le_bytes());
    }
    v.truncate(n);
    v
}

/// Every byte value and 5 MB of random bytes go in and come back
/// exactly, and are really on disk; empty files and overwrites work.
pub async fn files_round_trip_every_byte_value_and_a_large_random_file(c: &Case) {
    let sb = c.create(&c.spec()).await;

    let all: Vec<u8> = (0..=255u8).collect();
    sb.write_file("/root/all.bin", &all, &opts())
        .await
        .expect("write all bytes");
    assert_eq!(
        sb.read_file("/root/all.bin", &opts()).await.expect("read"),
        all
    );
    // Really on disk, not an echo of our own tool.
    assert_eq!(out(&sb, "wc -c < /root/all.bin").await.trim(), "256");
    assert_eq!(
        out(&sb, "od -An -tx1 -N4 -j254 /root/all.bin").await.trim(),
        "fe ff"
    );

    let big = random_bytes(5 << 20, 0x9e37_79b9_7f4a_7c15);
    sb.write_file("/root/big.bin", &big, &opts())
        .await
        .expect("write 5 MB");
    let back = sb
        .read_file("/root/big.bin", &opts())
        .await
        .expect("read 5 MB");
    assert_eq!(back.len(), big.len());
    assert!(back == big, "5 MB round trip differs");
    assert_eq!(
        out(&sb, "wc -c < /root/big.bin").await.trim(),
        (5 << 20).to_string()
    );

    // An empty file is a file too; overwriting replaces the content whole.
    sb.write_file("/root/all.bin", b"", &opts())
        .await
        .expect("write empty");
    assert_eq!(
        sb.read_file("/root/all.bin", &opts()).await.expect("read"),
        b""
    );

    sb.destroy().await.expect("destroy");
}

/// `/tmp` is a tmpfs that takes files even under a read-only root,
/// whose refusal is typed with the file system's reason.
pub async fn files_tmpfs_works_and_a_read_only_root_still_takes_tmp(c: &Case) {
    let mut spec = c.spec();
    spec.security.read_only_root = true;
    let sb = c.create(&spec).await;

    assert!(out(&sb, "grep ' /tmp ' /proc/mounts")
        .await
        .contains("tmpfs"));
    sb.write_file("/tmp/note.txt", b"on tmpfs\n", &opts())
        .await
        .expect("write /tmp");
    assert_eq!(
        sb.read_file("/tmp/note.txt", &opts()).await.expect("read"),
        b"on tmpfs\n"
    );
    assert_eq!(out(&sb, "cat /tmp/note.txt").await, "on tmpfs\n");

    // The read-only root refuses, with the filesystem's reason.
    let e = sb
        .write_file("/root/x", b"x", &opts())
        .await
        .expect_err("read-only root");
    match &e {
        FileError::Failed { message, path, .. } => {
            assert_eq!(path, "/root/x");
            assert!(message.contains("Read-only file system"), "{e}");
        }
        other => panic!("expected Failed, got {other:?}"),
    }
    assert!(e.to_string().contains(sb.id()), "{e}");
    assert_eq!(e.failure().kind, FailureKind::InvalidSpec);

    sb.destroy().await.expect("destroy");
}

/// A read, a write or an archive above the cap is refused `too_large`
/// naming both sizes, and nothing is written (the agent checks too).
pub async fn files_too_large_is_refused_with_nothing_written(c: &Case) {
    let sb = c.create(&c.spec()).await;
    let small = FileOptions {
        max_bytes: 1000,
        ..opts()
    };

    sb.write_file("/tmp/two-k", &[b'x'; 2000], &opts())
        .await
        .expect("write");
    let e = sb
        .read_file("/tmp/two-k", &small)
        .await
        .expect_err("read above the cap");
    assert!(
        matches!(&e, FileError::TooLarge { size: 2000, max: 1000, path, .. } if path == "/tmp/two-k"),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("2000") && e.to_string().contains("1000"),
        "{e}"
    );
    assert_eq!(e.failure().kind, FailureKind::InvalidSpec);
    // Exactly the cap passes.
    let at_cap = FileOptions {
        max_bytes: 2000,
        ..opts()
    };
    assert_eq!(
        sb.read_file("/tmp/two-k", &at_cap)
            .await
            .expect("at the cap")
            .len(),
        2000
    );

    let e = sb
        .write_file("/tmp/big", &[0u8; 1001], &small)
        .await
        .expect_err("write above the cap");
    assert!(
        matches!(
            e,
            FileError::TooLarge {
                size: 1001,
                max: 1000,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        out(&sb, "test -e /tmp/big && echo yes || echo no").await,
        "no\n"
    );

    // The agent enforces the cap itself too: nothing written, no temp file.
    let agent = CommandSpec::argv([
        corral_core::protocol::AGENT_PATH,
        "file-write",
        "--max",
        "10",
        "/tmp/agent-big",
    ])
    .stdin(vec![1u8; 20])
    .timeout(Duration::from_secs(30));
    let r = sb.run(&agent).await;
    assert_eq!(r.exit_code, Some(4), "{}", text(&r.stderr));
    let report =
        FileErrorReport::decode(&r.stderr).unwrap_or_else(|e| panic!("{e}: {}", text(&r.stderr)));
    assert_eq!(
        (report.kind, report.limit, report.size),
        (FileErrorKind::TooLarge, Some(10), None),
        "{report:?}"
    );
    assert_eq!(
        out(&sb, "ls -A /tmp | grep agent-big || echo none").await,
        "none\n"
    );

    // A tree whose archive is above the cap is refused before any byte.
    sb.write_file(
        "/tmp/tree/f",
        &[b'y'; 900],
        &FileOptions {
            mkdirs: true,
            ..opts()
        },
    )
    .await
    .expect("write");
    let e = sb
        .download_tar("/tmp/tree", &small)
        .await
        .expect_err("archive above the cap");
    assert!(
        matches!(e, FileError::TooLarge { size, max: 1000, .. } if size > 1000),
        "{e:?}"
    );

    sb.destroy().await.expect("destroy");
}

/// Missing paths are `not_found` naming them; bad paths and caps are
/// refused on the host before anything runs.
pub async fn files_missing_paths_are_not_found_and_bad_input_is_refused(c: &Case) {
    let sb = c.create(&c.spec()).await;

    let e = sb
        .read_file("/nonexistent/file", &opts())
        .await
        .expect_err("missing");
    assert!(
        matches!(&e, FileError::NotFound { path, .. } if path == "/nonexistent/file"),
        "{e:?}"
    );
    assert!(e.to_string().contains(sb.id()), "{e}");
    let e = sb
        .write_file("/no/such/dir/f", b"x", &opts())
        .await
        .expect_err("no parent");
    assert!(
        matches!(&e, FileError::NotFound { detail, .. } if detail.contains("/no/such/dir")),
        "{e:?}"
    );
    let e = sb
        .download_tar("/nonexistent", &opts())
        .await
        .expect_err("missing tree");
    assert!(matches!(e, FileError::NotFound { .. }), "{e:?}");
    let e = sb
        .read_file("/tmp", &opts())
        .await
        .expect_err("a directory");
    assert!(
        matches!(&e, FileError::Failed { message, .. } if message.contains("is a directory")),
        "{e:?}"
    );

    let e = sb.read_file("", &opts()).await.expect_err("empty");
    assert!(
        matches!(e, FileError::InvalidPath { field: "path", .. }),
        "{e:?}"
    );
    let e = sb
        .write_file("/tmp/a\0b", b"", &opts())
        .await
        .expect_err("NUL");
    assert!(
        matches!(e, FileError::InvalidPath { field: "path", .. }),
        "{e:?}"
    );
    let zero = FileOptions {
        max_bytes: 0,
        ..opts()
    };
    let e = sb.read_file("/tmp/x", &zero).await.expect_err("zero cap");
    assert!(e.to_string().contains("max_bytes"), "{e}");

    sb.destroy().await.expect("destroy");
}

/// With a root, neither `..` nor a symlink reaches outside it, for
/// reads, writes and archives.
pub async fn files_paths_cannot_escape_the_root(c: &Case) {
    let sb = c.create(&c.spec()).await;
    out(
        &sb,
        "mkdir -p /tmp/ws/sub && ln -s /etc /tmp/ws/etc && ln -s sub /tmp/ws/alias",
    )
    .await;
    let ws = rooted("/tmp/ws");

    // Inside is fine, relative or absolute, through an inside symlink too.
    sb.write_file("sub/ok.txt", b"ok", &ws)
        .await
        .expect("relative inside");
    assert_eq!(
        sb.read_file("/tmp/ws/alias/ok.txt", &ws)
            .await
            .expect("via alias"),
        b"ok"
    );

    let e = sb
        .write_file("../evil", b"x", &ws)
        .await
        .expect_err("dot dot");
    assert!(
        matches!(&e, FileError::Escapes { path, root, .. } if path == "../evil" && root == "/tmp/ws"),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("/tmp/ws") && e.to_string().contains(sb.id()),
        "{e}"
    );
    assert_eq!(
        out(&sb, "test -e /tmp/evil && echo yes || echo no").await,
        "no\n"
    );

    let e = sb
        .read_file("etc/passwd", &ws)
        .await
        .expect_err("symlink to /etc");
    assert!(
        matches!(&e, FileError::Escapes { detail, .. } if detail.contains("/etc/passwd")),
        "{e:?}"
    );
    let e = sb
        .write_file("etc/evil", b"x", &ws)
        .await
        .expect_err("write through symlink");
    assert!(matches!(e, FileError::Escapes { .. }), "{e:?}");
    assert_eq!(
        out(&sb, "test -e /etc/evil && echo yes || echo no").await,
        "no\n"
    );
    let e = sb
        .read_file("/etc/passwd", &ws)
        .await
        .expect_err("absolute outside");
    assert!(matches!(e, FileError::Escapes { .. }), "{e:?}");
    let e = sb
        .download_tar("..", &ws)
        .await
        .expect_err("tar of the parent");
    assert!(matches!(e, FileError::Escapes { .. }), "{e:?}");
    assert_eq!(e.failure().kind, FailureKind::InvalidSpec);

    sb.destroy().await.expect("destroy");
}

/// A write's mode is applied, a rewrite keeps the file's, a new file
/// gets 644.
pub async fn files_mode_is_honoured_and_kept(c: &Case) {
    let sb = c.create(&c.spec()).await;

    let private = FileOptions {
        mode: Some(0o600),
        ..opts()
    };
    sb.write_file("/tmp/secret", b"s", &private)
        .await
        .expect("write 600");
    assert_eq!(out(&sb, "stat -c %a /tmp/secret").await, "600\n");
    let exec = FileOptions {
        mode: Some(0o755),
        ..opts()
    };
    sb.write_file("/root/run.sh", b"#!/bin/sh\necho ran\n", &exec)
        .await
        .expect("write 755");
    assert_eq!(out(&sb, "stat -c %a /root/run.sh").await, "755\n");
    assert_eq!(out(&sb, "/root/run.sh").await, "ran\n");
    // Rewriting without a mode keeps the file's; a new file gets 644.
    sb.write_file("/tmp/secret", b"t", &opts())
        .await
        .expect("rewrite");
    assert_eq!(out(&sb, "stat -c %a /tmp/secret").await, "600\n");
    sb.write_file("/tmp/plain", b"p", &opts())
        .await
        .expect("new");
    assert_eq!(out(&sb, "stat -c %a /tmp/plain").await, "644\n");

    sb.destroy().await.expect("destroy");
}

/// Listings are sorted, with kinds, sizes, modes and link targets, odd
/// names intact; their errors are typed.
pub async fn files_directories_list_with_types_sizes_modes_and_targets(c: &Case) {
    use corral::EntryKind;

    let sb = c.create(&c.spec()).await;
    out(
        &sb,
        "mkdir -p /w/sub && printf hello > /w/b.txt && chmod 640 /w/b.txt \
         && chmod 750 /w/sub && ln -s b.txt /w/link && ln -s /nowhere /w/dangling \
         && mkfifo /w/fifo",
    )
    .await;
    // A name with a newline and a tab survives the trip.
    sb.write_file("/w/odd\nname\t", b"12", &opts())
        .await
        .expect("write odd name");

    let got = sb.list_dir("/w", &opts()).await.expect("list");
    let view: Vec<(&str, EntryKind, u64, u32, Option<&str>)> = got
        .iter()
        .map(|e| (e.name.as_str(), e.kind, e.size, e.mode, e.target.as_deref()))
        .collect();
    let sub_size = got.iter().find(|e| e.name == "sub").map_or(0, |e| e.size);
    assert_eq!(
        view,
        [
            ("b.txt", EntryKind::File, 5, 0o640, None),
            ("dangling", EntryKind::Symlink, 8, 0o777, Some("/nowhere")),
            ("fifo", EntryKind::Other, 0, got[2].mode, None),
            ("link", EntryKind::Symlink, 5, 0o777, Some("b.txt")),
            ("odd\nname\t", EntryKind::File, 2, 0o644, None),
            ("sub", EntryKind::Dir, sub_size, 0o750, None),
        ]
    );
    assert!(sb
        .list_dir("/w/sub", &opts())
        .await
        .expect("empty")
        .is_empty());
    // Relative to a root, and through a symlink that stays inside it.
    out(&sb, "ln -s sub /w/sublink && touch /w/sub/inner").await;
    let inner = sb.list_dir("sublink", &rooted("/w")).await.expect("rooted");
    assert_eq!(
        inner.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
        ["inner"]
    );

    // Errors are typed and name the path.
    let e = sb.list_dir("/w/none", &opts()).await.expect_err("missing");
    assert!(
        matches!(&e, FileError::NotFound { path, .. } if path == "/w/none"),
        "{e:?}"
    );
    let e = sb.list_dir("/w/b.txt", &opts()).await.expect_err("a file");
    assert!(
        matches!(&e, FileError::Failed { message, .. } if message.contains("not a directory")),
        "{e:?}"
    );
    let e = sb.list_dir("..", &rooted("/w")).await.expect_err("escape");
    assert!(matches!(e, FileError::Escapes { .. }), "{e:?}");
    let e = sb.list_dir("rel", &opts()).await.expect_err("relative");
    assert!(
        matches!(e, FileError::InvalidPath { field: "path", .. }),
        "{e:?}"
    );
    let small = FileOptions {
        max_bytes: 16,
        ..opts()
    };
    let e = sb.list_dir("/w", &small).await.expect_err("cap");
    assert!(matches!(e, FileError::TooLarge { max: 16, .. }), "{e:?}");

    sb.destroy().await.expect("destroy");
}

/// File operations on a sandbox removed out of band fail
/// `container_lost`, naming the sandbox and the path.
pub async fn files_on_a_sandbox_removed_out_of_band_fail_typed(c: &Case) {
    let sb = c.create(&c.spec()).await;
    sb.write_file("/tmp/f", b"before", &opts())
        .await
        .expect("write");

    c.remove_out_of_band(&sb).await;
    let e = sb
        .write_file("/tmp/f", b"after", &opts())
        .await
        .expect_err("lost");
    match &e {
        FileError::Sandbox(f) => {
            assert_eq!(f.kind, FailureKind::ContainerLost, "{f}");
            assert!(
                f.message.contains(sb.id()) && f.message.contains("/tmp/f"),
                "{f}"
            );
        }
        other => panic!("expected Sandbox, got {other:?}"),
    }
    assert_eq!(e.failure().kind, FailureKind::ContainerLost);
    assert!(e.retryable());
    let e = sb
        .read_file("/tmp/f", &opts())
        .await
        .expect_err("still lost");
    assert_eq!(e.failure().kind, FailureKind::ContainerLost);

    sb.destroy().await.expect("destroy");
}
