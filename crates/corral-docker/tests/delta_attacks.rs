//! A delta snapshot's archive is hostile input to every fork that takes it
//! in: attacks from inside a real source sandbox (links to the host mount,
//! to the agent's state and binary, a file named like a whiteout), and
//! from a compromised source (a crafted archive, planted as a durable
//! snapshot, that climbs, goes through links or covers mounts). Nothing is
//! ever written outside the fork's own delta: the host directory mounted
//! into the forks stays as it was, and a refused fork leaves nothing.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{docker_backend, Guard, BUSYBOX};
use corral::snapshot::{SnapshotKind, SnapshotRequest};
use corral::{Mount, Runtime, RuntimeConfig, Sandbox, SandboxSpec, SnapshotOptions};
use corral_testing::contract::out;

struct Fixture {
    rt: Runtime,
    /// The host directory every sandbox mounts at /data.
    host: PathBuf,
    /// Where durable snapshots go.
    store: PathBuf,
}

impl Fixture {
    async fn new(what: &str) -> Fixture {
        let root = std::env::temp_dir().join(format!(
            "corral-delta-attacks-{what}-{}",
            corral::host::random_hex(8)
        ));
        let host = root.join("host");
        std::fs::create_dir_all(&host).expect("host dir");
        std::fs::write(host.join("sentinel"), b"untouched").expect("sentinel");
        let rt = Runtime::new(
            Arc::new(docker_backend().await),
            RuntimeConfig {
                reap_orphans: false,
                snapshot_dir: Some(root.join("store")),
                ..RuntimeConfig::default()
            },
        );
        Fixture {
            rt,
            host,
            store: root.join("store"),
        }
    }

    fn spec(&self, g: &Guard) -> SandboxSpec {
        let mut spec = g.spec(BUSYBOX);
        spec.pristine = true;
        spec.mounts.push(Mount {
            host: self.host.display().to_string(),
            container: "/data".into(),
            read_only: false,
            nosuid: false,
        });
        spec
    }

    /// The host directory holds only its sentinel, untouched.
    fn host_untouched(&self, what: &str) {
        let names: Vec<String> = std::fs::read_dir(&self.host)
            .expect("host dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["sentinel"], "{what}: the host directory changed");
        assert_eq!(
            std::fs::read(self.host.join("sentinel")).expect("sentinel"),
            b"untouched",
            "{what}"
        );
    }

    /// Plants `archive` as durable snapshot `name` of a sandbox of
    /// `spec`, as a compromised source agent (or anyone writing the
    /// store) could.
    fn plant(&self, name: &str, spec: &SandboxSpec, archive: &[u8]) {
        let owner = corral::host::this_owner();
        let req = SnapshotRequest {
            name,
            namespace: None,
            sandbox_id: "sb-compromised",
            spec,
            owner: &owner,
            durable: true,
        };
        let labels: HashMap<String, String> = req.labels();
        let record = serde_json::json!({
            "labels": labels,
            "image": spec.image,
            "created": 0,
            "size": archive.len(),
        });
        let dir = self.store.join("operator");
        std::fs::create_dir_all(&dir).expect("store");
        std::fs::write(dir.join(format!("{name}.tar")), archive).expect("archive");
        std::fs::write(
            dir.join(format!("{name}.json")),
            serde_json::to_vec(&record).expect("json"),
        )
        .expect("record");
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(root) = self.host.parent() {
            let _ = std::fs::remove_dir_all(root);
        }
    }
}

/// A tar entry with a raw name and link (what a well-behaved writer would
/// refuse to write).
fn entry(out: &mut Vec<u8>, name: &str, kind: u8, link: &str, data: &[u8]) {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    let octal = |h: &mut [u8; 512], at: usize, len: usize, v: u64| {
        let s = format!("{v:0width$o}\0", width = len - 1);
        h[at..at + len].copy_from_slice(s.as_bytes());
    };
    octal(&mut h, 100, 8, 0o644);
    octal(&mut h, 108, 8, 0);
    octal(&mut h, 116, 8, 0);
    octal(&mut h, 124, 12, data.len() as u64);
    octal(&mut h, 136, 12, 0);
    h[156] = kind;
    h[157..157 + link.len()].copy_from_slice(link.as_bytes());
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    let s = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(s.as_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
}

fn archive(entries: &[(&str, u8, &str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, kind, link, data) in entries {
        entry(&mut out, name, *kind, link, data);
    }
    out.extend_from_slice(&[0u8; 1024]);
    out
}

async fn destroy(sandboxes: Vec<Sandbox>) {
    for sb in sandboxes {
        sb.destroy().await.expect("destroy");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn links_a_source_sandbox_plants_stay_content_in_its_forks() {
    let g = Guard::new("delta-links");
    let f = Fixture::new("links").await;
    let spec = f.spec(&g);
    let source = f.rt.create(&spec).await.expect("create");
    source.resets_in_place().expect("in place");
    // Everything a command can make that points where an import must not
    // write: the host mount, the agent's state and binary, the root.
    out(
        &source,
        "mkdir -p /srv && ln -s /data /srv/to-host && \
         ln -s /dev/shm/.corral-state /srv/to-state && ln -s /.corral /srv/to-agent && \
         ln -s / /srv/to-root && mkdir -p /srv/dir && echo inside > /srv/dir/file",
    )
    .await;
    let snap = source
        .snapshot("delta-links", SnapshotOptions::default())
        .await
        .expect("snapshot");
    assert_eq!(snap.kind, SnapshotKind::Delta);
    let forks = f.rt.fork("delta-links", 2).await.expect("fork");
    for fork in &forks {
        assert_eq!(
            out(
                fork,
                "for l in to-host to-state to-agent to-root; do readlink /srv/$l; done; \
                 cat /srv/dir/file; ls /data"
            )
            .await,
            "/data\n/dev/shm/.corral-state\n/.corral\n/\ninside\nsentinel\n"
        );
        // The agent is whole: its binary runs and resets still work.
        assert_eq!(
            out(
                fork,
                "/.corral/corral-agent --version >/dev/null && echo ok"
            )
            .await,
            "ok\n"
        );
        fork.reset().await.expect("reset");
    }
    f.host_untouched("links in a snapshot");
    destroy(forks).await;

    // A file named like a whiteout cannot travel: the snapshot says so
    // instead of deleting /etc/passwd in every fork.
    out(&source, "touch /etc/.wh.passwd").await;
    let e = source
        .snapshot("delta-whiteout-name", SnapshotOptions::default())
        .await
        .expect_err("a .wh. name");
    assert!(e.to_string().contains("/etc/.wh.passwd"), "{e}");
    assert!(f.rt.snapshot_info("delta-whiteout-name").await.is_err());
    source.destroy().await.expect("destroy");
    f.rt.delete_snapshot("delta-links").await.expect("delete");
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crafted_delta_is_refused_whole_and_writes_nothing_outside() {
    let g = Guard::new("delta-crafted");
    let f = Fixture::new("crafted").await;
    let spec = f.spec(&g);
    // The planted store works: an honest archive forks.
    f.plant(
        "crafted-ok",
        &spec,
        &archive(&[("srv/", b'5', "", b""), ("srv/ok", b'0', "", b"fine")]),
    );
    let forks = f.rt.fork("crafted-ok", 1).await.expect("an honest archive");
    assert_eq!(out(&forks[0], "cat /srv/ok").await, "fine");
    destroy(forks).await;

    let host = f.host.display().to_string();
    // (path, tar entry type, link target, content) of each entry.
    type Entry<'a> = (&'a str, u8, &'a str, &'a [u8]);
    let attacks: Vec<(&str, Vec<Entry>)> = vec![
        (
            "write through a link to the host mount",
            vec![
                ("srv/evil", b'2', "/data", b""),
                ("srv/evil/owned", b'0', "", b"owned"),
            ],
        ),
        (
            "write through a link to the host's own path",
            vec![
                ("srv/evil", b'2', &host, b""),
                ("srv/evil/owned", b'0', "", b"owned"),
            ],
        ),
        (
            "replace the mount point with a link",
            vec![("data", b'2', "/", b"")],
        ),
        (
            "write under the mount point",
            vec![("data/owned", b'0', "", b"owned")],
        ),
        (
            "write into the agent's state",
            vec![("dev/shm/.corral-state/delta/etc/passwd", b'0', "", b"owned")],
        ),
        (
            "replace the agent's binary",
            vec![(".corral/corral-agent", b'0', "", b"#!/bin/sh\n")],
        ),
        (
            "climb out",
            vec![("../../../../data/owned", b'0', "", b"owned")],
        ),
        (
            "an absolute path",
            vec![("/data/owned", b'0', "", b"owned")],
        ),
        ("a hard link", vec![("srv/hl", b'1', "/etc/shadow", b"")]),
        ("a device", vec![("srv/null", b'3', "", b"")]),
        (
            "whiteout the mount point",
            vec![(".wh.data", b'0', "", b"")],
        ),
        ("hide the whole root", vec![(".wh..wh..opq", b'0', "", b"")]),
    ];
    for (i, (what, entries)) in attacks.into_iter().enumerate() {
        let name = format!("crafted-{i}");
        f.plant(&name, &spec, &archive(&entries));
        match f.rt.fork(&name, 2).await {
            Ok(forks) => {
                destroy(forks).await;
                panic!("{what}: a fork took the crafted archive in");
            }
            Err(e) => assert!(
                e.to_string().contains("unsafe_entry"),
                "{what}: refused for another reason: {e}"
            ),
        }
        f.host_untouched(what);
        g.assert_clean();
        f.rt.delete_snapshot(&name).await.expect("delete");
    }
    f.rt.delete_snapshot("crafted-ok").await.expect("delete");
    assert!(Path::new(&f.store).exists());
    g.assert_clean();
}

/// What a sandbox can make of its own delta to break its snapshot: a
/// sparse file of 64 GiB (a few bytes on disk) and a file with thousands
/// of hard links. Each snapshot either travels (holes kept, links as
/// copies within `snapshots.max_bytes`) or fails with a typed error naming
/// the limit, and the sandbox's agent lives on: its next command runs and
/// it still resets.
#[tokio::test(flavor = "multi_thread")]
async fn a_sparse_file_or_many_hard_links_fail_typed_and_the_agent_lives() {
    let g = Guard::new("delta-sparse");
    let f = Fixture::new("sparse").await;
    let spec = f.spec(&g);
    let source = f.rt.create(&spec).await.expect("create");
    source.resets_in_place().expect("in place");
    for (name, script) in [
        (
            "delta-sparse",
            "mkdir -p /srv && truncate -s 64G /srv/sparse && echo tail >> /srv/sparse",
        ),
        (
            "delta-links",
            "rm -f /srv/sparse; mkdir -p /srv/l && dd if=/dev/urandom of=/srv/big bs=1M count=4 \
             2>/dev/null && i=0; while [ $i -lt 3000 ]; do ln /srv/big /srv/l/$i; i=$((i+1)); done",
        ),
    ] {
        out(&source, &format!("{script}; echo made")).await;
        let taken = source.snapshot(name, SnapshotOptions::default()).await;
        match &taken {
            Ok(info) => assert_eq!(info.kind, SnapshotKind::Delta, "{name}"),
            Err(e) => assert!(
                matches!(e, corral::Error::SnapshotTooLarge { .. }),
                "{name}: not a typed refusal: {e:?}"
            ),
        }
        assert_eq!(
            out(&source, "echo alive").await,
            "alive\n",
            "{name}: the agent died"
        );
        let _ = f.rt.delete_snapshot(name).await;
    }
    source.reset().await.expect("reset after the snapshots");
    assert_eq!(out(&source, "echo alive").await, "alive\n");
    source.destroy().await.expect("destroy");
    g.assert_clean();
}
