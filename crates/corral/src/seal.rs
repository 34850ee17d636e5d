//! Proof that a persistent container was made by this user's corral, for
//! one session and one spec, so that adoption never attaches to a planted
//! container.
//!
//! Labels alone prove nothing: anyone who can create containers on the
//! daemon can copy them. A persistent container therefore also carries
//! `corral.spec` (the SHA-256 of the spec it was made from) and
//! `corral.seal`, an HMAC-SHA256 of its sandbox id, session key and spec
//! digest under a per-user secret key kept in a 0600 file. Without the key
//! nobody can make a seal that verifies. A seal can still be copied onto
//! another container along with the labels; the provider therefore also
//! records the id of the container it made in the session's private
//! directory, and adopts only the container with that id (see
//! `provider.rs`).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use corral_core::labels;
use corral_core::{SandboxSpec, SpecError};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// Where the key comes from, for error messages (the configuration key).
pub const KEY_FIELD: &str = "daemon.seal_key_file";

/// The per-user key file: `$XDG_DATA_HOME/corral/seal.key`, else
/// `~/.local/share/corral/seal.key`, else `<tmp>/corral-<uid>/seal.key`.
pub fn default_key_path() -> PathBuf {
    let data = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .filter(|d| d.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .filter(|h| h.is_absolute())
                .map(|h| h.join(".local/share"))
        });
    match data {
        Some(d) => d.join("corral").join("seal.key"),
        None => std::env::temp_dir()
            .join(format!("corral-{}", crate::workspace::euid()))
            .join("seal.key"),
    }
}

/// The user's secret key.
pub struct SealKey {
    key: [u8; 32],
}

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealKey(..)")
    }
}

/// What a container's labels say about who made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Made by this user's corral for this session (the seal verifies);
    /// `spec_matches` tells whether from the spec asked for now.
    Sealed {
        /// The container's spec digest equals the expected one.
        spec_matches: bool,
    },
    /// No seal, a seal for another session, or one that does not verify:
    /// not provably ours.
    Unsealed,
}

fn key_error(path: &Path, reason: impl Into<String>) -> SpecError {
    SpecError {
        field: KEY_FIELD.into(),
        value: path.display().to_string(),
        reason: reason.into(),
    }
}

impl SealKey {
    /// A key from bytes (tests).
    pub fn from_bytes(key: [u8; 32]) -> SealKey {
        SealKey { key }
    }

    /// Reads the key at `path`, making a new random one (0600, in a 0700
    /// directory) when there is none. A key file that is not a regular file
    /// owned by this user, or that others may read, is refused: it may have
    /// leaked, and a leaked key lets anyone forge seals.
    pub fn load_or_create(path: &Path) -> Result<SealKey, SpecError> {
        match std::fs::symlink_metadata(path) {
            Ok(_) => return SealKey::load(path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(key_error(path, format!("cannot read: {e}"))),
        }
        let dir = path
            .parent()
            .ok_or_else(|| key_error(path, "has no parent directory"))?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| key_error(path, format!("cannot create its directory: {e}")))?;
        let mut key = [0u8; 32];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut key))
            .map_err(|e| key_error(path, format!("no randomness for a new key: {e}")))?;
        // Written aside, then linked into place: a concurrent corral either
        // wins (and both use its key) or loses; no one reads half a key.
        let tmp = dir.join(format!(
            ".seal.key.{}.{}",
            std::process::id(),
            crate::host::random_hex(8)
        ));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| {
                f.write_all(hex(&key).as_bytes())?;
                f.write_all(b"\n")?;
                f.sync_all()
            });
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(key_error(path, format!("cannot write a new key: {e}")));
        }
        let linked = std::fs::hard_link(&tmp, path);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => {
                tracing::info!(path = %path.display(), "made a new seal key for persistent sandboxes");
                Ok(SealKey { key })
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => SealKey::load(path),
            Err(e) => Err(key_error(path, format!("cannot write a new key: {e}"))),
        }
    }

    fn load(path: &Path) -> Result<SealKey, SpecError> {
        let meta = std::fs::symlink_metadata(path)
            .map_err(|e| key_error(path, format!("cannot read: {e}")))?;
        if !meta.file_type().is_file() {
            return Err(key_error(path, "is not a regular file"));
        }
        let me = crate::workspace::euid();
        if meta.uid() != me {
            return Err(key_error(
                path,
                format!("is owned by uid {}, not this user (uid {me})", meta.uid()),
            ));
        }
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(key_error(
                path,
                format!(
                    "has mode {mode:04o}: others may have read it, so seals made with it \
                     prove nothing; chmod 600 it if it never leaked, else delete it \
                     (persistent containers sealed with it are then left alone, not adopted)"
                ),
            ));
        }
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(1024).read_to_string(&mut text))
            .map_err(|e| key_error(path, format!("cannot read: {e}")))?;
        let bytes = unhex(text.trim())
            .filter(|b| b.len() == 32)
            .ok_or_else(|| {
                key_error(
                    path,
                    "does not hold a key (64 hex digits); delete it to make a new one",
                )
            })?;
        let mut key = [0u8; 32];
        key.copy_from_slice(&bytes);
        Ok(SealKey { key })
    }

    fn mac(&self, sandbox_id: &str, session: &str, spec_digest: &str) -> Hmac<Sha256> {
        // The key is 32 bytes: HMAC takes keys of any length.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
        mac.update(b"corral-seal-v1");
        // Length-prefixed, so no two field lists give the same message.
        for field in [sandbox_id, session, spec_digest] {
            mac.update(&(field.len() as u64).to_le_bytes());
            mac.update(field.as_bytes());
        }
        mac
    }

    /// The seal for a container of `sandbox_id`, session `session`, made
    /// from the spec with digest `spec_digest`.
    pub fn seal(&self, sandbox_id: &str, session: &str, spec_digest: &str) -> String {
        hex(&self
            .mac(sandbox_id, session, spec_digest)
            .finalize()
            .into_bytes())
    }

    /// Judges a container's labels for session `session`, expecting a spec
    /// with digest `expected_digest`.
    pub fn verify(
        &self,
        container_labels: &HashMap<String, String>,
        session: &str,
        expected_digest: &str,
    ) -> Verdict {
        let get = |k: &str| container_labels.get(k).map(String::as_str);
        let (Some(id), Some(sess), Some(digest), Some(seal)) = (
            get(labels::SANDBOX),
            get(labels::SESSION),
            get(labels::SPEC_DIGEST),
            get(labels::SEAL),
        ) else {
            return Verdict::Unsealed;
        };
        if sess != session {
            return Verdict::Unsealed;
        }
        let Some(seal) = unhex(seal) else {
            return Verdict::Unsealed;
        };
        // Constant-time comparison.
        match self.mac(id, sess, digest).verify_slice(&seal) {
            Ok(()) => Verdict::Sealed {
                spec_matches: digest == expected_digest,
            },
            Err(_) => Verdict::Unsealed,
        }
    }
}

/// SHA-256 (hex) of the spec, as serialised by this corral.
pub fn spec_digest(spec: &SandboxSpec) -> String {
    // Serialising a plain struct of strings, numbers, vectors and BTreeMaps
    // cannot fail and is deterministic.
    let bytes = serde_json::to_vec(spec).unwrap_or_default();
    hex(&Sha256::digest(&bytes))
}

/// SHA-256 of `data`, hex.
pub fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealed_labels(
        key: &SealKey,
        id: &str,
        session: &str,
        digest: &str,
    ) -> HashMap<String, String> {
        HashMap::from([
            (labels::SANDBOX.to_string(), id.to_string()),
            (labels::SESSION.to_string(), session.to_string()),
            (labels::SPEC_DIGEST.to_string(), digest.to_string()),
            (labels::SEAL.to_string(), key.seal(id, session, digest)),
        ])
    }

    #[test]
    fn only_the_keys_seal_for_the_session_verifies() {
        let key = SealKey::from_bytes([7; 32]);
        let l = sealed_labels(&key, "sb-1", "agent/7", "d1");
        assert_eq!(
            key.verify(&l, "agent/7", "d1"),
            Verdict::Sealed { spec_matches: true }
        );
        assert_eq!(
            key.verify(&l, "agent/7", "d2"),
            Verdict::Sealed {
                spec_matches: false
            }
        );
        assert_eq!(key.verify(&l, "agent/8", "d1"), Verdict::Unsealed);
        // Another user's key, or labels edited after sealing.
        let other = SealKey::from_bytes([8; 32]);
        assert_eq!(other.verify(&l, "agent/7", "d1"), Verdict::Unsealed);
        let mut forged = l.clone();
        forged.insert(labels::SPEC_DIGEST.into(), "d2".into());
        assert_eq!(key.verify(&forged, "agent/7", "d2"), Verdict::Unsealed);
        let mut garbage = l.clone();
        garbage.insert(labels::SEAL.into(), "zz".into());
        assert_eq!(key.verify(&garbage, "agent/7", "d1"), Verdict::Unsealed);
        garbage.remove(labels::SEAL);
        assert_eq!(key.verify(&garbage, "agent/7", "d1"), Verdict::Unsealed);
        // Field boundaries matter.
        assert_ne!(key.seal("a", "bc", "d"), key.seal("ab", "c", "d"));
    }

    #[test]
    fn key_files_are_private_and_reused() {
        let dir =
            std::env::temp_dir().join(format!("corral-seal-test-{}", crate::host::random_hex(8)));
        let path = dir.join("sub").join("seal.key");
        let a = SealKey::load_or_create(&path).expect("created");
        let meta = std::fs::metadata(&path).expect("key file");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let dir_mode = std::fs::metadata(path.parent().expect("parent"))
            .expect("dir")
            .permissions()
            .mode();
        assert_eq!(dir_mode & 0o777, 0o700);
        let b = SealKey::load_or_create(&path).expect("loaded");
        assert_eq!(a.key, b.key, "the same key is read back");

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let e = SealKey::load_or_create(&path).expect_err("readable by others");
        assert_eq!(e.field, KEY_FIELD);
        assert_eq!(e.value, path.display().to_string());
        assert!(e.reason.contains("0644"), "{e}");

        std::fs::write(&path, "not a key").expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let e = SealKey::load_or_create(&path).expect_err("garbage");
        assert!(e.reason.contains("64 hex digits"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn spec_digests_follow_the_spec() {
        let a = SandboxSpec::new("img");
        let mut b = a.clone();
        assert_eq!(spec_digest(&a), spec_digest(&b));
        b.limits.memory = Some(1 << 20);
        assert_ne!(spec_digest(&a), spec_digest(&b));
        assert_eq!(spec_digest(&a).len(), 64);
    }
}
