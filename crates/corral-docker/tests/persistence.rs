//! Persistent sessions cannot plant things on the host or be hijacked: the
//! attacks, run for real.
//!
//! - A sandbox leaves a setuid-root binary in its workspace: on the host the
//!   session's directories are private (0700) and the bit is cleared when
//!   the sandbox goes; in a later sandbox of the session a setuid bit in the
//!   workspace has no effect (nosuid), while the same binary elsewhere does.
//! - Two keys that the earlier directory naming sent to one directory get
//!   two; a directory under the earlier name is carried over.
//! - A container planted with a session's labels, or one made from another
//!   spec, is never adopted, and nothing runs in the planted one.

mod common;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountType};
use bollard::query_parameters::{CreateContainerOptionsBuilder, InspectContainerOptions};
use common::{backend, docker_within as docker, Guard, BUSYBOX};
use corral::workspace::{legacy_dir_name, SessionDirs};
use corral::Provider;
use corral_core::pool::ProviderConfig;
use corral_core::{labels, CommandSpec};

fn sh(script: &str) -> CommandSpec {
    CommandSpec::shell(script).timeout(Duration::from_secs(30))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

fn temp_root(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("corral-{name}-{}", std::process::id()))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_planted_setuid_binary_is_private_cleared_and_ineffective() {
    let g = Guard::new("persist-suid");
    let root = temp_root("persist-suid");
    let p =
        Provider::with_persistence_root(backend().await, ProviderConfig::default(), root.clone());
    let key = "agent/suid";
    let dirs = SessionDirs::new(&root, key);

    // The attack: a default sandbox (root inside) leaves a setuid-root copy
    // of busybox in its workspace.
    let lease = p
        .acquire_persistent(key, &g.spec(BUSYBOX))
        .await
        .expect("acquire");
    let r = lease
        .run(&sh("cp /bin/busybox x && chmod u+s x && stat -c '%a %u' x"))
        .await;
    assert_eq!(text(&r.stdout), "4755 0\n", "{r:?}");
    let planted = dirs.workspace.join("x");
    // Other host users cannot reach it: the root and the session are 0700.
    assert_eq!(mode(&root), 0o700, "persistence root");
    assert_eq!(mode(&dirs.dir), 0o700, "session directory");
    assert_eq!(mode(&dirs.workspace), 0o700, "workspace");
    drop(lease);
    p.release(key).await.expect("release");
    // With the sandbox gone, the bit is gone from the host too.
    assert_eq!(mode(&planted), 0o755, "setuid bit cleared on release");

    // A looser root is refused by name and left as it is (corral never
    // changes a directory it did not make: it could be a shared one).
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let Err(e) = p.acquire_persistent(key, &g.spec(BUSYBOX)).await else {
        panic!("a root others may read was used");
    };
    assert!(e.to_string().contains("mode 0755"), "{e}");
    assert_eq!(mode(&root), 0o755, "the root was changed");
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).expect("chmod");

    // A later sandbox of the session that could use setuid binaries (no
    // no-new-privileges, SETUID/SETGID to switch users): a setuid-root
    // program on the image's filesystem runs as root for an ordinary user;
    // the same program in the workspace does not.
    let mut spec = g.spec(BUSYBOX);
    spec.security.no_new_privileges = false;
    spec.security.setuid_caps = true;
    let lease = p
        .acquire_persistent(key, &spec)
        .await
        .expect("acquire again");
    let r = lease
        .run(&sh(
            "set -e; grep ' /workspace ' /proc/mounts | grep -q nosuid; chmod 755 /workspace; \
             for d in / /workspace/; do cp /.corral/corral-agent ${d}probe; chmod u+s ${d}probe; done; \
             echo x | su user -c '/probe file-write /tmp/from-rootfs'; \
             echo x | su user -c '/workspace/probe file-write /tmp/from-workspace'; \
             stat -c %u /tmp/from-rootfs /tmp/from-workspace",
        ))
        .await;
    assert_eq!(
        text(&r.stdout),
        "0\n1000\n",
        "setuid works from the image (control) but not from the workspace: {r:?}"
    );
    drop(lease);
    p.release(key).await.expect("release");
    assert_eq!(mode(&dirs.workspace.join("probe")), 0o755);
    p.shutdown().await;
    g.assert_clean();
    std::fs::remove_dir_all(&root).ok();
}

/// Two keys the earlier naming sent to one directory (same first 64
/// sanitised characters, same 32-bit FNV-1a hash).
const COLLIDING: (&str, &str) = (
    "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk-181191",
    "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk-755080",
);

#[tokio::test(flavor = "multi_thread")]
async fn colliding_keys_get_their_own_directories_and_old_data_moves_over() {
    let g = Guard::new("persist-collide");
    let root = temp_root("persist-collide");
    let (a, b) = COLLIDING;
    assert_eq!(
        legacy_dir_name(a),
        legacy_dir_name(b),
        "they used to collide"
    );
    // Data of `a` under the earlier name, recording its key (a directory
    // that records none, or another key, stays where it is: see
    // workspace.rs).
    let legacy = root.join(legacy_dir_name(a)).join("workspace");
    std::fs::create_dir_all(&legacy).expect("mkdir");
    // A root made by hand must be private (corral does not tighten it).
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    std::fs::write(legacy.join("notes.txt"), "from before\n").expect("write");
    std::fs::write(root.join(legacy_dir_name(a)).join("session"), a).expect("write");

    let p =
        Provider::with_persistence_root(backend().await, ProviderConfig::default(), root.clone());
    let la = p.acquire_persistent(a, &g.spec(BUSYBOX)).await.expect("a");
    let r = la.run(&sh("cat notes.txt; echo secret-of-a > mine")).await;
    assert_eq!(
        text(&r.stdout),
        "from before\n",
        "existing data carried over: {r:?}"
    );
    let lb = p.acquire_persistent(b, &g.spec(BUSYBOX)).await.expect("b");
    let r = lb.run(&sh("ls -A")).await;
    assert_eq!(text(&r.stdout), "", "b sees nothing of a: {r:?}");
    assert_ne!(
        SessionDirs::new(&root, a).dir,
        SessionDirs::new(&root, b).dir
    );
    drop((la, lb));
    p.release(a).await.expect("release a");
    p.release(b).await.expect("release b");
    p.shutdown().await;
    g.assert_clean();
    std::fs::remove_dir_all(&root).ok();
}

/// Creates and starts a container that looks like corral's persistent
/// sandbox for `key` (its labels, the real agent as PID 1, so corral could
/// attach and run commands in it), with `labels` on top.
async fn plant(
    b: &corral_docker::DockerBackend,
    name: &str,
    extra: HashMap<String, String>,
) -> String {
    let mut l: HashMap<String, String> = [
        ("corraltest", "persist-plant"),
        (labels::SANDBOX, "sb-planted"),
        (labels::PERSISTENT, "true"),
        (labels::OWNER_HOST, "elsewhere"),
        (labels::OWNER_PID, "1"),
        (labels::OWNER_START, "1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    l.extend(extra);
    let body = ContainerCreateBody {
        image: Some(BUSYBOX.into()),
        entrypoint: Some(vec![
            "/.corral/corral-agent".into(),
            "init".into(),
            "--grace-ms".into(),
            "600000".into(),
        ]),
        labels: Some(l),
        host_config: Some(HostConfig {
            mounts: Some(vec![Mount {
                target: Some("/.corral".into()),
                source: Some(corral_docker::agent_volume::volume_name()),
                typ: Some(MountType::VOLUME),
                read_only: Some(true),
                ..Default::default()
            }]),
            network_mode: Some("none".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let opts = CreateContainerOptionsBuilder::default().name(name).build();
    let id = b
        .docker()
        .create_container(Some(opts), body)
        .await
        .expect("plant")
        .id;
    b.docker()
        .start_container(&id, None)
        .await
        .expect("start the planted container");
    id
}

fn unix_now() -> String {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() + 1)
        .unwrap_or(0)
        .to_string()
}

/// Exec instances ever started in a container (corral attaches by exec).
async fn execs(b: &corral_docker::DockerBackend, id: &str) -> usize {
    b.docker()
        .inspect_container(id, None::<InspectContainerOptions>)
        .await
        .expect("inspect")
        .exec_ids
        .map_or(0, |v| v.len())
}

#[tokio::test(flavor = "multi_thread")]
async fn planted_or_foreign_spec_containers_are_never_adopted() {
    let g = Guard::new("persist-plant");
    let root = temp_root("persist-plant");
    let b = backend().await;
    // The agent volume exists once corral has started a sandbox.
    let warm = b.create(&g.spec(BUSYBOX)).await.expect("create");
    warm.destroy().await.expect("destroy");
    let suffix = std::process::id();

    // 1. A container with a session's labels but no valid seal.
    let key = format!("planted-{suffix}");
    let planted = plant(
        &common::docker_backend().await,
        &format!("corraltest-planted-{suffix}"),
        HashMap::from([
            (labels::SESSION.to_string(), key.clone()),
            (labels::SPEC_DIGEST.to_string(), "0".repeat(64)),
            (labels::SEAL.to_string(), "1".repeat(64)),
        ]),
    )
    .await;
    let p = Provider::with_persistence_root(b.clone(), ProviderConfig::default(), root.clone());
    let lease = p
        .acquire_persistent(&key, &g.spec(BUSYBOX))
        .await
        .expect("acquire");
    assert_ne!(
        lease.container_id(),
        planted,
        "the planted container was adopted"
    );
    assert_eq!(
        execs(&common::docker_backend().await, &planted).await,
        0,
        "corral ran something in the planted container"
    );
    assert_eq!(
        docker(&["inspect", "-f", "{{.State.Running}}", &planted]),
        "true",
        "a container corral cannot prove its own is left alone"
    );
    let genuine = lease.container_id();
    drop(lease);

    // 2. A copy of the genuine container's labels, seal included, on a
    //    planted container after the genuine one is gone: the seal verifies,
    //    but it is not the container recorded for the session.
    p.shutdown().await;
    let info = common::docker_backend()
        .await
        .docker()
        .inspect_container(&genuine, None::<InspectContainerOptions>)
        .await
        .expect("inspect the genuine container");
    let copied: HashMap<String, String> = info
        .config
        .and_then(|c| c.labels)
        .expect("labels")
        .into_iter()
        .filter(|(k, _)| k.starts_with("corral."))
        .collect();
    assert!(
        copied.contains_key(labels::SEAL),
        "persistent containers are sealed"
    );
    docker(&["rm", "-f", &genuine]);
    let since = (unix_now().parse::<u64>().unwrap_or(1) - 2).to_string();
    let replay = plant(
        &common::docker_backend().await,
        &format!("corraltest-replay-{suffix}"),
        copied,
    )
    .await;
    let p = Provider::with_persistence_root(b.clone(), ProviderConfig::default(), root.clone());
    let lease = p
        .acquire_persistent(&key, &g.spec(BUSYBOX))
        .await
        .expect("acquire");
    assert_ne!(lease.container_id(), replay, "a replayed seal was adopted");
    // Sealed with the user's key, so corral's own and stale: removed, and
    // never attached to (no exec was ever created in it).
    assert_eq!(
        docker(&["ps", "-aq", "--filter", &format!("id={replay}")]),
        ""
    );
    assert_eq!(
        docker(&[
            "events",
            "--since",
            &since,
            "--until",
            &unix_now(),
            "--filter",
            &format!("container={replay}"),
            "--filter",
            "event=exec_create",
            "--format",
            "{{.Action}}",
        ]),
        "",
        "corral ran something in the replayed container"
    );
    let current = lease.container_id();
    drop(lease);

    // 3. The genuine container, but asked for with another spec: replaced.
    p.shutdown().await;
    let p = Provider::with_persistence_root(b.clone(), ProviderConfig::default(), root.clone());
    let lease = p
        .acquire_persistent(&key, &g.spec(BUSYBOX))
        .await
        .expect("adopt");
    assert_eq!(
        lease.container_id(),
        current,
        "the genuine container is adopted"
    );
    drop(lease);
    p.shutdown().await;
    let p = Provider::with_persistence_root(b.clone(), ProviderConfig::default(), root.clone());
    let mut other = g.spec(BUSYBOX);
    other.limits.memory = Some(96 << 20);
    let lease = p.acquire_persistent(&key, &other).await.expect("acquire");
    assert_ne!(
        lease.container_id(),
        current,
        "a container of another spec was adopted"
    );
    let r = lease
        .run(&sh("cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max"))
        .await;
    assert_eq!(text(&r.stdout).trim(), (96u64 << 20).to_string());
    drop(lease);
    p.release(&key).await.expect("release");
    p.shutdown().await;

    assert_eq!(
        docker(&[
            "ps",
            "-aq",
            "--filter",
            &format!("label=corral.session={key}"),
            "--filter",
            "label=corral.seal"
        ])
        .lines()
        .filter(|id| !planted.starts_with(*id) && !replay.starts_with(*id))
        .count(),
        0,
        "corral's own containers are gone"
    );
    docker(&["rm", "-f", &planted, &replay]);
    g.assert_clean();
    std::fs::remove_dir_all(&root).ok();
}
