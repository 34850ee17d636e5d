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
use common::{backend, Guard, BUSYBOX};
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

    let inspect = b
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
    let net = b.sandbox_network().await.expect("network");
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
    let report = b.doctor(None).await.expect("doctor");
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
