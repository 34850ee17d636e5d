//! `corral events` against a real `corral serve` on the real daemon: a
//! scripted lifecycle (create, a command that succeeds, one that exits 3,
//! a reset, a removal) is followed live in order; resuming after an id
//! gives only what came later; filters and the text form; a wrong token
//! is a clear error.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use corral_testing::served::Served;
use serde_json::Value;

use corral_testing::images;

const CORRAL: &str = env!("CARGO_BIN_EXE_corral");
const LABEL: &str = "cli-events";

/// Removes this test's containers however it ends.
struct Sweep;

impl Drop for Sweep {
    fn drop(&mut self) {
        let out = Command::new("docker")
            .args([
                "ps",
                "-aq",
                "--filter",
                &format!("label=corraltest={LABEL}"),
            ])
            .output();
        if let Ok(out) = out {
            let ids = String::from_utf8_lossy(&out.stdout).to_string();
            let ids: Vec<&str> = ids.split_whitespace().collect();
            if !ids.is_empty() {
                let _ = Command::new("docker")
                    .arg("rm")
                    .arg("-f")
                    .args(ids)
                    .output();
            }
        }
    }
}

/// `corral events ARGS` run to its end (it must end by itself: `--count`);
/// exit code, stdout lines, stderr.
fn events(s: &Served, args: &[&str]) -> (i32, Vec<String>, String) {
    let out = Command::new(CORRAL)
        .arg("events")
        .args(["--url", &s.url(), "--token", &s.token])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run corral events");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(String::from)
            .collect(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn kind_outcome(v: &Value) -> String {
    match v["outcome"].as_str() {
        Some(o) => format!("{}:{o}", v["kind"].as_str().unwrap_or("?")),
        None => v["kind"].as_str().unwrap_or("?").to_string(),
    }
}

#[test]
fn corral_events_follows_a_lifecycle_in_order_and_resumes_after_an_id() {
    images();
    let _sweep = Sweep;
    let s = Served::start(CORRAL, LABEL, "");

    // Followed live from before the sandbox exists: `--since 0` replays
    // what the service kept (nothing yet of this sandbox) and follows on.
    let mut follower = Command::new(CORRAL)
        .args(["events", "--url", &s.url(), "--token", &s.token])
        .args(["--since", "0", "--sandbox", "ep", "--json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn corral events");
    let stdout = follower.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });

    let (status, body) = s.call("POST", "/v1/sandboxes", Some(r#"{"session": "ep"}"#));
    assert_eq!(status, 201, "{body}");
    for command in ["true", "exit 3"] {
        let (status, body) = s.call(
            "POST",
            "/v1/sandboxes/ep/exec",
            Some(&serde_json::json!({"command": command}).to_string()),
        );
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = s.call("POST", "/v1/sandboxes/ep/reset", None);
    assert_eq!(status, 200, "{body}");
    let (status, body) = s.call("DELETE", "/v1/sandboxes/ep", None);
    assert!(status < 300, "{status} {body}");

    let mut seen: Vec<Value> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !seen.iter().any(|v| v["kind"] == "removed") && Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(500)) {
            seen.push(serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}")));
        }
    }
    let _ = follower.kill();
    let _ = follower.wait();
    let kinds: Vec<String> = seen.iter().map(kind_outcome).collect();
    assert_eq!(
        kinds,
        [
            "created",
            "command:ok",
            "command:exit",
            "reset:ok",
            "removed"
        ],
        "{seen:?}"
    );
    let ids: Vec<u64> = seen.iter().map(|v| v["id"].as_u64().expect("id")).collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "increasing ids: {ids:?}"
    );
    assert!(seen.iter().all(|v| v["session"] == "ep"), "{seen:?}");

    // Resuming after the failing command's id: only what came later.
    let after = ids[2].to_string();
    let (code, lines, err) = events(
        &s,
        &[
            "--since",
            &after,
            "--sandbox",
            "ep",
            "--json",
            "--count",
            "2",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let later: Vec<String> = lines
        .iter()
        .map(|l| kind_outcome(&serde_json::from_str(l).expect("json")))
        .collect();
    assert_eq!(later, ["reset:ok", "removed"], "{lines:?}");

    // A kind filter, and the text form: one line per event, id first.
    let (code, lines, err) = events(
        &s,
        &[
            "--since",
            "0",
            "--sandbox",
            "ep",
            "--kind",
            "command",
            "--count",
            "2",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(lines.len(), 2, "{lines:?}");
    for (line, (id, outcome)) in lines.iter().zip([(ids[1], "ok"), (ids[2], "exit")]) {
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words[0], id.to_string(), "{line}");
        assert_eq!(words[2], "command", "{line}");
        assert_eq!(words[3], "ep", "{line}");
        assert_eq!(words[5], outcome, "{line}");
        assert_eq!(words[1].len(), "00:00:00.000".len(), "{line}");
    }

    // A wrong token: a clear error, the corral exit code for errors.
    let out = Command::new(CORRAL)
        .args(["events", "--url", &s.url(), "--token", "wrong-token"])
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.starts_with("error: the service at "), "{err}");
    assert!(err.contains("answered 401"), "{err}");
    assert!(
        err.contains(
            "\nhelp: the --token given was refused: give the service's token (its \
             server.token, CORRAL_TOKEN or server.admin_token)\n"
        ),
        "{err}"
    );
    // The same token from the environment: the help names the variable.
    let out = Command::new(CORRAL)
        .args(["events", "--url", &s.url()])
        .env("CORRAL_TOKEN", "wrong-token")
        .env_remove("CORRAL_CONFIG")
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains(
            "\nhelp: the token in CORRAL_TOKEN was refused: set CORRAL_TOKEN (or give --token) \
             to the service's token\n"
        ),
        "{err}"
    );
    // No service there: says where it looked.
    let out = Command::new(CORRAL)
        .args(["events", "--url", "http://127.0.0.1:9"])
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("127.0.0.1:9"), "{err}");
    assert!(
        err.contains(
            "\nhelp: start the service (`corral serve`), or point --url at where it listens\n"
        ),
        "{err}"
    );
}
