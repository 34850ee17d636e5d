//! `corral-agent install DIR`, as the Kubernetes backend's init container
//! runs it: the binary lands in DIR, whole and executable, and a bad
//! directory is an error naming it.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

const AGENT: &str = env!("CARGO_BIN_EXE_corral-agent");

#[test]
fn copies_itself_whole_and_executable() {
    let dir = std::env::temp_dir().join(format!("corral-install-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let out = Command::new(AGENT)
        .arg("install")
        .arg(&dir)
        .output()
        .expect("run the agent");
    assert!(out.status.success(), "{out:?}");
    let installed = dir.join("corral-agent");
    let copy = std::fs::read(&installed).expect("installed");
    assert!(
        copy == std::fs::read(AGENT).expect("agent"),
        "a different binary"
    );
    let mode = std::fs::metadata(&installed)
        .expect("meta")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o555);
    assert!(!dir.join(".corral-agent.tmp").exists());
    // The copy runs.
    let v = Command::new(&installed)
        .arg("--version")
        .output()
        .expect("run the copy");
    assert!(String::from_utf8_lossy(&v.stdout).starts_with("corral-agent "));
    std::fs::remove_dir_all(&dir).expect("clean up");

    let missing = dir.join("nope");
    let out = Command::new(AGENT)
        .arg("install")
        .arg(&missing)
        .output()
        .expect("run the agent");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&missing.display().to_string()), "{err}");
}
