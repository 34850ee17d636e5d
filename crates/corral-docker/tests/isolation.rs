//! Sandboxes cannot reach each other: the attacks, run for real.
//!
//! Sandbox A runs a TCP server; sandbox B tries to connect to it. Both are
//! default sandboxes (with network), so both join corral's network, where
//! inter-container traffic is dropped; B still reaches the host side (a
//! listener this test binds on the network's gateway address), so the
//! sandboxes keep their way out.

mod common;

use std::io::Write;
use std::net::TcpListener;
use std::time::Duration;

use bollard::query_parameters::InspectContainerOptions;
use common::{backend, docker_within as docker, Guard, BUSYBOX};
use corral_core::CommandSpec;
use corral_docker::network::{ICC_OPTION, NETWORK_NAME};

fn sh(script: &str) -> CommandSpec {
    CommandSpec::shell(script).timeout(Duration::from_secs(30))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn sandboxes_reach_outside_but_not_each_other() {
    let g = Guard::new("iso-net");
    let b = backend().await;
    let a = b.create(&g.spec(BUSYBOX)).await.expect("create A");
    let bb = b.create(&g.spec(BUSYBOX)).await.expect("create B");

    // A serves on port 7777 (a persistent server: -ll with -e).
    let r = a
        .run(&sh(
            "(nc -ll -p 7777 -e echo reached-a </dev/null >/dev/null 2>&1 &); sleep 0.3; \
             nc -w 3 127.0.0.1 7777 </dev/null",
        ))
        .await;
    assert_eq!(
        text(&r.stdout),
        "reached-a\n",
        "A's server answers locally: {r:?}"
    );

    let inspect = common::docker_backend()
        .await
        .docker()
        .inspect_container(&a.container_id(), None::<InspectContainerOptions>)
        .await
        .expect("inspect A");
    let networks = inspect
        .network_settings
        .and_then(|n| n.networks)
        .expect("A has networks");
    assert_eq!(
        networks.keys().collect::<Vec<_>>(),
        [NETWORK_NAME],
        "sandboxes join corral's network, never the default bridge"
    );
    let a_ip = networks[NETWORK_NAME]
        .ip_address
        .clone()
        .expect("A's address");

    // The attack: B connects to A's server.
    let r = bb
        .run(&sh(&format!("nc -w 3 {a_ip} 7777 </dev/null; echo rc=$?")))
        .await;
    let out = text(&r.stdout);
    assert!(
        !out.contains("reached-a"),
        "sandbox B reached sandbox A's server at {a_ip}: {out}"
    );
    assert!(out.contains("rc=1"), "the connection failed: {out}");

    // B still reaches outside: a listener on the host side of the network.
    let net = common::docker_backend()
        .await
        .sandbox_network()
        .await
        .expect("network");
    let gateway = net.gateways.first().expect("a gateway").clone();
    let listener = TcpListener::bind((gateway.as_str(), 0)).expect("bind on the gateway");
    let port = listener.local_addr().expect("addr").port();
    let server = std::thread::spawn(move || {
        if let Ok((mut conn, _)) = listener.accept() {
            let _ = conn.write_all(b"reached-host\n");
        }
    });
    let r = bb
        .run(&sh(&format!("nc -w 5 {gateway} {port} </dev/null")))
        .await;
    assert_eq!(
        text(&r.stdout),
        "reached-host\n",
        "B reaches outside: {r:?}"
    );
    server.join().expect("listener thread");

    // The network is corral's and isolated, and `doctor` says so.
    let report = common::docker_backend()
        .await
        .doctor(None, b.owner())
        .await
        .expect("doctor");
    assert!(report.network.ok, "{:?}", report.network);
    assert!(
        report.network.detail.contains(ICC_OPTION),
        "{:?}",
        report.network
    );

    a.destroy().await.expect("destroy A");
    bb.destroy().await.expect("destroy B");
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_agent_cannot_be_changed_for_other_sandboxes() {
    let g = Guard::new("iso-agent");
    let b = backend().await;
    let want = corral::seal::sha256_hex(corral_docker::agent_volume::AGENT_BINARY);
    let mut spec = g.spec(BUSYBOX);
    spec.network = corral_core::Network::None;
    let plain = b.create(&spec).await.expect("create");

    // A default sandbox can neither remount the agent's volume nor write.
    let r = plain
        .run(&sh(
            "mount -o remount,rw /.corral 2>/dev/null && echo remounted; \
             touch /.corral/planted 2>/dev/null && echo written; echo done",
        ))
        .await;
    assert_eq!(text(&r.stdout), "done\n", "{r:?}");

    // A sandbox with SYS_ADMIN can: it gets its own copy.
    let mut admin = spec.clone();
    admin.security.cap_add.push("SYS_ADMIN".into());
    let strong = b.create(&admin).await.expect("create with SYS_ADMIN");
    let r = strong
        .run(&sh(
            "mount -o remount,rw /.corral && echo planted > /.corral/planted && \
             cp /.corral/corral-agent /.corral/new && mv /.corral/new /.corral/corral-agent && \
             ls /.corral",
        ))
        .await;
    assert_eq!(
        text(&r.stdout),
        "corral-agent\nplanted\n",
        "the attack runs in the SYS_ADMIN sandbox: {r:?}"
    );

    // Other sandboxes, running and new, see the genuine agent only.
    let later = b.create(&spec).await.expect("create after the attack");
    for sb in [&plain, &later] {
        let r = sb
            .run(&sh("ls /.corral; sha256sum /.corral/corral-agent"))
            .await;
        assert_eq!(
            text(&r.stdout),
            format!("corral-agent\n{want}  /.corral/corral-agent\n"),
            "sandbox {} sees a changed agent volume",
            sb.id()
        );
    }

    // The private copy goes with its sandbox...
    let label = format!("label=corral.sandbox={}", strong.id());
    assert_eq!(
        docker(&["volume", "ls", "-q", "--filter", &label])
            .lines()
            .count(),
        1
    );
    strong.destroy().await.expect("destroy");
    assert_eq!(docker(&["volume", "ls", "-q", "--filter", &label]), "");
    // ...and with `gc` when its container was removed out-of-band.
    let lost = b.create(&admin).await.expect("create with SYS_ADMIN");
    let label = format!("label=corral.sandbox={}", lost.id());
    docker(&["rm", "-f", &lost.container_id()]);
    let volume = docker(&["volume", "ls", "-q", "--filter", &label]);
    assert!(!volume.is_empty(), "left behind by docker rm without -v");
    // gc leaves volumes that may still be waiting for their container.
    tokio::time::sleep(Duration::from_secs(
        corral_docker::gc::YOUNG_VOLUME_SECS + 1,
    ))
    .await;
    let report = b.gc(false).await.expect("gc");
    assert!(report.volumes_removed.contains(&volume), "{report:?}");
    assert_eq!(docker(&["volume", "ls", "-q", "--filter", &label]), "");
    lost.destroy().await.expect("destroy a lost sandbox");

    plain.destroy().await.expect("destroy");
    later.destroy().await.expect("destroy");
    g.assert_clean();
}
