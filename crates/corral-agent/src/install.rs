//! `corral-agent install DIR`: copies this binary to `DIR/corral-agent`
//! (mode 0555). The Kubernetes backend's init container runs it from the
//! `FROM scratch` agent image, which has no `cp`, to fill the pod's
//! agent volume.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Copies the running binary into `dir` atomically (a temporary file
/// renamed into place); returns the exit code.
pub fn run(dir: &str) -> i32 {
    match install(Path::new(dir)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("corral-agent: install into {dir}: {e}");
            1
        }
    }
}

fn install(dir: &Path) -> io::Result<()> {
    let me = fs::read("/proc/self/exe")?;
    let tmp = dir.join(".corral-agent.tmp");
    fs::write(&tmp, &me)?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o555))?;
    fs::rename(&tmp, dir.join("corral-agent"))
}
