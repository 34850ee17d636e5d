//! A fault-injection proxy for the Docker Engine API.
//!
//! [`FaultProxy`] listens on a Unix socket and forwards every request to the
//! daemon socket — plain, chunked and streaming bodies, keep-alive, and
//! hijacked `101` connections (exec, attach) — except that [`Rule`]s answer
//! some requests with an injected daemon error, reset the connection, or
//! delay them. Pointing corral (bollard) at the proxy socket makes corral's
//! real code path meet real-looking daemon faults, and the [`Stats`] gauges
//! show how many requests of a kind were ever in flight at once.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use corral_faultproxy::{Action, FaultProxy, Matcher, Rule};
//!
//! let proxy = FaultProxy::start("/tmp/fp.sock", "/var/run/docker.sock")?;
//! proxy.set_rules(vec![Rule::new(
//!     Matcher::new("POST", "/containers/*/start"),
//!     Action::error(500, "database is locked"),
//! )
//! .with_max_hits(1)])?;
//! proxy.set_tracked(vec![Matcher::new("POST", "/containers/*/start")])?;
//! // ... point bollard at proxy.socket_path() ...
//! let stats = proxy.stats();
//! # Ok(()) }
//! ```
//!
//! The same configuration is reachable over HTTP on the proxy's own socket
//! under `/_faultproxy/` (see [`control`]), which is how the
//! `corral-faultproxy` binary is driven from other processes, e.g. with
//! [`ControlClient`].

use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::UnixListener;
use tokio::sync::watch;

mod client;
pub mod control;
mod glob;
mod proxy;
mod rng;
mod rule;
mod state;
mod stats;

pub use client::{ControlClient, ControlError};
pub use rule::{Action, Config, ConfigError, Matcher, Rule, DEFAULT_SEED, MAX_DELAY_MS};
pub use stats::{RuleStats, Stats, TrackedStats};

use state::Shared;

/// Where the Docker daemon listens by default.
pub const DEFAULT_UPSTREAM: &str = "/var/run/docker.sock";

/// Why a proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `start` was called outside a tokio runtime, so there is nothing to
    /// run the proxy on.
    #[error("no tokio runtime to run the fault proxy on: {0}")]
    NoRuntime(#[from] tokio::runtime::TryCurrentError),
    /// Another live process already answers on the listen path.
    #[error("{path} is in use by a live listener")]
    InUse {
        /// The listen path.
        path: PathBuf,
    },
    /// The listen socket could not be created.
    #[error("cannot listen on {path}: {source}")]
    Bind {
        /// The listen path.
        path: PathBuf,
        /// The bind (or stale socket removal) error.
        source: io::Error,
    },
    /// The initial configuration was rejected.
    #[error("invalid fault proxy configuration: {0}")]
    Config(#[from] ConfigError),
}

/// A running proxy. Dropping it stops it: the listener and every
/// connection through it are closed and the socket file is removed.
pub struct FaultProxy {
    shared: Arc<Shared>,
    socket: PathBuf,
    /// Never sent on; dropping it tells every task of this proxy to stop.
    _shutdown: watch::Sender<()>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("socket", &self.socket)
            .field("upstream", &self.shared.upstream)
            .finish()
    }
}

impl FaultProxy {
    /// Cuts every hijacked connection (exec, attach) open right now, as a
    /// network fault or a daemon restart would; later ones are unaffected.
    pub fn cut_hijacked(&self) {
        self.shared.cut.send_modify(|n| *n += 1);
    }

    /// Listens on `listen` and forwards to the daemon socket `upstream`,
    /// with no rules; runs on the current tokio runtime.
    ///
    /// A stale socket file at `listen` (nobody answering) is replaced; a
    /// live one is an error. `upstream` is only connected per request, so a
    /// daemon that is down shows up as `502` answers, not here.
    pub fn start(
        listen: impl AsRef<Path>,
        upstream: impl AsRef<Path>,
    ) -> Result<FaultProxy, Error> {
        FaultProxy::start_with(listen, upstream, Config::default())
    }

    /// [`FaultProxy::start`] with an initial seed, rules and tracked
    /// matchers.
    pub fn start_with(
        listen: impl AsRef<Path>,
        upstream: impl AsRef<Path>,
        config: Config,
    ) -> Result<FaultProxy, Error> {
        let runtime = tokio::runtime::Handle::try_current()?;
        config.validate()?;
        let socket = listen.as_ref().to_path_buf();
        remove_stale_socket(&socket)?;
        let listener = UnixListener::bind(&socket).map_err(|source| Error::Bind {
            path: socket.clone(),
            source,
        })?;
        let shared = Arc::new(Shared::new(upstream.as_ref().to_path_buf(), config));
        let (shutdown, watcher) = watch::channel(());
        runtime.spawn(proxy::accept_loop(listener, Arc::clone(&shared), watcher));
        tracing::info!(listen = %socket.display(), upstream = %upstream.as_ref().display(), "fault proxy listening");
        Ok(FaultProxy {
            shared,
            socket,
            _shutdown: shutdown,
        })
    }

    /// The socket clients should connect to.
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// The daemon socket requests are forwarded to.
    pub fn upstream_path(&self) -> &Path {
        &self.shared.upstream
    }

    /// Replaces the rules. Their hit budgets and the random generator
    /// restart, so the same rules and seed give the same faults.
    pub fn set_rules(&self, rules: Vec<Rule>) -> Result<(), ConfigError> {
        rule::validate_rules(&rules, "rules")?;
        self.shared.set_rules(rules);
        Ok(())
    }

    /// The current rules.
    pub fn rules(&self) -> Vec<Rule> {
        self.shared.rules()
    }

    /// Replaces the tracked matchers; their gauges start at zero.
    pub fn set_tracked(&self, tracked: Vec<Matcher>) -> Result<(), ConfigError> {
        rule::validate_tracked(&tracked, "tracked")?;
        self.shared.set_tracked(tracked);
        Ok(())
    }

    /// Sets the seed and restarts the random generator from it.
    pub fn set_seed(&self, seed: u64) {
        self.shared.set_seed(seed);
    }

    /// The seed, rules and tracked matchers in effect.
    pub fn config(&self) -> Config {
        self.shared.config()
    }

    /// The counters since start or the last [`FaultProxy::reset_stats`].
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// Zeroes the counters. In-flight gauges keep what is in flight now (and
    /// their maximum restarts from it); rules keep their used `max_hits`
    /// budget — use [`FaultProxy::set_rules`] to re-arm them.
    pub fn reset_stats(&self) {
        self.shared.reset_stats();
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // Tasks stop when `_shutdown` drops right after this; the file is
        // ours to remove, and a failure leaves only a stale socket that the
        // next start replaces.
        if let Err(error) = std::fs::remove_file(&self.socket) {
            tracing::debug!(%error, socket = %self.socket.display(), "cannot remove proxy socket");
        }
    }
}

/// Removes a socket file nobody answers on (left by a killed proxy), so a
/// restarted test can reuse its path; refuses to touch a live one or a
/// non-socket file.
fn remove_stale_socket(path: &Path) -> Result<(), Error> {
    let Ok(metadata) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !metadata.file_type().is_socket() {
        // Let bind report "address in use" on whatever this is.
        return Ok(());
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(Error::InUse {
            path: path.to_path_buf(),
        });
    }
    std::fs::remove_file(path).map_err(|source| Error::Bind {
        path: path.to_path_buf(),
        source,
    })
}
