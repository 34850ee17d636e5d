//! `corral agent-image --save`: the archive it writes is an image the real
//! daemon loads and runs, with no registry and no build.

use std::process::Command;

const CORRAL: &str = env!("CARGO_BIN_EXE_corral");

fn run(cmd: &mut Command) -> (bool, String, String) {
    let out = cmd.output().expect("run");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Removes the test's image even when the test fails.
struct Image(String);

impl Drop for Image {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rmi", "-f", &self.0]).output();
    }
}

#[test]
fn the_saved_archive_loads_and_runs_the_agent() {
    let dir = std::env::temp_dir().join(format!("corral-agent-image-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("agent.tar");
    let image = Image(format!("corral-test/agent-archive:{}", std::process::id()));
    let (ok, out, err) = run(Command::new(CORRAL).args([
        "agent-image",
        "--save",
        file.to_str().expect("utf-8 path"),
        "--tag",
        &image.0,
    ]));
    assert!(ok, "{out}{err}");
    assert!(out.contains("kind load image-archive"), "{out}");

    let (ok, out, err) =
        run(Command::new("docker").args(["load", "-i", file.to_str().expect("utf-8 path")]));
    assert!(ok, "docker load refused the archive: {out}{err}");
    assert!(out.contains(&image.0), "{out}");
    // The image's entrypoint is the agent, run as nobody.
    let (ok, out, err) = run(Command::new("docker").args(["run", "--rm", &image.0, "--version"]));
    assert!(ok, "{out}{err}");
    assert_eq!(
        out.trim(),
        format!("corral-agent {}", env!("CARGO_PKG_VERSION"))
    );
    let (ok, out, _) =
        run(Command::new("docker").args(["image", "inspect", "-f", "{{.Config.User}}", &image.0]));
    assert!(ok);
    assert_eq!(out.trim(), "65534:65534");

    // A bad tag is refused, naming it, and nothing is written.
    let bad = dir.join("bad.tar");
    let (ok, _, err) = run(Command::new(CORRAL).args([
        "agent-image",
        "--save",
        bad.to_str().expect("utf-8 path"),
        "--tag",
        "a b",
    ]));
    assert!(!ok && err.contains("'a b'"), "{err}");
    assert!(!bad.exists());
    let _ = std::fs::remove_dir_all(&dir);
}
