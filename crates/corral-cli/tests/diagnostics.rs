//! Every `help:` line the CLI prints, provoked for real with the real
//! binary and the real daemon: the error reads `error: WHAT` and the help
//! says what to do next, exactly; colour only on a terminal (a pty made by
//! util-linux's `script`) and never with NO_COLOR; exit codes as before.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::Value;

use corral_testing::images;

const CORRAL: &str = env!("CARGO_BIN_EXE_corral");

/// A directory of this test's own, removed at the end.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("corral-diag-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }

    fn file(&self, name: &str, text: &str) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, text).expect("write");
        path.display().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// corral with `args` and `env`, no config file of the user's and none of
/// the CORRAL_* variables of the environment; (exit code, stdout, stderr).
fn corral(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    images();
    let home = TempDir::new("home");
    let mut cmd = Command::new(CORRAL);
    for (name, _) in std::env::vars() {
        if name.starts_with("CORRAL_") || name == "DOCKER_HOST" || name == "NO_COLOR" {
            cmd.env_remove(name);
        }
    }
    let out = cmd
        .args(args)
        .env("XDG_CONFIG_HOME", &home.0)
        .env("CORRAL_IMAGE", "corral-test/busybox")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run corral");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The `help:` lines of `stderr`.
fn help(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("help: "))
        .collect()
}

#[test]
fn an_unreachable_daemon_names_the_socket_and_how_to_start_one() {
    let (code, out, err) = corral(&["ps"], &[("DOCKER_HOST", "unix:///nonexistent")]);
    assert_eq!(code, 125, "{err}");
    assert_eq!(out, "");
    assert!(
        err.starts_with(
            "error: cannot reach a container daemon: no Docker daemon answered: tried \
             unix:///nonexistent: no such socket\n"
        ),
        "{err}"
    );
    assert_eq!(
        help(&err),
        [
            "start the Docker daemon (or Podman's service), or point DOCKER_HOST or --endpoint \
          at one that runs; `corral doctor` checks the setup"
        ],
        "{err}"
    );
}

#[test]
fn a_missing_image_says_to_pull_or_build_it_and_json_stays_json() {
    let image = format!("corral-test/nope-{}:9", std::process::id());
    let (code, out, err) = corral(&["run", "--image", &image, "--", "true"], &[]);
    assert_eq!(code, 125, "{err}");
    assert_eq!(out, "");
    assert!(
        err.starts_with(&format!(
            "error: image_not_found: image '{image}' is not present"
        )),
        "{err}"
    );
    assert_eq!(
        help(&err),
        [format!(
            "fetch it with `corral pull {image}`, or build it on this host (`docker build -t \
             {image} DIR`); `corral images` lists the images there are"
        )],
        "{err}"
    );
    // With --json the outcome is one JSON object on stdout, nothing else.
    let (code, out, err) = corral(&["run", "--json", "--image", &image, "--", "true"], &[]);
    assert_eq!(code, 125, "{err}");
    let v: Value = serde_json::from_str(&out).expect("one JSON object");
    assert_eq!(v["failure"]["kind"], "image_not_found");
    assert!(!err.contains("error:") && !err.contains("help:"), "{err}");
}

#[test]
fn a_mistyped_config_key_gets_the_closest_real_one() {
    let dir = TempDir::new("config");
    let file = dir.file("corral.yaml", "daemon:\n  start_limt: 3\n");
    let (code, _, err) = corral(&["--config", &file, "ps"], &[]);
    assert_eq!(code, 125, "{err}");
    assert!(
        err.starts_with(&format!(
            "error: config file {file}: daemon.start_limt: unknown field `start_limt`"
        )),
        "{err}"
    );
    assert_eq!(
        help(&err),
        ["did you mean `daemon.start_limit`? (`corral config example` lists every key)"]
    );
    // `corral config check` says the same, with its own exit code.
    let (code, _, err) = corral(&["config", "check", &file], &[]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(
        help(&err),
        ["did you mean `daemon.start_limit`? (`corral config example` lists every key)"]
    );
    // A key nothing is close to: no guess, the list of keys instead.
    let file = dir.file("far.yaml", "daemon:\n  zzzzzzzzzzzz: 3\n");
    let (code, _, err) = corral(&["--config", &file, "ps"], &[]);
    assert_eq!(code, 125, "{err}");
    assert_eq!(
        help(&err),
        ["`corral config example` lists every key with its default"]
    );
}

#[test]
fn a_bad_environment_variable_is_named_with_the_key_it_overrides() {
    let (code, _, err) = corral(&["ps"], &[("CORRAL_START_LIMIT", "lots")]);
    assert_eq!(code, 125, "{err}");
    assert!(
        err.starts_with("error: environment variable CORRAL_START_LIMIT: invalid value 'lots'"),
        "{err}"
    );
    assert_eq!(
        help(&err),
        ["fix or unset CORRAL_START_LIMIT (it overrides the config's daemon.start_limit)"]
    );
}

#[test]
fn an_unknown_sandbox_or_snapshot_points_at_the_list() {
    let wanted = format!("no-such-sandbox-{}", std::process::id());
    let (code, _, err) = corral(&["port", &wanted, "80"], &[]);
    assert_eq!(code, 125, "{err}");
    assert!(
        err.starts_with(&format!("error: no sandbox '{wanted}'\n")),
        "{err}"
    );
    assert_eq!(help(&err), ["`corral ps` lists the sandboxes"]);

    let (code, _, err) = corral(&["snapshots", "rm", &wanted], &[]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.starts_with(&format!(
            "error: invalid snapshot '{wanted}': no such snapshot"
        )),
        "{err}"
    );
    assert_eq!(
        help(&err),
        ["`corral snapshots` lists the snapshots there are"]
    );

    let (code, _, err) = corral(&["man", "nosuch"], &[]);
    assert_eq!(code, 125, "{err}");
    assert!(err.starts_with("error: no command 'nosuch'\n"), "{err}");
    assert_eq!(help(&err), ["`corral --help` lists the commands"]);
}

#[test]
fn a_bad_argument_points_at_the_commands_help() {
    let (code, _, err) = corral(&["top", "--interval-ms", "100"], &[]);
    assert_eq!(code, 125, "{err}");
    assert!(
        err.starts_with("error: invalid --interval-ms '100': below 200\n"),
        "{err}"
    );
    assert_eq!(
        help(&err),
        ["`corral top --help` says what --interval-ms takes"]
    );
    let (code, _, err) = corral(&["port", "some-sandbox", "0"], &[]);
    assert_eq!(code, 125, "{err}");
    assert!(
        err.starts_with("error: invalid PORT '0': a port is 1 to 65535\n"),
        "{err}"
    );
    assert_eq!(help(&err), ["`corral port --help` says what PORT takes"]);
    let (code, _, err) = corral(&["pull", " "], &[]);
    assert_eq!(code, 125, "{err}");
    assert!(
        err.starts_with("error: invalid IMAGE ' ': name an image"),
        "{err}"
    );
    assert_eq!(help(&err), ["`corral pull --help` says what IMAGE takes"]);
}

/// Another holder of the only shared start slot (here `flock`, as another
/// corral process holds it) makes a start wait past the wait limit.
#[test]
fn a_slot_timeout_names_the_flag_that_raises_the_limit() {
    let dir = TempDir::new("slots");
    let slots = dir.0.join("slots");
    std::fs::create_dir_all(&slots).expect("slot dir");
    let lock = slots.join("start-0.lock");
    std::fs::write(&lock, "").expect("slot file");
    let mut holder = Command::new("flock")
        .arg(&lock)
        .args(["sleep", "60"])
        .spawn()
        .expect("flock");
    // flock takes the lock before it runs sleep.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !Command::new("flock")
        .args(["-n", "-E", "7"])
        .arg(&lock)
        .arg("true")
        .status()
        .is_ok_and(|s| s.code() == Some(7))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "flock never held the slot"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let config = dir.file(
        "corral.yaml",
        &format!(
            "daemon:\n  slot_dir: {}\n  slot_wait_timeout_ms: 500\n",
            slots.display()
        ),
    );
    let (code, _, err) = corral(
        &[
            "--config",
            &config,
            "--start-limit",
            "1",
            "run",
            "--",
            "true",
        ],
        &[],
    );
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(code, 125, "{err}");
    assert!(
        err.starts_with("error: daemon_unavailable: no start slot came free within"),
        "{err}"
    );
    assert_eq!(
        help(&err),
        [
            "raise --start-limit (or CORRAL_START_LIMIT, daemon.start_limit; now 1, 0: unlimited) \
          or daemon.slot_wait_timeout_ms, or run fewer corral processes at once"
        ],
        "{err}"
    );
}

#[test]
fn a_command_past_its_timeout_or_memory_names_the_flag() {
    let (code, _, err) = corral(&["run", "--timeout", "0.5", "--", "sleep 30"], &[]);
    assert_eq!(code, 124, "{err}");
    assert!(err.starts_with("error: timeout: "), "{err}");
    assert_eq!(
        help(&err),
        ["the command ran past its --timeout; give it more seconds"]
    );
    let (code, _, err) = corral(
        &[
            "run",
            "--memory",
            "48m",
            "--",
            "dd if=/dev/zero of=/dev/null bs=300M count=1",
        ],
        &[],
    );
    assert_eq!(code, 137, "{err}");
    assert!(err.contains("error: oom_killed: "), "{err}");
    assert_eq!(
        help(&err),
        ["the sandbox ran out of memory; raise --memory (e.g. 2g)"]
    );
}

/// `COMMAND` run on a pseudo-terminal (util-linux `script`); what the
/// terminal showed.
fn on_a_terminal(command: &str, env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new("script");
    for (name, _) in std::env::vars() {
        if name.starts_with("CORRAL_") || name == "NO_COLOR" {
            cmd.env_remove(name);
        }
    }
    let out = cmd
        .args(["-qec", command, "/dev/null"])
        .env("TERM", "xterm")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("script");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn colour_only_on_a_terminal_and_never_with_no_color() {
    let command = format!("DOCKER_HOST=unix:///nonexistent {CORRAL} ps");
    let shown = on_a_terminal(&command, &[]);
    assert!(shown.contains("\x1b[1;31merror\x1b[0m"), "{shown:?}");
    assert!(
        shown.contains("\x1b[1;36mhelp\x1b[0m: start the Docker daemon"),
        "{shown:?}"
    );
    let plain = on_a_terminal(&command, &[("NO_COLOR", "1")]);
    assert!(!plain.contains('\x1b'), "{plain:?}");
    assert!(
        plain.contains("error: cannot reach a container daemon"),
        "{plain:?}"
    );
    // Off a terminal: no colour either.
    let (_, _, err) = corral(&["ps"], &[("DOCKER_HOST", "unix:///nonexistent")]);
    assert!(!err.contains('\x1b'), "{err:?}");
}
