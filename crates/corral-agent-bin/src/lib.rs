//! The in-sandbox agent (`corral-agent`) as bytes: built statically by this
//! crate's build script and embedded once, for every part that needs the
//! binary itself (the Docker backend's agent volume and egress helper, the
//! Kubernetes agent image `corral agent-image` writes). The runtime
//! re-exports it as `corral::agent`.

/// The agent binary (static, runs in any x86_64 image, `FROM scratch`
/// included).
pub static BINARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/corral-agent"));

/// A short hash identifying this agent build (12 hex digits), stable
/// across runs and processes.
pub fn hash() -> String {
    // FNV-1a: std's hasher is seeded per process.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in BINARY {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{:012x}", h & 0xffff_ffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_agent_is_an_elf_binary_with_a_stable_hash() {
        assert_eq!(&BINARY[..4], b"\x7fELF");
        assert_eq!(hash(), hash());
        assert_eq!(hash().len(), 12);
    }
}
