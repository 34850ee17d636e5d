//! The hand-over of a generated token to local clients, as Jupyter does it:
//! when no token is configured, `corral serve` makes one at start and writes
//! it, with the service's URL, to `server-<ip>-<port>.json` (mode 0600) in
//! the runtime directory (mode 0700, see `Config::runtime_dir`); the file is
//! removed at shutdown. Only the user running the service (and root) can
//! read it, so other local users and their processes cannot use a loopback
//! service they can reach; the Python client reads it for a loopback URL.
//!
//! ```json
//! {"url": "http://127.0.0.1:7070", "listen": "127.0.0.1:7070", "port": 7070,
//!  "unix_socket": null, "pid": 4242, "token": "..."}
//! ```

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;

/// Bytes of randomness in a generated token (256 bits).
const TOKEN_BYTES: usize = 32;

/// A fresh token: 64 hex digits from the kernel's random source.
pub fn generate_token() -> anyhow::Result<String> {
    let mut buf = [0u8; TOKEN_BYTES];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .context("cannot read /dev/urandom to generate the service's token")?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// What the file says.
#[derive(Serialize)]
struct Contents<'a> {
    url: String,
    listen: String,
    port: u16,
    unix_socket: Option<&'a str>,
    pid: u32,
    token: &'a str,
}

/// The token file of one listen address; removed when dropped.
#[derive(Debug)]
pub struct TokenFile {
    path: PathBuf,
}

impl TokenFile {
    /// Writes the token of the service listening on `listen` into `dir`
    /// (created 0700; refused when it is a symlink, is not owned by this
    /// user, or others may write or read it).
    pub fn write(
        dir: &Path,
        listen: SocketAddr,
        unix_socket: Option<&str>,
        token: &str,
    ) -> anyhow::Result<TokenFile> {
        private_dir(dir)?;
        let host = match listen.ip() {
            IpAddr::V4(ip) => ip.to_string(),
            IpAddr::V6(ip) => format!("[{ip}]"),
        };
        let name = format!("server-{host}-{}.json", listen.port());
        let path = dir.join(&name);
        let contents = Contents {
            url: format!("http://{host}:{}", listen.port()),
            listen: format!("{host}:{}", listen.port()),
            port: listen.port(),
            unix_socket,
            pid: std::process::id(),
            token,
        };
        let text = serde_json::to_string(&contents).context("token file contents")?;
        // Written whole under a temporary name, then renamed over any file a
        // killed service left for the same address.
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| {
                f.write_all(text.as_bytes())?;
                f.write_all(b"\n")?;
                f.sync_all()
            })
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e)
                .with_context(|| format!("cannot write the token file {}", path.display()));
        }
        Ok(TokenFile { path })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TokenFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Makes `dir` (and its parents) 0700, or checks that only this user can
/// use the one that exists ([`corral::host::private_dir`]: a directory it
/// did not make is never changed).
fn private_dir(dir: &Path) -> anyhow::Result<()> {
    corral::host::private_dir(dir, false).map_err(|why| {
        anyhow::anyhow!(
            "the runtime directory {} {why}: refusing to put the service's token there (set \
             server.runtime_dir or CORRAL_RUNTIME_DIR)",
            dir.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn the_file_is_private_and_removed_on_drop() {
        let root =
            std::env::temp_dir().join(format!("corral-rt-{}", generate_token().expect("token")));
        let dir = root.join("a/b");
        let token = generate_token().expect("token");
        assert_eq!(token.len(), 64);
        assert_ne!(token, generate_token().expect("token"));
        let file = TokenFile::write(&dir, "127.0.0.1:7070".parse().expect("addr"), None, &token)
            .expect("written");
        assert_eq!(file.path(), dir.join("server-127.0.0.1-7070.json"));
        let meta = std::fs::metadata(file.path()).expect("file");
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(&dir).expect("dir").mode() & 0o777, 0o700);
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(file.path()).expect("read"))
                .expect("json");
        assert_eq!(v["token"], token.as_str());
        assert_eq!(v["url"], "http://127.0.0.1:7070");
        let v6 = TokenFile::write(&dir, "[::1]:80".parse().expect("addr"), Some("/s"), "t")
            .expect("written");
        assert!(v6.path().ends_with("server-[::1]-80.json"));
        let path = file.path().to_path_buf();
        drop(file);
        assert!(!path.exists());
        drop(v6);
        let _ = std::fs::remove_dir_all(&root);
    }

    /// A shared directory (a 1777 copy of /tmp, one others may read) is
    /// refused by name and left as it is, never made 0700.
    #[test]
    fn a_directory_others_may_use_is_refused_and_left_alone() {
        let root =
            std::env::temp_dir().join(format!("corral-rt-{}", generate_token().expect("token")));
        for mode in [0o1777, 0o755, 0o750] {
            std::fs::create_dir_all(&root).expect("dir");
            std::fs::set_permissions(&root, std::fs::Permissions::from_mode(mode)).expect("chmod");
            let e = TokenFile::write(&root, "127.0.0.1:7070".parse().expect("addr"), None, "t")
                .expect_err("a shared directory");
            let text = format!("{e:#}");
            assert!(text.contains(&root.display().to_string()), "{text}");
            assert!(text.contains(&format!("mode {mode:04o}")), "{text}");
            assert!(text.contains("server.runtime_dir"), "{text}");
            let after = std::fs::metadata(&root).expect("dir").mode() & 0o7777;
            assert_eq!(after, mode, "the directory's mode was changed");
            assert!(!root.join("server-127.0.0.1-7070.json").exists());
            std::fs::remove_dir(&root).expect("empty");
        }
    }
}
