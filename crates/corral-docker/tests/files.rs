//! Files in and out of a `FROM scratch` sandbox, which has no shell and
//! no tools: only the agent moves the bytes. The engine-neutral file cases
//! (round trips, tmpfs and read-only roots, caps, root escapes, modes,
//! listings, tar trees, hostile archives, a sandbox lost mid-use) are the
//! shared contract in `tests/contract.rs`.

mod common;

use std::collections::BTreeMap;

use common::{backend, Guard, SCRATCH};
use corral::FileOptions;

fn opts() -> FileOptions {
    FileOptions::default()
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
