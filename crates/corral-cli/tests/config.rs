//! The configuration file as a user meets it: `corral config check/show`,
//! precedence of flags over environment over file, and `corral run` taking
//! its base spec from the file, against the real daemon.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use corral_testing::images;

const CORRAL: &str = env!("CARGO_BIN_EXE_corral");
const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/corral.yaml");

/// A scratch directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "corral-config-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch(dir)
    }

    fn file(&self, name: &str, text: &str) -> String {
        let path = self.0.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("create parent dir");
        }
        std::fs::write(&path, text).expect("write config file");
        path.to_string_lossy().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs corral with `args` and `env`, isolated from the caller's own
/// config file and CORRAL_* variables (the default file is looked up under
/// `xdg`); checks that it left no container behind.
fn corral(xdg: &Path, args: &[&str], env: &[(&str, &str)]) -> Out {
    let mut cmd = Command::new(CORRAL);
    cmd.args(args)
        .env("XDG_CONFIG_HOME", xdg)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, _) in std::env::vars() {
        if name.starts_with("CORRAL_") {
            cmd.env_remove(name);
        }
    }
    cmd.envs(env.iter().copied());
    let child = cmd.spawn().expect("spawn corral");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait corral");
    let left = Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=corral.owner.pid={pid}"),
        ])
        .output()
        .expect("docker ps");
    assert_eq!(
        String::from_utf8_lossy(&left.stdout).trim(),
        "",
        "corral {args:?} left containers behind"
    );
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).to_string(),
    }
}

#[test]
fn check_accepts_the_example_file() {
    let s = Scratch::new();
    let out = corral(&s.0, &["config", "check", EXAMPLE], &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stdout, format!("ok: {EXAMPLE}\n"));
    // `config example` prints that same file.
    let out = corral(&s.0, &["config", "example"], &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let file = std::fs::read_to_string(EXAMPLE).expect("read example");
    assert_eq!(out.stdout, file);
}

#[test]
fn check_names_a_mistyped_key() {
    let s = Scratch::new();
    let f = s.file("typo.yaml", "daemon:\n  start_limt: 4\n");
    let out = corral(&s.0, &["config", "check", &f], &[]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert!(
        out.stderr
            .contains("daemon.start_limt: unknown field `start_limt`"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("line 2"), "{}", out.stderr);
    assert!(out.stdout.is_empty(), "{}", out.stdout);
}

#[test]
fn check_names_a_bad_value_and_its_key() {
    let s = Scratch::new();
    let f = s.file("type.yaml", "daemon:\n  start_limit: lots\n");
    let out = corral(&s.0, &["config", "check", &f], &[]);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr
            .contains("daemon.start_limit: invalid type: string \"lots\""),
        "{}",
        out.stderr
    );

    let f = s.file(
        "range.yaml",
        "profiles:\n  python:\n    limits: {memory: 1024}\n",
    );
    let out = corral(&s.0, &["config", "check", &f], &[]);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr
            .contains("profiles.python.limits.memory: invalid value '1024'"),
        "{}",
        out.stderr
    );

    // Mount paths are checked against this host.
    let f = s.file(
        "mount.yaml",
        "defaults:\n  mounts: [{host: /no/such/dir, container: /data}]\n",
    );
    let out = corral(&s.0, &["config", "check", &f], &[]);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr
            .contains("defaults.mounts[0].host: invalid value '/no/such/dir'"),
        "{}",
        out.stderr
    );

    // A bad environment override names the variable and the value.
    let out = corral(
        &s.0,
        &["config", "check", EXAMPLE],
        &[("CORRAL_MAX_LIVE", "many")],
    );
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("CORRAL_MAX_LIVE: invalid value 'many'"),
        "{}",
        out.stderr
    );

    // Every other command refuses to start on a bad file.
    let f = s.file("bad.yaml", "daemon:\n  start_limit: lots\n");
    let out = corral(&s.0, &["--config", &f, "ps"], &[]);
    assert_eq!(out.code, 125);
    assert!(out.stderr.contains("daemon.start_limit"), "{}", out.stderr);
}

#[test]
fn show_applies_flags_over_env_over_file() {
    let s = Scratch::new();
    let f = s.file(
        "c.yaml",
        "daemon:\n  start_limit: 5\n  exec_limit: 5\nprovider:\n  max_live: 5\n",
    );
    let out = corral(
        &s.0,
        &["--config", &f, "--exec-limit", "2", "config", "show"],
        &[("CORRAL_EXEC_LIMIT", "3"), ("CORRAL_MAX_LIVE", "7")],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("\n  start_limit: 5\n"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("\n  exec_limit: 2\n"), "{}", out.stdout);
    assert!(out.stdout.contains("\n  max_live: 7\n"), "{}", out.stdout);

    // CORRAL_CONFIG names the file too; without either, the default file
    // under $XDG_CONFIG_HOME is read when it exists.
    let out = corral(&s.0, &["config", "show"], &[("CORRAL_CONFIG", &f)]);
    assert!(out.stdout.contains("\n  max_live: 5\n"), "{}", out.stdout);
    let out = corral(&s.0, &["config", "show"], &[]);
    assert!(out.stdout.contains("\n  max_live: 64\n"), "{}", out.stdout);
    s.file("corral/config.yaml", "provider: {max_live: 9}\n");
    let out = corral(&s.0, &["config", "show"], &[]);
    assert!(out.stdout.contains("\n  max_live: 9\n"), "{}", out.stdout);
}

const RUN_CONFIG: &str = "defaults:
  image: corral-test/busybox
  env: [{name: GREETING, value: hi}, {name: ONLY_DEFAULTS, value: 'yes'}]
profiles:
  greet:
    image: corral-test/busybox
    env: [{name: GREETING, value: hello-from-profile}]
";

#[test]
fn run_starts_from_the_configs_defaults() {
    images();
    let s = Scratch::new();
    let f = s.file("run.yaml", RUN_CONFIG);
    let out = corral(
        &s.0,
        &["run", "--config", &f, "--", "echo $GREETING $ONLY_DEFAULTS"],
        &[],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stdout, "hi yes\n");

    // A flag replaces the file's variable of the same name.
    let out = corral(
        &s.0,
        &[
            "run",
            "--config",
            &f,
            "-e",
            "GREETING=flag",
            "--",
            "echo $GREETING",
        ],
        &[],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stdout, "flag\n");
}

#[test]
fn run_profile_selects_a_named_spec() {
    images();
    let s = Scratch::new();
    let f = s.file("run.yaml", RUN_CONFIG);
    let out = corral(
        &s.0,
        &[
            "run",
            "--config",
            &f,
            "--profile",
            "greet",
            "--",
            "echo $GREETING ${ONLY_DEFAULTS:-unset}",
        ],
        &[],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    // A profile is a spec of its own: `defaults:` does not leak into it.
    assert_eq!(out.stdout, "hello-from-profile unset\n");

    let out = corral(
        &s.0,
        &["run", "--config", &f, "--profile", "ruby", "--", "true"],
        &[],
    );
    assert_eq!(out.code, 125);
    assert!(
        out.stderr
            .contains("'ruby': no such profile: known profiles are greet"),
        "{}",
        out.stderr
    );
}
