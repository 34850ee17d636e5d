//! `corral bench` against the real daemon: the JSON report has every row and
//! ratio, and nothing is left behind, whether it finishes or is interrupted.
//! No timing is asserted: that is what the bench reports, not what it is.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use corral_testing::images;

const CORRAL: &str = env!("CARGO_BIN_EXE_corral");

fn bench(args: &[&str], stdout: Stdio) -> Child {
    images();
    Command::new(CORRAL)
        .arg("bench")
        .args(args)
        .env("CORRAL_IMAGE", "corral-test/busybox")
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn corral bench")
}

/// Ids of containers matching every filter.
fn containers(filters: &[&str]) -> Vec<String> {
    let mut cmd = Command::new("docker");
    cmd.args(["ps", "-aq"]);
    for f in filters {
        cmd.args(["--filter", f]);
    }
    let out = cmd.output().expect("docker ps");
    assert!(out.status.success(), "docker ps failed");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(String::from)
        .collect()
}

fn number(v: &Value, what: &str) -> f64 {
    v.as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {v}"))
}

#[test]
fn json_report_has_every_row_and_ratio_and_leaves_nothing() {
    let child = bench(
        &[
            "--json",
            "--sandboxes",
            "4",
            "--commands",
            "3",
            "--parallel",
            "2",
            "--samples",
            "5",
        ],
        Stdio::piped(),
    );
    let owner = format!("label=corral.owner.pid={}", child.id());
    let out = child.wait_with_output().expect("wait corral bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {:?} / {stderr}",
            String::from_utf8_lossy(&out.stdout)
        )
    });

    let latency_rows = [
        ("raw_create_start", true),
        ("cold_start", false),
        ("warm_acquire", false),
        ("raw_exec", true),
        ("agent_round_trip", false),
        ("shell_round_trip", false),
        ("reset", false),
    ];
    let workload_rows = [
        ("workload_corral", false),
        ("workload_plain", true),
        ("workload_pooled_corral", false),
        ("workload_reused_corral", false),
        ("workload_pristine_corral", false),
        ("workload_commands_corral", false),
        ("workload_commands_plain", true),
    ];
    let rows = v["rows"].as_object().expect("rows");
    assert_eq!(rows.len(), 17, "{v}");
    for (id, floor) in latency_rows.iter().chain(&workload_rows) {
        let row = &v["rows"][id];
        assert_eq!(row["floor"], *floor, "{id}: {row}");
        let (p50, p90, p99) = (
            number(&row["p50_ms"], id),
            number(&row["p90_ms"], id),
            number(&row["p99_ms"], id),
        );
        assert!(
            0.0 <= p50 && p50 <= p90 && p90 <= p99,
            "{id}: percentiles out of order: {row}"
        );
    }
    for (id, _) in latency_rows {
        assert_eq!(v["rows"][id]["n"], 5, "{id}");
    }
    for (id, _) in workload_rows {
        let row = &v["rows"][id];
        assert_eq!(row["n"], 4, "{id}: one sample per rollout");
        assert_eq!(row["commands"], 12, "{id}");
        assert!(number(&row["commands_per_s"], id) > 0.0, "{id}: {row}");
        assert!(number(&row["wall_ms"], id) > 0.0, "{id}: {row}");
    }
    // The pool was waited full, so every acquire was a hand-over.
    assert_eq!(v["rows"]["warm_acquire"]["pool_hits"], 5, "{v}");
    assert_eq!(v["rows"]["warm_acquire"]["pool_misses"], 0, "{v}");
    // Every reset killed the mess's `sleep`, and none replaced a container.
    assert!(
        number(&v["rows"]["reset"]["killed"], "killed") >= 5.0,
        "{v}"
    );
    assert_eq!(v["metrics"]["resets_replaced"], 0, "{v}");
    // Every pristine-pool rollout got a sandbox used and reset before.
    assert_eq!(
        v["rows"]["workload_pristine_corral"]["reused_sandboxes"], 4,
        "{v}"
    );

    // The fork row: P (2) forks of a prepared sandbox, against P prepared.
    let fork = &v["rows"]["fork_prepared"];
    assert_eq!(fork["forks"], 2, "{v}");
    assert!(number(&fork["p50_ms"], "fork") > 0.0, "{v}");
    assert_eq!(v["rows"]["prepare_from_scratch"]["floor"], true, "{v}");
    // The same forks by `docker commit`, to compare the agents' stream with.
    let commit = &v["rows"]["fork_commit"];
    assert_eq!(commit["floor"], false, "{v}");
    assert!(number(&commit["p50_ms"], "fork_commit") > 0.0, "{v}");
    assert!(number(&commit["snapshot_ms"], "snapshot_ms") > 0.0, "{v}");
    // Its snapshots (the delta and the committed image) are gone with the run.
    for suffix in ["fork", "fork-commit"] {
        let snaps = std::process::Command::new("docker")
            .args(["images", "-q", "--filter", "label=corral.snapshot"])
            .args([
                "--filter",
                &format!(
                    "reference=corral-snapshot:{}-{suffix}",
                    v["run_id"].as_str().unwrap_or("")
                ),
            ])
            .output()
            .expect("docker images");
        assert!(
            snaps.stdout.is_empty(),
            "the bench left its {suffix} snapshot"
        );
    }

    let ratios = v["ratios"].as_object().expect("ratios");
    assert_eq!(ratios.len(), 10, "{v}");
    for (id, target) in [
        ("warm_acquire_vs_raw_start", 20.0),
        ("agent_vs_raw_exec", 20.0),
        ("reset_vs_cold_start", 20.0),
        ("workload_vs_plain", 10.0),
        ("workload_pooled_vs_plain", 10.0),
        ("workload_reused_vs_plain", 10.0),
        ("workload_pristine_vs_plain", 10.0),
        ("fork_vs_prepare", 1.0),
        ("fork_stream_vs_commit", 1.0),
        ("workload_commands_vs_plain_exec", 10.0),
    ] {
        let r = &v["ratios"][id];
        let value = number(&r["value"], id);
        assert!(value > 0.0 && value.is_finite(), "{id}: {r}");
        assert_eq!(number(&r["target"], id), target, "{id}");
        assert_eq!(r["met"], value >= target, "{id}: {r}");
    }
    // Targets are set for 16x10 with 8 in parallel, not this run's shape.
    assert_eq!(v["ratios"]["workload_vs_plain"]["target_applies"], false);
    assert_eq!(
        v["ratios"]["workload_commands_vs_plain_exec"]["target_applies"],
        false
    );

    let run = v["run_id"].as_str().expect("run_id");
    for filter in [
        format!("label=corral.bench={run}"),
        format!("label=corral-bench={run}"),
        owner,
    ] {
        assert_eq!(containers(&[&filter]), Vec::<String>::new(), "{filter}");
    }
}

/// Starts a bench, waits until `min` containers match `filter` (and are
/// this bench's), sends `signal`, and checks it exits 130 leaving nothing.
fn interrupt_when(args: &[&str], filter: &str, min: usize, signal: &str) {
    let child = bench(args, Stdio::null());
    let owner = format!("label=corral.owner.pid={}", child.id());
    let deadline = Instant::now() + Duration::from_secs(180);
    while containers(&[filter, &owner]).len() < min {
        assert!(
            Instant::now() < deadline,
            "never saw {min} containers with {filter}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let out = child.wait_with_output().expect("wait corral bench");
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        containers(&["label=corral.bench", &owner]),
        Vec::<String>::new(),
        "an interrupted bench left raw containers"
    );
    assert_eq!(
        containers(&[&owner]),
        Vec::<String>::new(),
        "an interrupted bench left containers"
    );
}

#[test]
fn ctrl_c_removes_raw_containers_and_exits_130() {
    interrupt_when(
        &["--samples", "1000", "--sandboxes", "100"],
        "label=corral.bench",
        1,
        "-INT",
    );
}

#[test]
fn sigterm_while_the_warm_pool_fills_removes_every_sandbox() {
    // Four of this bench's sandboxes at once only happens in the warm-pool
    // row: the provider holds them, or its refill tasks are creating them.
    interrupt_when(&["--samples", "16"], "label=corral-bench", 4, "-TERM");
}

#[test]
fn net_rows_report_the_gateway_and_port_links_against_direct_and_leave_nothing() {
    // The test internet's client image.
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/build-test-images.sh"
    );
    let status = Command::new("bash")
        .args([script, "--net"])
        .status()
        .expect("run build-test-images.sh --net");
    assert!(status.success(), "building corral-test/net failed");
    let child = bench(
        &["--json", "--rows", "net", "--samples", "3"],
        Stdio::piped(),
    );
    let owner = format!("label=corral.owner.pid={}", child.id());
    let out = child.wait_with_output().expect("wait corral bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let rows = v["rows"].as_object().expect("rows");
    let mut ids: Vec<&str> = rows.keys().map(String::as_str).collect();
    ids.sort();
    assert_eq!(
        ids,
        [
            "net_32mib_direct",
            "net_32mib_egress",
            "net_http_direct",
            "net_http_egress",
            "net_https_direct",
            "net_https_egress",
            "port_direct",
            "port_link",
        ],
        "{v}"
    );
    for (id, row) in rows {
        assert!(number(&row["p50_ms"], id) > 0.0, "{id}: {row}");
    }
    for id in ["net_http_egress", "net_https_egress", "port_link"] {
        assert_eq!(rows[id]["n"], 3, "{id}: {}", rows[id]);
    }
    assert_eq!(rows["net_32mib_egress"]["n"], 3);
    assert!(number(&rows["net_32mib_egress"]["mb_per_s"], "rate") > 0.0);
    let ratios = v["ratios"].as_object().expect("ratios");
    assert_eq!(ratios.len(), 4, "{v}");
    for (id, r) in ratios {
        assert!(number(&r["value"], id) > 0.0, "{id}: {r}");
        assert!(number(&r["target"], id) > 0.0, "{id}: {r}");
    }
    // Nothing of the run is left: sandboxes, gateways, raw containers, the
    // test internet's servers and network.
    assert!(containers(&[&owner]).is_empty(), "containers left behind");
    let run = v["run_id"].as_str().expect("run id");
    let servers = containers(&[&format!("name=corral-{run}-net")]);
    assert!(
        servers.is_empty(),
        "the test internet was left: {servers:?}"
    );
    let nets = Command::new("docker")
        .args([
            "network",
            "ls",
            "-q",
            "--filter",
            &format!("name=corral-{run}-net"),
        ])
        .output()
        .expect("docker network ls");
    assert!(
        nets.stdout.is_empty(),
        "the test internet's network was left"
    );

    // A bad --rows is named with its value.
    let out = Command::new(CORRAL)
        .args(["bench", "--rows", "network"])
        .output()
        .expect("run corral bench");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--rows") && err.contains("'network'"), "{err}");
}
