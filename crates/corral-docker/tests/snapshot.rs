//! Snapshots and forks on the real daemon: a fork sees exactly its
//! snapshot's file system and runs with its source's spec; pristine forks
//! reset to the snapshot; snapshots are listed, refused while in use,
//! deleted, kept or collected by `gc` by their ownership.

mod common;

use std::time::Duration;

use common::{backend, docker, Guard, BUSYBOX};
use corral::{ResetMode, Sandbox, SnapshotOptions};
use corral_core::labels::Ownership;
use corral_core::snapshot::SnapshotKind;
use corral_core::{CommandSpec, EnvVar, SandboxSpec};

fn sh(script: &str) -> CommandSpec {
    CommandSpec::shell(script).timeout(Duration::from_secs(60))
}

async fn out(sb: &Sandbox, script: &str) -> String {
    let r = sb.run(&sh(script)).await;
    assert_eq!(r.failure, None, "{script}: {r:?}");
    assert_eq!(
        r.exit_code,
        Some(0),
        "{script}: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    String::from_utf8_lossy(&r.stdout).into_owned()
}

/// A name no other test run uses.
fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        corral::host::random_hex(6)
    )
}

/// What a prepared rollout leaves: a repository of ~50 MB, a deleted and
/// a modified system file.
const PREPARE: &str =
    "mkdir -p /srv/repo && dd if=/dev/urandom of=/srv/repo/blob bs=1M count=50 2>/dev/null \
     && echo prepared > /srv/repo/README && rm /etc/group && chmod 700 /home/user";

const CHECK: &str =
    "md5sum /srv/repo/blob | cut -c1-32; cat /srv/repo/README; ls /etc/group 2>&1 | wc -l; \
     stat -c %a /home/user; cat /etc/startup-marker; echo \"$SECRET\"";

/// What a fork is given for the variable the snapshot names.
fn secret() -> Vec<EnvVar> {
    vec![EnvVar::Set {
        name: "SECRET".into(),
        value: "s3cr3t-value".into(),
    }]
}

fn spec(g: &Guard, pristine: bool) -> SandboxSpec {
    let mut spec = g.spec(BUSYBOX);
    spec.pristine = pristine;
    spec.startup = vec!["echo from-startup > /etc/startup-marker".into()];
    spec.env.push(EnvVar::Set {
        name: "SECRET".into(),
        value: "s3cr3t-value".into(),
    });
    spec
}

#[tokio::test(flavor = "multi_thread")]
async fn forks_of_a_pristine_sandbox_start_from_its_snapshot_and_reset_to_it() {
    let g = Guard::new("snap-pristine");
    let rt = backend().await;
    let source = rt.create(&spec(&g, true)).await.expect("create");
    out(&source, &format!("{PREPARE}; (sleep 1000 &)")).await;
    let expected = out(&source, CHECK).await;
    assert!(
        expected.ends_with("prepared\n1\n700\nfrom-startup\ns3cr3t-value\n"),
        "{expected}"
    );

    // An image (`docker commit`), asked for: a pristine sandbox's delta is
    // applied to its container first.
    let name = unique("pristine");
    let image = SnapshotOptions {
        kind: Some(SnapshotKind::Image),
        ..Default::default()
    };
    let snap = source.snapshot(&name, image).await.expect("snapshot");
    assert_eq!(snap.kind, SnapshotKind::Image);
    assert_eq!(snap.name, name);
    assert!(!snap.durable);
    assert_eq!(snap.ownership, Ownership::LiveOwner);
    // The sandbox goes on from its snapshot: processes ended, files kept,
    // and its resets now return to the snapshot.
    assert_eq!(
        out(&source, "ps -o args | grep -c '[s]leep 1000' || true").await,
        "0\n"
    );
    out(&source, "rm -rf /srv/repo; echo later > /etc/later").await;
    assert_eq!(
        source.reset().await.expect("reset").mode,
        ResetMode::InPlace
    );
    assert_eq!(out(&source, CHECK).await, expected);

    // The committed image does not carry the sandbox's environment.
    let image_env = docker(&[
        "image",
        "inspect",
        "-f",
        "{{json .Config.Env}}",
        &snap.image,
    ]);
    assert!(!image_env.contains("s3cr3t"), "{image_env}");

    // The snapshot kept the variable's name, not its value: a plain fork
    // does not have it, a fork given the value has it.
    assert!(!docker(&[
        "image",
        "inspect",
        "-f",
        "{{json .Config.Labels}}",
        &snap.image
    ])
    .contains("s3cr3t"));
    assert_eq!(snap.env_names, ["SECRET"]);
    let plain = rt.fork(&name, 1).await.expect("fork");
    assert!(out(&plain[0], CHECK).await.ends_with("from-startup\n\n"));
    plain[0].destroy().await.expect("destroy");
    let forks = rt.fork_with(&name, 3, &secret()).await.expect("fork");
    assert_eq!(forks.len(), 3);
    for f in &forks {
        assert_eq!(out(f, CHECK).await, expected, "fork {}", f.id());
        f.resets_in_place()
            .expect("a pristine fork resets in place");
        out(f, "rm /srv/repo/README; echo x > /etc/group").await;
        let outcome = f.reset().await.expect("reset");
        assert_eq!(outcome.mode, ResetMode::InPlace, "{outcome:?}");
        assert_eq!(out(f, CHECK).await, expected, "fork {} after reset", f.id());
    }
    // Listed; gc keeps it while its owner lives; not deletable in use.
    let listed = rt.snapshots().await.expect("list");
    assert!(listed
        .iter()
        .any(|s| s.name == name && s.ownership == Ownership::LiveOwner));
    let report = rt.gc(false).await.expect("gc");
    assert!(!report.snapshots_removed.contains(&name), "{report:?}");
    let e = rt.delete_snapshot(&name).await.expect_err("in use");
    assert!(
        e.to_string().contains(&name) && e.to_string().contains("destroy them"),
        "{e}"
    );

    for f in forks {
        f.destroy().await.expect("destroy");
    }
    source.destroy().await.expect("destroy");
    rt.delete_snapshot(&name).await.expect("delete");
    assert!(!rt
        .snapshots()
        .await
        .expect("list")
        .iter()
        .any(|s| s.name == name));
    let e = rt.delete_snapshot(&name).await.expect_err("gone");
    assert!(e.to_string().contains("no such snapshot"), "{e}");
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_of_a_running_sandbox_keeps_it_running() {
    let g = Guard::new("snap-plain");
    let rt = backend().await;
    let source = rt.create(&spec(&g, false)).await.expect("create");
    out(&source, &format!("{PREPARE}; (sleep 1000 &)")).await;
    let expected = out(&source, CHECK).await;
    let name = unique("plain");
    let snap = source
        .snapshot(
            &name,
            SnapshotOptions {
                durable: true,
                ..Default::default()
            },
        )
        .await
        .expect("snapshot");
    assert!(snap.durable);
    assert_eq!(
        out(&source, "ps -o args | grep -c '[s]leep 1000' || true").await,
        "1\n"
    );
    let forks = rt.fork_with(&name, 2, &secret()).await.expect("fork");
    for f in &forks {
        assert_eq!(out(f, CHECK).await, expected);
        assert_eq!(
            out(f, "ps -o args | grep -c '[s]leep 1000' || true").await,
            "0\n"
        );
    }
    for f in forks {
        f.destroy().await.expect("destroy");
    }
    source.destroy().await.expect("destroy");
    // Durable: classified like a persistent sandbox, which gc never
    // removes (gc --all is not run here: it would remove other tests'
    // sandboxes on the shared daemon).
    let report = rt.gc(false).await.expect("gc");
    assert!(!report.snapshots_removed.contains(&name), "{report:?}");
    let listed = rt.snapshot_info(&name).await.expect("listed");
    assert_eq!(listed.ownership, Ownership::Persistent);
    rt.delete_snapshot(&name).await.expect("delete");
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_names_and_unknown_snapshots_are_errors_naming_them() {
    let g = Guard::new("snap-names");
    let rt = backend().await;
    let sb = rt.create(&g.spec(BUSYBOX)).await.expect("create");
    let e = sb
        .snapshot("Not/Valid", SnapshotOptions::default())
        .await
        .expect_err("bad name");
    assert!(
        e.to_string().contains("Not/Valid") && e.to_string().contains("name"),
        "{e}"
    );
    let missing = unique("missing");
    let Err(e) = rt.fork(&missing, 2).await else {
        panic!("forked an unknown snapshot");
    };
    assert!(e.to_string().contains(&missing), "{e}");
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

/// The container tier has no checkpoint: a live snapshot is refused by
/// name (the tier, and what can be live-snapshotted), nothing is listed,
/// and the sandbox goes on with its processes.
#[tokio::test(flavor = "multi_thread")]
async fn a_live_snapshot_of_a_runc_sandbox_is_refused_naming_the_tier() {
    let g = Guard::new("snap-live-runc");
    let rt = backend().await;
    let mut s = g.spec(BUSYBOX);
    s.network = corral_core::Network::None;
    let sb = rt.create(&s).await.expect("create");
    out(&sb, "setsid sleep 600 </dev/null >/dev/null 2>&1 &").await;
    let name = unique("live");
    let e = sb
        .snapshot(
            &name,
            SnapshotOptions {
                kind: Some(SnapshotKind::Live),
                ..Default::default()
            },
        )
        .await
        .expect_err("refused");
    assert_eq!(e.kind(), corral_core::FailureKind::Unsupported, "{e}");
    assert!(
        e.to_string().contains("runc") && e.to_string().contains("gVisor"),
        "{e}"
    );
    assert!(
        rt.snapshot_info(&name).await.is_err(),
        "listed after a refusal"
    );
    assert_eq!(out(&sb, "ps -o comm | grep -c sleep").await, "1\n");
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

/// The attack: read a sandbox's secret from outside it without any right
/// to the sandbox, through what the engine shows (`docker inspect` of its
/// container) and what a snapshot carries (the image's JSON, its history,
/// the `docker save` archive that a push would send).
#[tokio::test(flavor = "multi_thread")]
async fn no_value_of_the_environment_is_in_the_container_config_or_the_snapshot() {
    let g = Guard::new("snap-secret-env");
    let rt = backend().await;
    let secret = format!("sk-probe-{}", corral::host::random_hex(12));
    let forwarded = format!("fw-probe-{}", corral::host::random_hex(12));
    let fwd_name = format!("SNAP_TEST_FORWARDED_{}", std::process::id());
    std::env::set_var(&fwd_name, &forwarded);
    let both = format!("$API_KEY/${fwd_name}");
    let mut spec = g.spec(BUSYBOX);
    // The start-up command records a digest of what it saw (the file
    // system is the sandbox's own content: the value itself would rightly
    // be in the snapshot if a command wrote it there).
    spec.startup = vec![format!("echo \"{both}\" | md5sum > /startup-saw")];
    spec.env = vec![
        EnvVar::Set {
            name: "API_KEY".into(),
            value: secret.clone(),
        },
        EnvVar::Forward {
            forward: fwd_name.clone(),
        },
    ];
    let sb = rt.create(&spec).await.expect("create");

    // Inside, commands and start-up commands see both values, and a
    // command's own variable wins.
    assert_eq!(
        out(&sb, &format!("echo \"{both}\"")).await,
        format!("{secret}/{forwarded}\n")
    );
    let seen = out(&sb, &format!("cat /startup-saw; echo \"{both}\" | md5sum")).await;
    let lines: Vec<&str> = seen.lines().collect();
    assert_eq!(lines.len(), 2, "{seen}");
    assert_eq!(lines[0], lines[1], "the start-up command saw other values");
    let r = sb.run(&sh("echo $API_KEY").env("API_KEY", "mine")).await;
    assert_eq!(String::from_utf8_lossy(&r.stdout), "mine\n", "{r:?}");

    let leaks = |what: &str, text: &str| {
        for value in [&secret, &forwarded] {
            assert!(
                !text.contains(value.as_str()),
                "{what} holds the value {value}:\n{text}"
            );
        }
    };
    let container = docker(&[
        "ps",
        "-aq",
        "--no-trunc",
        "--filter",
        &format!("label=corral.sandbox={}", sb.id()),
    ]);
    let container = container.trim();
    assert_eq!(container.len(), 64, "one container: {container:?}");
    let inspect = docker(&["inspect", container]);
    assert!(inspect.contains("\"Env\""), "{inspect}");
    leaks("docker inspect of the sandbox's container", &inspect);

    let name = unique("secret-env");
    let snap = sb
        .snapshot(&name, SnapshotOptions::default())
        .await
        .expect("snapshot");
    let image = docker(&["image", "inspect", &snap.image]);
    assert!(image.contains("\"ContainerConfig\""), "{image}");
    leaks("docker image inspect of the snapshot", &image);
    let history = docker(&["history", "--no-trunc", &snap.image]);
    assert!(history.contains(sb.id()), "{history}");
    leaks("docker history of the snapshot", &history);
    let saved = std::process::Command::new("docker")
        .args(["save", &snap.image])
        .output()
        .expect("docker save");
    assert!(saved.status.success(), "{saved:?}");
    let archive = String::from_utf8_lossy(&saved.stdout);
    assert!(archive.contains("startup-saw"), "the archive has the layer");
    leaks("docker save of the snapshot", &archive);

    sb.destroy().await.expect("destroy");
    rt.delete_snapshot(&name).await.expect("delete");
    std::env::remove_var(&fwd_name);
    g.assert_clean();
}
