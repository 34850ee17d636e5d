//! Contract cases for directory trees as tar archives: up from the host
//! and back, and hostile archives refused.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use corral::{FailureKind, FileError};

use super::files::{opts, random_bytes};
use super::{out, Case};

/// A host directory removed when dropped.
struct HostDir(PathBuf);

impl HostDir {
    fn new(tag: &str) -> HostDir {
        let p = std::env::temp_dir().join(format!("corral-contract-{tag}-{}", std::process::id()));
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

/// A host directory tree (binary files, symlinks, an empty directory)
/// goes up and comes back as the same tar, which goes up again.
pub async fn archives_directory_trees_go_up_and_come_back_as_tar(c: &Case) {
    let sb = c.create(&c.spec()).await;

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
}

/// Archives with `..`, absolute entries or entries through a symlink are
/// refused `unsafe_entry` before anything is written.
pub async fn archives_hostile_ones_are_refused_and_write_nothing(c: &Case) {
    let sb = c.create(&c.spec()).await;

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
}
