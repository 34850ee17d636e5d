//! Where corral keeps per-user runtime files on the host (slot locks, the
//! network lock), decided from facts the caller reads: pure.

use std::path::{Path, PathBuf};

/// The per-user runtime directory: `$XDG_RUNTIME_DIR/corral` when set and
/// not empty, else `<tmp>/corral-<uid>`.
pub fn user_runtime_dir(xdg_runtime_dir: Option<&Path>, tmp: &Path, uid: u32) -> PathBuf {
    match xdg_runtime_dir {
        Some(d) if !d.as_os_str().is_empty() => d.join("corral"),
        _ => tmp.join(format!("corral-{uid}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xdg_wins_when_set() {
        let tmp = Path::new("/tmp");
        assert_eq!(
            user_runtime_dir(Some(Path::new("/run/user/7")), tmp, 7),
            PathBuf::from("/run/user/7/corral")
        );
        assert_eq!(
            user_runtime_dir(Some(Path::new("")), tmp, 7),
            PathBuf::from("/tmp/corral-7")
        );
        assert_eq!(
            user_runtime_dir(None, tmp, 0),
            PathBuf::from("/tmp/corral-0")
        );
    }
}
