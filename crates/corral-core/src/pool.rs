//! Provider settings and policies: warm pools, session keys, eviction.
//!
//! Types and pure decisions only; `corral-docker`'s provider does the IO.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::spec::SandboxSpec;

/// How sandboxes are handed out by session key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProviderConfig {
    /// Live sandboxes at most, pooled ones included (0: unlimited). When a new
    /// one is needed at the limit, the least recently used idle one is evicted.
    pub max_live: usize,
    /// Evict a session's sandbox after this long unused, in ms (0: never).
    pub idle_timeout_ms: u64,
    /// Evict any sandbox this long after it started, in ms (0: never).
    pub max_lifetime_ms: u64,
    /// How often the reaper enforces the two timeouts and refills pools, in ms.
    pub reap_interval_ms: u64,
    /// On acquire, replace a session's sandbox whose container died (unless
    /// its recovery policy is `fail`: then the acquire reports the loss).
    pub auto_restart: bool,
    /// Warm pools, by profile name.
    pub pools: BTreeMap<String, PoolConfig>,
    /// What the idle timeout does to a session's sandbox: `release` it
    /// (removed, its state gone), or `pause` it to disk where its tier
    /// checkpoints (gVisor without network: processes, memory and files
    /// kept, no memory held; it comes back with a resume, also after
    /// `corral serve` restarts) and release it elsewhere. A pool's
    /// `on_idle` overrides it for the pool's sandboxes.
    pub on_idle: IdleAction,
}

/// What the idle timeout does to a session's sandbox
/// ([`ProviderConfig::on_idle`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdleAction {
    /// Remove it.
    #[default]
    Release,
    /// Pause it to disk where its tier checkpoints; remove it elsewhere.
    Pause,
}

impl Default for ProviderConfig {
    fn default() -> Self {
        ProviderConfig {
            max_live: 64,
            idle_timeout_ms: 30 * 60 * 1000,
            max_lifetime_ms: 0,
            reap_interval_ms: 1000,
            auto_restart: true,
            pools: BTreeMap::new(),
            on_idle: IdleAction::Release,
        }
    }
}

/// Kills every process but PID 1 (the agent: `kill -1` never reaches a
/// namespace's init, nor the caller), waits up to a second for the agent to
/// reap them (a zombie still shows in `ps`), and empties the temporary
/// directories.
pub const DEFAULT_RESET: &str = r#"kill -9 -1 2>/dev/null; for _ in 1 2 3 4 5 6 7 8 9 10; do set -- /proc/[0-9]*; [ $# -le 2 ] && break; sleep 0.1; done; rm -rf /tmp/* /tmp/.[!.]* /var/tmp/* 2>/dev/null; true"#;

/// One warm pool: started, idle sandboxes of one spec kept ready.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolConfig {
    /// The spec every sandbox of the pool is made from.
    pub spec: SandboxSpec,
    /// Idle, started sandboxes to keep ready.
    pub warm: usize,
    /// Reset released sandboxes and return them to the pool instead of
    /// destroying them (only for trusted workloads: a reset cannot undo
    /// everything a command may have done). The pool then holds up to twice
    /// `warm`, so returns are not crowded out by refills.
    pub reuse: bool,
    /// Shell commands that reset a released sandbox before reuse; one
    /// failing destroys the sandbox instead.
    pub reset: Vec<String>,
    /// Return released sandboxes to the pool *pristine*: reset to exactly
    /// their state after start (every process and every file system
    /// change gone), in place in milliseconds, in the background. The
    /// pool's sandboxes are started with `spec.pristine`; where the spec
    /// cannot reset in place, the container is replaced instead (the
    /// runtime's metrics count both). Takes precedence over `reuse` and
    /// `reset`, and is safe for untrusted workloads.
    pub pristine: bool,
    /// What the idle timeout does to a session's sandbox from this pool;
    /// unset: the provider's `on_idle`.
    pub on_idle: Option<IdleAction>,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            spec: SandboxSpec::default(),
            warm: 2,
            reuse: false,
            reset: vec![DEFAULT_RESET.to_string()],
            pristine: false,
            on_idle: None,
        }
    }
}

/// An entry the eviction policy looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate<K> {
    /// Its key.
    pub key: K,
    /// Last use, in ms on any monotonic clock.
    pub last_used_ms: u64,
    /// Start, in ms on the same clock.
    pub started_ms: u64,
    /// In use right now (never evicted).
    pub busy: bool,
}

impl ProviderConfig {
    /// What the idle timeout does to a sandbox of pool `profile` (`None`:
    /// of no pool).
    pub fn on_idle_of(&self, profile: Option<&str>) -> IdleAction {
        profile
            .and_then(|p| self.pools.get(p))
            .and_then(|p| p.on_idle)
            .unwrap_or(self.on_idle)
    }
}

/// Which entries the reaper evicts now: idle past `idle_timeout_ms` or alive
/// past `max_lifetime_ms`. Busy ones never: a busy sandbox past its lifetime
/// is evicted once released.
pub fn expired<K: Clone>(entries: &[Candidate<K>], now_ms: u64, cfg: &ProviderConfig) -> Vec<K> {
    entries
        .iter()
        .filter(|e| !e.busy)
        .filter(|e| {
            (cfg.idle_timeout_ms > 0
                && now_ms.saturating_sub(e.last_used_ms) >= cfg.idle_timeout_ms)
                || (cfg.max_lifetime_ms > 0
                    && now_ms.saturating_sub(e.started_ms) >= cfg.max_lifetime_ms)
        })
        .map(|e| e.key.clone())
        .collect()
}

/// The idle entry to evict to make room: the least recently used one.
pub fn lru_victim<K: Clone>(entries: &[Candidate<K>]) -> Option<K> {
    entries
        .iter()
        .filter(|e| !e.busy)
        .min_by_key(|e| e.last_used_ms)
        .map(|e| e.key.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(key: &str, last: u64, started: u64, busy: bool) -> Candidate<String> {
        Candidate {
            key: key.into(),
            last_used_ms: last,
            started_ms: started,
            busy,
        }
    }

    #[test]
    fn lru_skips_busy_entries() {
        let e = vec![c("a", 5, 0, true), c("b", 7, 0, false), c("c", 6, 0, false)];
        assert_eq!(lru_victim(&e), Some("c".to_string()));
        assert_eq!(lru_victim(&[c("a", 1, 0, true)]), None);
    }

    #[test]
    fn expiry_by_idle_time_and_lifetime() {
        let cfg = ProviderConfig {
            idle_timeout_ms: 100,
            max_lifetime_ms: 1000,
            ..ProviderConfig::default()
        };
        let e = vec![
            c("idle", 0, 50, false),
            c("fresh", 150, 100, false),
            c("old", 190, 0, false),
            c("busy", 0, 0, true),
        ];
        assert_eq!(expired(&e, 200, &cfg), vec!["idle".to_string()]);
        assert_eq!(
            expired(&e, 1000, &cfg),
            vec!["idle".to_string(), "fresh".into(), "old".into()]
        );
        let off = ProviderConfig {
            idle_timeout_ms: 0,
            max_lifetime_ms: 0,
            ..cfg
        };
        assert!(expired(&e, u64::MAX, &off).is_empty());
    }
}
