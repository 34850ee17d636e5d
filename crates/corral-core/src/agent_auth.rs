//! The handshake that opens a network connection to a sandbox's agent.
//!
//! On Docker corral reaches the agent through the daemon's attach to PID 1's
//! stdin and stdout, which nothing inside the sandbox can reach. On a
//! cluster it connects to a TCP port the agent listens on in the pod, and
//! anything that can reach that port (a command of the sandbox itself, on
//! loopback; a pod the network policy fails to stop) could otherwise drive
//! the agent or pose as it. So each sandbox gets a 32-byte secret, given to
//! PID 1 alone (in [`SECRET_ENV`], which the agent removes from its
//! environment before anything else runs; PID 1 is non-dumpable, so no
//! command can read its memory or `/proc/1/environ`), and both ends prove
//! they hold it before a byte of the framed protocol flows:
//!
//! 1. client → agent: [`MAGIC`], then a fresh 32-byte client nonce;
//! 2. agent → client: a fresh 32-byte agent nonce, then
//!    `HMAC-SHA256(secret, "corral agent" ‖ client nonce ‖ agent nonce)`;
//! 3. client → agent: `HMAC-SHA256(secret, "corral client" ‖ client nonce ‖
//!    agent nonce)`.
//!
//! The agent checks 3 and the client checks 2 in constant time. Fresh
//! nonces on both sides make a recorded handshake useless for a later
//! connection. The connection itself is not encrypted: the pod network is
//! trusted not to be tapped (as it is for every in-cluster control plane
//! that speaks plain TCP); a network policy keeps other pods off the port.
//!
//! Pure: no IO; both ends do their own reads and writes.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The environment variable that carries the agent's secret (hex).
pub const SECRET_ENV: &str = "CORRAL_AGENT_SECRET";

/// The environment variable that makes the agent listen on a TCP port
/// instead of serving its stdin.
pub const LISTEN_ENV: &str = "CORRAL_AGENT_LISTEN";

/// Environment names reserved for corral: a spec may not set them.
pub const RESERVED_ENV_PREFIX: &str = "CORRAL_AGENT_";

/// What a client sends first, so a stray connection (an HTTP probe, say)
/// is told apart from a corral client at once.
pub const MAGIC: &[u8; 8] = b"CRLAUTH1";

/// Bytes of a secret, a nonce and a proof.
pub const LEN: usize = 32;

/// The client's opening: [`MAGIC`] and its nonce.
pub const OPENING_LEN: usize = MAGIC.len() + LEN;

/// The agent's answer: its nonce and its proof.
pub const ANSWER_LEN: usize = 2 * LEN;

/// A secret: 32 bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret([u8; LEN]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never printed, whatever logs a struct holding one.
        f.write_str("Secret(..)")
    }
}

/// A secret that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the agent secret must be {} hex digits, got {got} characters", 2 * LEN)]
pub struct BadSecret {
    /// Length of what was given (never the value: it may be most of one).
    pub got: usize,
}

impl Secret {
    /// The secret of `bytes`.
    pub fn new(bytes: [u8; LEN]) -> Self {
        Secret(bytes)
    }

    /// Parses 64 hex digits.
    pub fn from_hex(hex: &str) -> Result<Self, BadSecret> {
        let bad = BadSecret { got: hex.len() };
        if hex.len() != 2 * LEN {
            return Err(bad);
        }
        let mut out = [0u8; LEN];
        for (i, b) in out.iter_mut().enumerate() {
            *b = hex
                .get(2 * i..2 * i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or(bad.clone())?;
        }
        Ok(Secret(out))
    }

    /// As 64 lowercase hex digits (what goes into [`SECRET_ENV`]).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn proof(&self, role: &[u8], client: &[u8; LEN], agent: &[u8; LEN]) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            // HMAC takes keys of any length.
            .unwrap_or_else(|_| unreachable!("HMAC accepts a 32-byte key"));
        mac.update(role);
        mac.update(client);
        mac.update(agent);
        mac
    }

    /// The agent's proof (step 2).
    pub fn agent_proof(&self, client: &[u8; LEN], agent: &[u8; LEN]) -> [u8; LEN] {
        self.proof(b"corral agent", client, agent)
            .finalize()
            .into_bytes()
            .into()
    }

    /// The client's proof (step 3).
    pub fn client_proof(&self, client: &[u8; LEN], agent: &[u8; LEN]) -> [u8; LEN] {
        self.proof(b"corral client", client, agent)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Whether `got` is the agent's proof, compared in constant time.
    pub fn check_agent(&self, client: &[u8; LEN], agent: &[u8; LEN], got: &[u8]) -> bool {
        self.proof(b"corral agent", client, agent)
            .verify_slice(got)
            .is_ok()
    }

    /// Whether `got` is the client's proof, compared in constant time.
    pub fn check_client(&self, client: &[u8; LEN], agent: &[u8; LEN], got: &[u8]) -> bool {
        self.proof(b"corral client", client, agent)
            .verify_slice(got)
            .is_ok()
    }
}

/// The client nonce of an opening, or `None` when it is not one.
pub fn parse_opening(bytes: &[u8; OPENING_LEN]) -> Option<[u8; LEN]> {
    let (magic, nonce) = bytes.split_at(MAGIC.len());
    if magic != MAGIC {
        return None;
    }
    nonce.try_into().ok()
}

/// The opening for `nonce`.
pub fn opening(nonce: &[u8; LEN]) -> [u8; OPENING_LEN] {
    let mut out = [0u8; OPENING_LEN];
    out[..MAGIC.len()].copy_from_slice(MAGIC);
    out[MAGIC.len()..].copy_from_slice(nonce);
    out
}

/// Whether `name` is reserved for corral's own use in a sandbox's
/// environment.
pub fn is_reserved_env(name: &str) -> bool {
    name.starts_with(RESERVED_ENV_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_round_trips_through_hex_and_is_never_printed() {
        let s = Secret::new([0xab; LEN]);
        let hex = s.to_hex();
        assert_eq!(hex.len(), 64);
        assert_eq!(Secret::from_hex(&hex), Ok(s.clone()));
        assert_eq!(format!("{s:?}"), "Secret(..)");
        assert_eq!(Secret::from_hex("ab"), Err(BadSecret { got: 2 }));
        let mut bad = hex.clone();
        bad.replace_range(10..12, "zz");
        assert!(Secret::from_hex(&bad).is_err());
        // Multi-byte characters must not panic on slicing.
        let odd = "é".repeat(32);
        assert!(Secret::from_hex(&odd).is_err());
    }

    #[test]
    fn proofs_bind_role_secret_and_both_nonces() {
        let s = Secret::new([1; LEN]);
        let other = Secret::new([2; LEN]);
        let (c, a) = ([3; LEN], [4; LEN]);
        let agent = s.agent_proof(&c, &a);
        let client = s.client_proof(&c, &a);
        assert!(s.check_agent(&c, &a, &agent));
        assert!(s.check_client(&c, &a, &client));
        // An agent's proof is not a client's: a reflection fails.
        assert!(!s.check_client(&c, &a, &agent));
        assert!(!other.check_agent(&c, &a, &agent));
        assert!(!s.check_agent(&[5; LEN], &a, &agent));
        assert!(!s.check_agent(&c, &[5; LEN], &agent));
        assert!(!s.check_agent(&c, &a, &agent[..31]));
    }

    #[test]
    fn openings_carry_the_magic() {
        let o = opening(&[7; LEN]);
        assert_eq!(parse_opening(&o), Some([7; LEN]));
        let mut http = [0u8; OPENING_LEN];
        http[..8].copy_from_slice(b"GET / HT");
        assert_eq!(parse_opening(&http), None);
        assert!(is_reserved_env("CORRAL_AGENT_SECRET"));
        assert!(!is_reserved_env("CORRAL_HOME"));
    }
}
