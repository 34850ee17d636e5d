//! `corral top` driven as a person would: in a real 80x24 terminal (tmux),
//! the test's sandbox shows up with its usage, a key re-sorts, q quits.
//! The screen it showed is kept in `target/test-artifacts/corral-top.txt`.
//! `--once` prints the same rows without a terminal.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral::{CommandSpec, Runtime, RuntimeConfig, SandboxSpec};
use corral_docker::{DockerBackend, DockerConfig};

use corral_testing::images;

const CORRAL: &str = env!("CARGO_BIN_EXE_corral");
const LABEL: &str = "cli-top";

/// Ends the tmux session and removes this test's containers however the
/// test ends.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.0])
            .output();
        if let Ok(out) = Command::new("docker")
            .args([
                "ps",
                "-aq",
                "--filter",
                &format!("label=corraltest={LABEL}"),
            ])
            .output()
        {
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

fn tmux(args: &[&str]) -> String {
    let out = Command::new("tmux")
        .args(args)
        .output()
        .expect("run tmux (apt-get install tmux)");
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Polls the pane until `want` holds (a generous bound: the thing tested
/// is that it shows at all).
fn screen_until(session: &str, want: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let screen = tmux(&["capture-pane", "-p", "-t", session]);
        if want(&screen) || Instant::now() > deadline {
            return screen;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corral_top_shows_the_sandbox_in_an_80x24_terminal_and_quits_on_q() {
    images();
    let session = format!("corral-top-{}", std::process::id());
    let _cleanup = Cleanup(session.clone());
    let docker = DockerBackend::connect(&DockerConfig::default())
        .await
        .expect("a Docker daemon");
    let rt = Runtime::new(
        Arc::new(docker),
        RuntimeConfig {
            reap_orphans: false,
            ..RuntimeConfig::default()
        },
    );
    let mut spec = SandboxSpec::new("corral-test/busybox");
    spec.labels.insert("corraltest".into(), LABEL.into());
    spec.limits.memory = Some(192 << 20);
    let sb = rt.create(&spec).await.expect("start a sandbox");
    let out = sb
        .run(&CommandSpec::shell(
            "dd if=/dev/zero of=/dev/shm/fill bs=1M count=32 2>/dev/null; true",
        ))
        .await;
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    let shown_id: String = sb.id().chars().take(15).collect();

    // Without a terminal: one snapshot as text.
    let once = Command::new(CORRAL)
        .args(["top", "--once", "--sort", "mem"])
        .output()
        .expect("run");
    let text = String::from_utf8_lossy(&once.stdout);
    assert!(
        once.status.success(),
        "{}",
        String::from_utf8_lossy(&once.stderr)
    );
    let row = text
        .lines()
        .find(|l| l.starts_with(&shown_id))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(row.contains("/192M"), "memory against its limit: {row}");

    // In a real terminal.
    tmux(&[
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "80",
        "-y",
        "24",
        &format!("{CORRAL} top --interval-ms 500"),
    ]);
    let screen = screen_until(&session, |s| s.contains(&shown_id) && s.contains("/192M"));
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/test-artifacts");
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join("corral-top.txt"), &screen);
    assert!(screen.contains("corral top:"), "{screen}");
    assert!(
        screen.contains(&shown_id),
        "the test's sandbox is shown:\n{screen}"
    );
    assert!(
        screen.lines().all(|l| l.chars().count() <= 80),
        "fits 80 columns:\n{screen}"
    );
    tmux(&["send-keys", "-t", &session, "i"]);
    let screen = screen_until(&session, |s| s.contains("sort Id"));
    assert!(screen.contains("sort Id"), "a key re-sorts:\n{screen}");
    tmux(&["send-keys", "-t", &session, "q"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while Command::new("tmux")
        .args(["has-session", "-t", &session])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
    {
        assert!(Instant::now() < deadline, "q quits corral top");
        std::thread::sleep(Duration::from_millis(200));
    }
    sb.destroy().await.expect("destroy");
}
