//! Progress bars of the real binary against the real daemon: on a
//! pseudo-terminal (util-linux `script`) the bar's last line is what the
//! user is left with; off a terminal, and with --quiet, nothing of a bar is
//! written.

use std::process::{Command, Stdio};

use serde_json::Value;

use corral_testing::images;

const CORRAL: &str = env!("CARGO_BIN_EXE_corral");
const LABEL: &str = "cli-progress";

/// Removes this test's containers however it ends.
struct Sweep;

impl Drop for Sweep {
    fn drop(&mut self) {
        let ids = docker(&[
            "ps",
            "-aq",
            "--filter",
            &format!("label=corraltest={LABEL}"),
        ]);
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

fn docker(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().expect("docker");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `n` containers that look like sandboxes whose corral process is gone
/// (a sandbox label and no owner): what `corral gc` removes.
fn orphans(tag: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let id = format!("gcbar-{tag}-{}-{i}", std::process::id());
            let out = Command::new("docker")
                .args(["create", "--label", &format!("corral.sandbox={id}")])
                .args(["--label", &format!("corraltest={LABEL}")])
                .args(["corral-test/busybox", "true"])
                .output()
                .expect("docker create");
            assert!(out.status.success(), "{out:?}");
            id
        })
        .collect()
}

/// A config file that keeps the gc's own process from reaping orphans in
/// the background (the gc itself is what is watched).
fn no_reaper() -> String {
    let path = std::env::temp_dir().join(format!("corral-progress-{}.yaml", std::process::id()));
    std::fs::write(&path, "daemon:\n  reap_orphans: false\n").expect("config");
    path.display().to_string()
}

/// `command` on a pseudo-terminal; everything the terminal showed.
fn on_a_terminal(command: &str) -> String {
    let out = Command::new("script")
        .args(["-qec", command, "/dev/null"])
        .env("TERM", "xterm")
        .env("CORRAL_IMAGE", "corral-test/busybox")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .output()
        .expect("script");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// corral with its stderr a pipe: (exit code, stdout, stderr).
fn off_a_terminal(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(CORRAL)
        .args(args)
        .env("CORRAL_IMAGE", "corral-test/busybox")
        .stdin(Stdio::null())
        .output()
        .expect("corral");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The `A/B` before `what` in the bar's last line.
fn counted(shown: &str, what: &str) -> Option<(usize, usize)> {
    let at = shown.rfind(what)?;
    let before = shown[..at].trim_end();
    let word = before.rsplit(|c: char| c.is_whitespace()).next()?;
    let (a, b) = word.split_once('/')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

fn assert_no_bar(stderr: &str) {
    assert!(!stderr.contains('\x1b'), "escape codes: {stderr:?}");
    assert!(!stderr.contains('\r'), "carriage returns: {stderr:?}");
    assert!(!stderr.contains("[="), "a bar: {stderr:?}");
}

#[test]
fn gc_counts_the_sandboxes_it_removes_on_a_terminal_only() {
    images();
    let _sweep = Sweep;
    let config = no_reaper();

    let mine = orphans("tty", 3);
    let shown = on_a_terminal(&format!("{CORRAL} --config {config} gc"));
    // Another corral process on this daemon may reap an orphan first; the
    // ones this gc removed are listed, and the bar counted all it removed.
    let listed = mine
        .iter()
        .filter(|id| shown.contains(&format!("removed {id} ")))
        .count();
    let (done, total) = counted(&shown, "sandboxes removed").unwrap_or_else(|| {
        panic!("no bar's last line: {shown:?}");
    });
    assert_eq!(done, total, "{shown:?}");
    assert!(listed >= 1 && total >= listed, "{shown:?}");
    assert!(shown.contains("sandboxes removed, "), "{shown:?}");
    for id in &mine {
        assert_eq!(
            docker(&[
                "ps",
                "-aq",
                "--filter",
                &format!("label=corral.sandbox={id}")
            ]),
            ""
        );
    }

    // --quiet on a terminal: no bar.
    let mine = orphans("quiet", 2);
    let shown = on_a_terminal(&format!("{CORRAL} --config {config} --quiet gc"));
    assert!(
        shown.contains(&format!("removed {} ", mine[0])) || shown.contains(" removed, "),
        "{shown:?}"
    );
    assert!(!shown.contains("sandboxes removed"), "{shown:?}");

    // Off a terminal: the same work, no bar.
    let mine = orphans("pipe", 2);
    let (code, out, err) = off_a_terminal(&["--config", &config, "gc"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(" removed, "), "{out}");
    assert!(!err.contains("sandboxes removed"), "{err:?}");
    assert_no_bar(&err);
    for id in &mine {
        assert_eq!(
            docker(&[
                "ps",
                "-aq",
                "--filter",
                &format!("label=corral.sandbox={id}")
            ]),
            ""
        );
    }
    let _ = std::fs::remove_file(&config);
}

#[test]
fn a_starting_run_shows_a_spinner_on_a_terminal_only() {
    images();
    let shown = on_a_terminal(&format!("{CORRAL} run -- echo ran-it"));
    assert!(shown.contains("ran-it"), "{shown:?}");
    // The spinner names the image and the phase of the start it is in.
    assert!(shown.contains("corral-test/busybox: "), "{shown:?}");
    let quiet = on_a_terminal(&format!("{CORRAL} --quiet run -- echo ran-it"));
    assert!(quiet.contains("ran-it"), "{quiet:?}");
    assert!(!quiet.contains("corral-test/busybox: "), "{quiet:?}");
    // --json on a terminal: stdout is the JSON object, and no spinner.
    let json = on_a_terminal(&format!("{CORRAL} run --json -- echo ran-it"));
    assert!(!json.contains("corral-test/busybox: "), "{json:?}");
    let (code, out, err) = off_a_terminal(&["run", "--", "echo ran-it"]);
    assert_eq!((code, out.as_str()), (0, "ran-it\n"), "{err}");
    assert!(!err.contains("corral-test/busybox: "), "{err:?}");
    assert_no_bar(&err);
}

#[test]
fn workload_counts_sandboxes_done_on_a_terminal_only() {
    images();
    let args = "workload --sandboxes 3 --commands 1 --parallel 3";
    let shown = on_a_terminal(&format!("{CORRAL} {args}"));
    assert!(
        shown.contains("3 sandboxes done, 3/3 commands ok"),
        "{shown:?}"
    );
    let argv: Vec<&str> = args.split(' ').collect();
    let (code, out, err) = off_a_terminal(&argv);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).expect("the JSON summary alone on stdout");
    assert_eq!(v["commands_ok"], 3);
    assert!(!err.contains("sandboxes done"), "{err:?}");
    assert_no_bar(&err);
}

/// `corral serve` with a warm pool of two, on a terminal: the bar ends at
/// 2/2 once both are started; SIGTERM then removes them. Off a terminal
/// the same service draws nothing.
#[test]
fn serve_counts_its_warm_pools_filling_on_a_terminal_only() {
    use std::io::Read;
    use std::time::{Duration, Instant};

    images();
    let config = std::env::temp_dir().join(format!("corral-pools-{}.yaml", std::process::id()));
    std::fs::write(
        &config,
        "provider:\n  pools:\n    quick:\n      spec:\n        image: corral-test/busybox\n      \
         warm: 2\n",
    )
    .expect("config");
    let config = config.display().to_string();
    let serve = format!("exec {CORRAL} --config {config} serve --listen 127.0.0.1:0");

    let mut script = Command::new("script")
        .args(["-qec", &serve, "/dev/null"])
        .env("TERM", "xterm")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("script");
    let mut stdout = script.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut shown = String::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    while !shown.contains("sandboxes warm (pools quick)") && Instant::now() < deadline {
        if let Ok(bytes) = rx.recv_timeout(Duration::from_millis(200)) {
            shown.push_str(&String::from_utf8_lossy(&bytes));
        }
    }
    // corral serve is script's child (exec'd by its shell): SIGTERM ends it
    // and its pool.
    let children = Command::new("pgrep")
        .args(["-P", &script.id().to_string()])
        .output()
        .expect("pgrep");
    for pid in String::from_utf8_lossy(&children.stdout).split_whitespace() {
        let _ = Command::new("kill").args(["-TERM", pid]).status();
    }
    let ended = Instant::now() + Duration::from_secs(60);
    while script.try_wait().ok().flatten().is_none() && Instant::now() < ended {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = script.kill();
    let _ = script.wait();
    while let Ok(bytes) = rx.recv_timeout(Duration::from_millis(200)) {
        shown.push_str(&String::from_utf8_lossy(&bytes));
    }
    assert!(
        shown.contains("2/2 sandboxes warm (pools quick)"),
        "{shown:?}"
    );
    assert!(shown.contains("corral serve: shutting down"), "{shown:?}");

    // Off a terminal: the service starts its pool and draws nothing.
    let serve = Command::new(CORRAL)
        .args(["--config", &config, "serve", "--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve");
    std::thread::sleep(Duration::from_secs(3));
    let _ = Command::new("kill")
        .args(["-TERM", &serve.id().to_string()])
        .status();
    let out = serve.wait_with_output().expect("serve ends");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("corral serve: listening on"), "{err}");
    assert!(!err.contains("sandboxes warm"), "{err:?}");
    assert_no_bar(&err);
    let _ = std::fs::remove_file(&config);
}

#[test]
fn doctor_shows_its_phase_on_a_terminal_only() {
    images();
    let shown = on_a_terminal(&format!("{CORRAL} doctor"));
    assert!(shown.contains("checking the daemon"), "{shown:?}");
    assert!(
        shown.contains("probing a sandbox from corral-test/busybox"),
        "{shown:?}"
    );
    assert!(shown.contains("protections in force"), "{shown:?}");
    let (_, out, err) = off_a_terminal(&["doctor"]);
    assert!(out.contains("protections in force"), "{out}");
    assert!(!err.contains("checking the daemon"), "{err:?}");
    assert_no_bar(&err);
}

/// While another holder has the only shared start slot (here `flock`, as
/// another corral process holds it), `corral run`'s spinner says it waits
/// for one; the run goes on when the slot is free.
#[test]
fn a_run_waiting_for_a_start_slot_says_so() {
    use std::time::{Duration, Instant};

    images();
    let dir = std::env::temp_dir().join(format!("corral-progress-slots-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("slot dir");
    let lock = dir.join("start-0.lock");
    std::fs::write(&lock, "").expect("slot file");
    let mut holder = Command::new("flock")
        .arg(&lock)
        .args(["sleep", "3"])
        .spawn()
        .expect("flock");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !Command::new("flock")
        .args(["-n", "-E", "7"])
        .arg(&lock)
        .arg("true")
        .status()
        .is_ok_and(|s| s.code() == Some(7))
    {
        assert!(Instant::now() < deadline, "flock never held the slot");
        std::thread::sleep(Duration::from_millis(20));
    }
    let config = dir.join("corral.yaml");
    std::fs::write(&config, format!("daemon:\n  slot_dir: {}\n", dir.display())).expect("config");
    let shown = on_a_terminal(&format!(
        "{CORRAL} --config {} --start-limit 1 run -- echo ran-it",
        config.display()
    ));
    let _ = holder.kill();
    let _ = holder.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        shown.contains("waiting for a start slot (--start-limit)"),
        "{shown:?}"
    );
    assert!(shown.contains("ran-it"), "{shown:?}");
}
