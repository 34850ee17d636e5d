//! One MCP session's sandbox: acquired from the provider on first use under
//! a key of its own, released when the session ends.
//!
//! The session ends in one of two ways: [`Session::release`] (stdio, after
//! the client hung up), or the last handle being dropped (streamable HTTP:
//! rmcp drops the handler when the client deletes the session, the session
//! idles out or the service closes it on cancellation), which spawns the
//! release. Once the service's token is cancelled no session acquires a
//! sandbox any more. A gate
//! held across every acquire and the release orders them: a release waits
//! for an acquire in flight and then frees what it made, and no acquire
//! starts after a release, so no sandbox outlives its session.
//!
//! The session is a principal of its own, bound once ([`Session::bind`]) to
//! the principal that opened it: it acts for that principal's tenant,
//! whose `max_sandboxes` its sandbox counts against (a start is reserved
//! in the service's books first, `crate::tenancy`).
//!
//! A restore ([`Session::replace`]) releases the session's sandbox and
//! starts a fork of a snapshot under the same key, under the same gate; the
//! session's later sandboxes (after a loss or an eviction) are made from
//! the snapshot too.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use corral::{Lease, Provider};
use corral_core::principal::Principal;
use corral_core::{CommandSpec, Failure, FailureKind, SandboxSpec};

use crate::tenancy::Tenancy;
use tokio_util::sync::CancellationToken;

use super::McpContext;

/// Longest the working-directory probe may take.
const PWD_TIMEOUT: Duration = Duration::from_secs(30);

/// A session's sandbox and what is known about it.
pub(super) struct Session {
    ctx: McpContext,
    key: String,
    /// Held across each acquire and the release.
    gate: Arc<tokio::sync::Mutex<()>>,
    /// An acquire was started: a sandbox may be bound to `key`.
    used: AtomicBool,
    /// The session ended: no further acquire.
    released: AtomicBool,
    /// The service is shutting down: no further acquire either.
    closing: CancellationToken,
    books: Mutex<Books>,
    /// The spec of a snapshot the session restored, used in place of the
    /// context's from then on, with a delta's changes or a live one's
    /// checkpoint.
    restored: Mutex<Option<Recipe>>,
    /// The session as a principal, once bound.
    principal: OnceLock<Principal>,
}

/// What the session remembers of its current sandbox.
/// What a session's sandbox is made from.
#[derive(Clone)]
pub(super) struct Recipe {
    /// The spec (the context's, or a restored snapshot's fork spec).
    pub(super) spec: SandboxSpec,
    /// A delta snapshot's changes, taken in before the first command.
    pub(super) base: Option<corral::Delta>,
    /// A live snapshot's checkpoint, restored instead of a start.
    pub(super) restore: Option<std::path::PathBuf>,
}

#[derive(Default)]
struct Books {
    /// Id of the sandbox last handed out.
    sandbox: Option<String>,
    /// Shell sessions that have run a command in it.
    shells: HashSet<String>,
    /// Its working directory, once asked.
    cwd: Option<String>,
}

/// Why a session could not hand out its sandbox.
pub(super) enum LeaseError {
    /// The session has ended.
    Ended,
    /// The sandbox could not be started or recovered.
    Failed(Failure),
}

impl Session {
    /// A session whose sandbox will be bound to a fresh `mcp-<random>` key;
    /// it acquires nothing once `closing` is cancelled.
    pub(super) fn new(ctx: McpContext, closing: CancellationToken) -> Session {
        Session {
            ctx,
            key: format!("mcp-{}", corral::host::random_hex(16)),
            gate: Arc::new(tokio::sync::Mutex::new(())),
            used: AtomicBool::new(false),
            released: AtomicBool::new(false),
            closing,
            books: Mutex::new(Books::default()),
            restored: Mutex::new(None),
            principal: OnceLock::new(),
        }
    }

    /// Binds the session to `opener`, the principal whose request opened
    /// it: from then on it acts as `opener`'s MCP session. Only the first
    /// binding counts.
    pub(super) fn bind(&self, opener: &Principal) {
        let own = opener.mcp_session(&self.key);
        if self.principal.set(own).is_err() {
            tracing::debug!(session = %self.key, "MCP session already bound");
        }
    }

    /// The session as a principal, once bound.
    pub(super) fn principal(&self) -> Option<&Principal> {
        self.principal.get()
    }

    /// The service's books (owners, quotas, shared snapshots).
    pub(super) fn tenancy(&self) -> &Tenancy {
        &self.ctx.tenancy
    }

    /// Reserves the session's key against its tenant's quota when no
    /// sandbox holds it now.
    fn reserve(&self) -> Result<Option<crate::tenancy::Reservation>, Box<Failure>> {
        let Some(principal) = self.principal() else {
            return Err(Box::new(Failure::new(
                FailureKind::InvalidSpec,
                "this MCP session is not authenticated: it has no principal to act for",
            )));
        };
        if self.ctx.provider.has_session(&self.key) {
            return Ok(None);
        }
        self.ctx
            .tenancy
            .reserve(principal, std::slice::from_ref(&self.key))
            .map(Some)
            .map_err(|e| Box::new(Failure::new(FailureKind::Capacity, e.to_string())))
    }

    /// The provider's key of this session's sandbox.
    pub(super) fn key(&self) -> &str {
        &self.key
    }

    /// Whether a sandbox may exist for this session.
    pub(super) fn used(&self) -> bool {
        self.used.load(Ordering::Acquire)
    }

    fn books(&self) -> MutexGuard<'_, Books> {
        // Plain field updates: a panic cannot leave them half-done.
        self.books.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The session's sandbox, started on first use. The second value says
    /// when it is not the sandbox the session used before (evicted or lost
    /// and replaced): earlier files and shells are gone.
    pub(super) async fn lease(&self) -> Result<(Lease, Option<String>), LeaseError> {
        let gate = self.gate.clone().lock_owned().await;
        if self.released.load(Ordering::Acquire) || self.closing.is_cancelled() {
            return Err(LeaseError::Ended);
        }
        let reservation = self.reserve().map_err(|f| LeaseError::Failed(*f))?;
        self.used.store(true, Ordering::Release);
        let provider = self.ctx.provider.clone();
        let key = self.key.clone();
        let Recipe {
            spec,
            base,
            restore,
        } = self.recipe();
        // Its own task, so a client that gives up mid-start cannot leave a
        // half-registered sandbox: the start completes (or fails) and the
        // release, waiting on the gate, sees the result.
        let acquired = tokio::spawn(async move {
            let r = provider
                .acquire_fork(&key, &spec, base, restore.as_deref())
                .await;
            drop(gate);
            r
        })
        .await;
        let lease = match acquired {
            Ok(Ok(lease)) => {
                if let Some(r) = reservation {
                    r.commit();
                }
                lease
            }
            Ok(Err(e)) => return Err(LeaseError::Failed(e.failure())),
            Err(e) => {
                return Err(LeaseError::Failed(Failure::new(
                    FailureKind::AgentError,
                    format!(
                        "starting the sandbox of MCP session {} failed: {e}",
                        self.key
                    ),
                )))
            }
        };
        let mut books = self.books();
        let note = match books.sandbox.as_deref() {
            Some(old) if old != lease.id() => Some(format!(
                "note: this session's sandbox {old} was lost or evicted and replaced by a new one ({}); files and shell state from before are gone",
                lease.id()
            )),
            _ => None,
        };
        if books.sandbox.as_deref() != Some(lease.id()) {
            *books = Books {
                sandbox: Some(lease.id().to_string()),
                ..Books::default()
            };
        }
        Ok((lease, note))
    }

    /// The provider the session's sandbox comes from.
    pub(super) fn provider(&self) -> &Provider {
        &self.ctx.provider
    }

    /// The operator's spec of the session (what it started with).
    pub(super) fn base_spec(&self) -> SandboxSpec {
        self.ctx.spec.clone()
    }

    /// The spec the session's sandbox is made from: a restored snapshot's,
    /// else the context's.
    pub(super) fn spec(&self) -> SandboxSpec {
        self.recipe().spec
    }

    /// What the session's sandbox is made from: a restored snapshot's spec
    /// and delta (a delta snapshot's), else the context's spec.
    fn recipe(&self) -> Recipe {
        let restored = self.restored.lock().unwrap_or_else(|p| p.into_inner());
        restored.clone().unwrap_or_else(|| Recipe {
            spec: self.ctx.spec.clone(),
            base: None,
            restore: None,
        })
    }

    /// Replaces the session's sandbox with one made from `recipe` (a
    /// snapshot's fork spec, already checked, whose agent first takes a
    /// delta snapshot's changes in, or restored from a live snapshot's
    /// checkpoint): the current sandbox, if any, is released first, then
    /// the new one started under the same key. When it cannot start, the
    /// session goes back to its own spec.
    pub(super) async fn replace(&self, recipe: Recipe) -> Result<Lease, LeaseError> {
        let gate = self.gate.clone().lock_owned().await;
        if self.released.load(Ordering::Acquire) || self.closing.is_cancelled() {
            return Err(LeaseError::Ended);
        }
        if self.used.swap(true, Ordering::AcqRel) {
            release_key(&self.ctx.provider, &self.key).await;
        }
        let reservation = self.reserve().map_err(|f| LeaseError::Failed(*f))?;
        *self.restored.lock().unwrap_or_else(|p| p.into_inner()) = Some(recipe.clone());
        let provider = self.ctx.provider.clone();
        let key = self.key.clone();
        // Its own task, as in `lease`.
        let acquired = tokio::spawn(async move {
            let r = provider
                .acquire_fork(&key, &recipe.spec, recipe.base, recipe.restore.as_deref())
                .await;
            drop(gate);
            r
        })
        .await;
        let failure = match acquired {
            Ok(Ok(lease)) => {
                if let Some(r) = reservation {
                    r.commit();
                }
                *self.books() = Books {
                    sandbox: Some(lease.id().to_string()),
                    ..Books::default()
                };
                return Ok(lease);
            }
            Ok(Err(e)) => e.failure(),
            Err(e) => Failure::new(
                FailureKind::AgentError,
                format!("restoring in MCP session {} failed: {e}", self.key),
            ),
        };
        *self.restored.lock().unwrap_or_else(|p| p.into_inner()) = None;
        *self.books() = Books::default();
        Err(LeaseError::Failed(failure))
    }

    /// Records that shell `name` ran a command in `sandbox`; true when it
    /// had run one before (so a fresh shell means a restart).
    pub(super) fn shell_used(&self, sandbox: &str, name: &str) -> bool {
        let mut books = self.books();
        if books.sandbox.as_deref() != Some(sandbox) {
            return false;
        }
        !books.shells.insert(name.to_string())
    }

    /// Forgets the shells of `sandbox`, which a reset ended on purpose:
    /// their next commands are no restart.
    pub(super) fn reset_done(&self, sandbox: &str) {
        let mut books = self.books();
        if books.sandbox.as_deref() == Some(sandbox) {
            books.shells.clear();
        }
    }

    /// Forgets shell `name` (closed on purpose: its next shell is no restart).
    pub(super) fn shell_closed(&self, name: &str) {
        self.books().shells.remove(name);
    }

    /// The sandbox's working directory: the spec's, else what `pwd` says
    /// there (asked once), else `/`.
    pub(super) async fn cwd(&self, lease: &Lease) -> String {
        if let Some(dir) = self.spec().workdir.filter(|d| d.starts_with('/')) {
            return dir;
        }
        {
            let books = self.books();
            if books.sandbox.as_deref() == Some(lease.id()) {
                if let Some(cwd) = &books.cwd {
                    return cwd.clone();
                }
            }
        }
        let r = lease
            .run(
                &CommandSpec::shell("pwd")
                    .timeout(PWD_TIMEOUT)
                    .max_output(4096),
            )
            .await;
        let pwd = String::from_utf8_lossy(&r.stdout).trim().to_string();
        let cwd = if r.failure.is_none() && r.exit_code == Some(0) && pwd.starts_with('/') {
            pwd
        } else {
            "/".to_string()
        };
        let mut books = self.books();
        if books.sandbox.as_deref() == Some(lease.id()) {
            books.cwd = Some(cwd.clone());
        }
        cwd
    }

    /// Ends the session: releases its sandbox (after any acquire in
    /// flight) and refuses later acquires. Idempotent.
    pub(super) async fn release(&self) {
        if self.released.swap(true, Ordering::AcqRel) {
            return;
        }
        let _gate = self.gate.lock().await;
        if self.used() {
            release_key(&self.ctx.provider, &self.key).await;
        }
        self.ctx.tenancy.forget(&self.key);
    }
}

async fn release_key(provider: &Provider, key: &str) {
    match provider.release_and_wait(key).await {
        Ok(()) => tracing::info!(session = key, "MCP session ended; sandbox released"),
        Err(e) => {
            tracing::warn!(session = key, error = %e, "releasing the MCP session's sandbox failed")
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.released.swap(true, Ordering::AcqRel) || !self.used() {
            return;
        }
        // Every tool call holds the session, so none is in flight; an
        // acquire task may still be, and holds the gate until it is done.
        let provider = self.ctx.provider.clone();
        let key = std::mem::take(&mut self.key);
        self.ctx.tenancy.forget(&key);
        let gate = self.gate.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    let _gate = gate.lock().await;
                    release_key(&provider, &key).await;
                });
            }
            Err(_) => tracing::warn!(
                session = key,
                "no async runtime to release the MCP session's sandbox; the provider's shutdown removes it"
            ),
        }
    }
}
