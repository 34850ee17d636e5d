//! Files in and out of sandboxes against the real daemon: binary-safe round
//! trips, tmpfs and read-only roots, `FROM scratch`, caps, root escapes,
//! tar trees, hostile archives, modes and a container lost mid-use.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{backend, docker, Guard, BUSYBOX, SCRATCH};
use corral::{FileError, FileOptions, Sandbox};
use corral_core::file_error::{FileErrorKind, FileErrorReport};
use corral_core::{CommandSpec, FailureKind};

fn sh(script: &str) -> CommandSpec {
    CommandSpec::shell(script).timeout(Duration::from_secs(60))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

/// What a shell in the sandbox prints for `script`.
async fn out(sb: &Sandbox, script: &str) -> String {
    let r = sb.run(&sh(script)).await;
    assert_eq!(r.failure, None, "{script}");
    text(&r.stdout)
}

fn opts() -> FileOptions {
    FileOptions::default()
}

fn rooted(root: &str) -> FileOptions {
    FileOptions {
        root: Some(root.to_string()),
        ..FileOptions::default()
    }
}

/// Deterministic pseudo-random bytes (xorshift64).
fn random_bytes(n: usize, mut seed: u64) -> Vec<u8> {
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

/// A host directory removed when dropped.
struct HostDir(PathBuf);

impl HostDir {
    fn new(tag: &str) -> HostDir {
        let p =
            std::env::temp_dir().join(format!("corral-files-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create host dir");
        HostDir(p)
    }
}

impl Drop for HostDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Regular files of a tar: name (without a leading `./`) to contents.
fn tar_files(tar: &[u8]) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut archive = tar::Archive::new(tar);
    for entry in archive.entries().expect("entries") {
        let mut entry = entry.expect("entry");
        if entry.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let name = entry.path().expect("path").display().to_string();
        let name = name.trim_start_matches("./").to_string();
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut data).expect("read entry");
        files.insert(name, data);
    }
    files
}

/// A tar whose entry names are written raw, so hostile ones survive.
fn raw_tar(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_cksum();
        b.append(&h, *data).expect("append");
    }
    b.into_inner().expect("finish")
}

#[tokio::test(flavor = "multi_thread")]
async fn round_trips_every_byte_value_and_a_large_random_file() {
    let g = Guard::new("files-roundtrip");
    let b = backend().await;
    let sb = b.create(&g.spec(BUSYBOX)).await.expect("create");

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
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn tmpfs_works_and_a_read_only_root_still_takes_tmp() {
    let g = Guard::new("files-tmpfs");
    let b = backend().await;
    let mut spec = g.spec(BUSYBOX);
    spec.security.read_only_root = true;
    let sb = b.create(&spec).await.expect("create");

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
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn works_in_a_scratch_image_without_a_shell() {
    let g = Guard::new("files-scratch");
    let b = backend().await;
    let sb = b.create(&g.spec(SCRATCH)).await.expect("create");

    let data = random_bytes(100_000, 7);
    sb.write_file("/tmp/data.bin", &data, &opts())
        .await
        .expect("write tmpfs");
    assert_eq!(
        sb.read_file("/tmp/data.bin", &opts()).await.expect("read"),
        data
    );
    let nested = FileOptions {
        mkdirs: true,
        ..opts()
    };
    sb.write_file("/work/a/b.txt", b"deep", &nested)
        .await
        .expect("write with mkdirs");
    assert_eq!(
        sb.read_file("/work/a/b.txt", &opts()).await.expect("read"),
        b"deep"
    );
    let tar = sb.download_tar("/work", &opts()).await.expect("download");
    assert_eq!(
        tar_files(&tar).get("a/b.txt").map(Vec::as_slice),
        Some(&b"deep"[..])
    );

    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn too_large_is_refused_on_read_and_on_write_with_nothing_written() {
    let g = Guard::new("files-cap");
    let b = backend().await;
    let sb = b.create(&g.spec(BUSYBOX)).await.expect("create");
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
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_paths_are_not_found_and_bad_input_is_refused_on_the_host() {
    let g = Guard::new("files-notfound");
    let b = backend().await;
    let sb = b.create(&g.spec(BUSYBOX)).await.expect("create");

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
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn paths_cannot_escape_the_root_by_dot_dot_or_symlink() {
    let g = Guard::new("files-escape");
    let b = backend().await;
    let sb = b.create(&g.spec(BUSYBOX)).await.expect("create");
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
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn directory_trees_go_up_and_come_back_as_tar() {
    let g = Guard::new("files-tar");
    let b = backend().await;
    let sb = b.create(&g.spec(BUSYBOX)).await.expect("create");

    let host = HostDir::new("tree");
    let bin = random_bytes(300_000, 42);
    std::fs::create_dir_all(host.0.join("src/deep/er")).expect("mkdir");
    std::fs::create_dir_all(host.0.join("empty")).expect("mkdir");
    std::fs::write(host.0.join("README"), b"hello\n").expect("write");
    std::fs::write(host.0.join("src/deep/er/blob.bin"), &bin).expect("write");
    std::fs::write(host.0.join("src/main.rs"), b"fn main() {}\n").expect("write");
    std::os::unix::fs::symlink("deep/er/blob.bin", host.0.join("src/link")).expect("symlink");

    sb.upload_dir(&host.0, "/tmp/proj", &opts())
        .await
        .expect("upload_dir");
    assert_eq!(out(&sb, "cat /tmp/proj/README").await, "hello\n");
    assert_eq!(
        out(&sb, "readlink /tmp/proj/src/link").await,
        "deep/er/blob.bin\n"
    );
    assert_eq!(
        out(&sb, "test -d /tmp/proj/empty && echo dir").await,
        "dir\n"
    );
    assert_eq!(
        out(&sb, "wc -c < /tmp/proj/src/link").await.trim(),
        "300000"
    );

    let tar = sb
        .download_tar("/tmp/proj", &opts())
        .await
        .expect("download_tar");
    let files = tar_files(&tar);
    let expected: BTreeMap<String, Vec<u8>> = [
        ("README".to_string(), b"hello\n".to_vec()),
        ("src/deep/er/blob.bin".to_string(), bin.clone()),
        ("src/main.rs".to_string(), b"fn main() {}\n".to_vec()),
    ]
    .into_iter()
    .collect();
    assert_eq!(
        files.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>()
    );
    assert!(files == expected, "downloaded contents differ");

    // The downloaded archive goes up again unchanged.
    sb.upload_tar("/tmp/copy", &tar, &opts())
        .await
        .expect("upload_tar");
    let again = sb
        .download_tar("/tmp/copy", &opts())
        .await
        .expect("download again");
    assert!(tar_files(&again) == expected);
    // A single file comes back as one entry named by its file name.
    let one = sb
        .download_tar("/tmp/proj/src/main.rs", &opts())
        .await
        .expect("one file");
    assert_eq!(tar_files(&one).into_keys().collect::<Vec<_>>(), ["main.rs"]);

    // A host path that is not a directory is a host error, before anything runs.
    let e = sb
        .upload_dir(&host.0.join("README"), "/tmp/x", &opts())
        .await
        .expect_err("not a dir");
    assert!(matches!(e, FileError::Host { .. }), "{e:?}");
    let e = sb
        .upload_dir(Path::new("/nonexistent-corral"), "/tmp/x", &opts())
        .await
        .expect_err("missing host dir");
    assert!(e.to_string().contains("/nonexistent-corral"), "{e}");

    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_archives_are_refused_and_write_nothing() {
    let g = Guard::new("files-evil");
    let b = backend().await;
    let sb = b.create(&g.spec(BUSYBOX)).await.expect("create");

    let evil = raw_tar(&[("fine.txt", b"fine"), ("../evil", b"pwned")]);
    let e = sb
        .upload_tar("/tmp/up", &evil, &opts())
        .await
        .expect_err("../evil");
    match &e {
        FileError::Unsafe { entry, path, .. } => {
            assert_eq!(entry, "../evil");
            assert_eq!(path, "/tmp/up");
        }
        other => panic!("expected Unsafe, got {other:?}"),
    }
    assert!(
        e.to_string().contains("../evil") && e.to_string().contains(sb.id()),
        "{e}"
    );
    assert_eq!(e.failure().kind, FailureKind::InvalidSpec);
    assert_eq!(
        out(&sb, "ls -A /tmp; test -e /tmp/up && echo up-exists; true").await,
        "",
        "something was written"
    );

    let abs = raw_tar(&[("/tmp/abs-evil", b"x")]);
    let e = sb
        .upload_tar("/tmp/up", &abs, &opts())
        .await
        .expect_err("absolute");
    assert!(
        matches!(&e, FileError::Unsafe { entry, .. } if entry == "/tmp/abs-evil"),
        "{e:?}"
    );
    assert_eq!(out(&sb, "ls -A /tmp").await, "");

    // A symlink already in the target directory cannot carry an entry out.
    out(&sb, "mkdir -p /tmp/t && ln -s /etc /tmp/t/etc").await;
    let through = raw_tar(&[("etc/evil", b"x")]);
    let e = sb
        .upload_tar("/tmp/t", &through, &opts())
        .await
        .expect_err("through symlink");
    assert!(matches!(e, FileError::Unsafe { .. }), "{e:?}");
    assert_eq!(
        out(&sb, "test -e /etc/evil && echo yes || echo no").await,
        "no\n"
    );

    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn mode_is_honoured_and_kept() {
    let g = Guard::new("files-mode");
    let b = backend().await;
    let sb = b.create(&g.spec(BUSYBOX)).await.expect("create");

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
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_container_removed_out_of_band_is_a_typed_sandbox_failure() {
    let g = Guard::new("files-lost");
    let b = backend().await;
    let sb = b.create(&g.spec(BUSYBOX)).await.expect("create");
    sb.write_file("/tmp/f", b"before", &opts())
        .await
        .expect("write");

    docker(&["rm", "-f", &sb.container_id()]);
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
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn directories_list_sorted_with_types_sizes_modes_and_link_targets() {
    use corral::EntryKind;

    let g = Guard::new("files-list");
    let b = backend().await;
    let sb = b.create(&g.spec(BUSYBOX)).await.expect("create");
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
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn listing_works_in_a_scratch_image_without_a_shell() {
    let g = Guard::new("files-list-scratch");
    let b = backend().await;
    let sb = b.create(&g.spec(SCRATCH)).await.expect("create");
    let mk = FileOptions {
        mkdirs: true,
        ..opts()
    };
    sb.write_file("/tmp/d/z", b"", &mk).await.expect("write z");
    sb.write_file("/tmp/d/a", b"abc", &mk)
        .await
        .expect("write a");
    let got = sb.list_dir("/tmp/d", &opts()).await.expect("list");
    assert_eq!(
        got.iter()
            .map(|e| (e.name.as_str(), e.size))
            .collect::<Vec<_>>(),
        [("a", 3), ("z", 0)]
    );
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}
