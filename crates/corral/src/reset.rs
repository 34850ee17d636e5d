//! Returning a sandbox to its pristine state: [`Sandbox::reset`].
//!
//! A sandbox whose spec asks for it (`pristine: true`) and can have it
//! ([`SandboxSpec::in_place_reset`](corral_core::SandboxSpec::in_place_reset))
//! is reset by its agent in place: every process is killed and commands
//! continue in a fresh overlay over the root file system as the start-up
//! commands left it (see the agent's `pristine` module). Anything else is
//! reset by replacing the container with a new one from the same spec
//! (start-up commands run again), and the outcome says so and why.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use corral_core::protocol::{Frame, FrameKind, ResetReport, ResetRequest};
use corral_core::Error;
use serde::Serialize;

use crate::sandbox::Sandbox;

/// Longest an in-place reset may take before the sandbox is replaced.
const RESET_TIMEOUT: Duration = Duration::from_secs(30);

/// How a reset was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ResetMode {
    /// By the agent, in the same container.
    InPlace,
    /// By replacing the container with a new one from the same spec.
    Replaced,
}

/// What a reset did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ResetOutcome {
    /// In place, or by replacement.
    pub mode: ResetMode,
    /// Why it was not done in place (`None` when it was).
    pub fallback_reason: Option<String>,
    /// Processes killed by an in-place reset.
    pub killed: u32,
    /// Time the whole reset took, in milliseconds.
    pub elapsed_ms: f64,
}

impl Sandbox {
    /// Why this sandbox cannot be reset in place right now; `Ok` when it can.
    pub fn resets_in_place(&self) -> Result<(), String> {
        self.spec().in_place_reset()?;
        match &self.conn_hello().reset {
            Some(r) if r.ready => Ok(()),
            Some(r) => Err(format!("the agent cannot: {}", r.reason)),
            None => Err("the agent was not started for in-place reset".into()),
        }
    }

    /// Why a command in this sandbox could forge what corral reports of a
    /// command, naming the field; `Ok` when its tier holds result
    /// integrity: the spec's rule ([`SandboxSpec::result_integrity`]) and
    /// what the agent said at its handshake (under gVisor, an image
    /// whose `USER` is not root keeps the agent from hiding its stream).
    ///
    /// [`SandboxSpec::result_integrity`]: corral_core::SandboxSpec::result_integrity
    pub fn result_integrity(&self) -> Result<(), String> {
        self.spec().result_integrity()?;
        match self.conn_hello().integrity_gap {
            Some(gap) => Err(gap),
            None => Ok(()),
        }
    }

    /// Returns the sandbox to exactly the state it had right after its
    /// start: every process gone, every change to its file system gone
    /// (root file system, tmpfs mounts; host mounts are the host's), shell
    /// sessions gone. In place when it can be, else by replacing the
    /// container; the outcome says which.
    pub async fn reset(&self) -> Result<ResetOutcome, Error> {
        self.reset_to(false).await
    }

    /// [`Sandbox::reset`] of a warm pool's sandbox going back to its pool:
    /// a fork it took ([`Sandbox::take_fork`]) is dropped with the rest,
    /// back to the pool's own state.
    pub(crate) async fn reset_for_pool(&self) -> Result<ResetOutcome, Error> {
        self.reset_to(true).await
    }

    async fn reset_to(&self, restore: bool) -> Result<ResetOutcome, Error> {
        let outcome = self.reset_inner(restore).await;
        match &outcome {
            Ok(o) => self.emit(
                crate::events::EventKind::Reset,
                Some("ok"),
                match o.mode {
                    ResetMode::InPlace => format!("in place, {:.1} ms", o.elapsed_ms),
                    ResetMode::Replaced => format!(
                        "container replaced ({}), {:.1} ms",
                        o.fallback_reason.as_deref().unwrap_or("no in-place reset"),
                        o.elapsed_ms
                    ),
                },
            ),
            Err(e) => self.emit(
                crate::events::EventKind::Reset,
                Some(e.kind().as_str()),
                e.to_string(),
            ),
        }
        outcome
    }

    async fn reset_inner(&self, restore: bool) -> Result<ResetOutcome, Error> {
        let started = Instant::now();
        self.drop_shells();
        if restore {
            // A replacing container comes from the spec alone.
            self.clear_base();
        }
        let metrics = &self.runtime().inner.metrics;
        let fallback = match self.resets_in_place() {
            Ok(()) => match self.agent_reset_request(false, false, restore).await {
                Ok(report) => {
                    let took = started.elapsed();
                    metrics.resets_in_place.fetch_add(1, Ordering::Relaxed);
                    metrics
                        .reset_us
                        .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
                    return Ok(ResetOutcome {
                        mode: ResetMode::InPlace,
                        fallback_reason: None,
                        killed: report.killed,
                        elapsed_ms: took.as_secs_f64() * 1e3,
                    });
                }
                Err(e) => {
                    tracing::warn!(sandbox = self.id(), error = %e, "in-place reset failed; replacing the container");
                    format!("the in-place reset failed: {e}")
                }
            },
            Err(why) => {
                if self.spec().pristine {
                    self.log_fallback_once(&why);
                }
                why
            }
        };
        self.replace().await?;
        metrics.resets_replaced.fetch_add(1, Ordering::Relaxed);
        Ok(ResetOutcome {
            mode: ResetMode::Replaced,
            fallback_reason: Some(fallback),
            killed: 0,
            elapsed_ms: started.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// Logs the first time this runtime resets a sandbox by replacement
    /// for `why` (a spec's field, the agent's or the engine's reason), so
    /// an operator learns why pristine sandboxes are slow here once, not
    /// at every episode. At most 64 reasons are remembered.
    fn log_fallback_once(&self, why: &str) {
        let mut logged = self
            .runtime()
            .inner
            .reset_fallbacks_logged
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if logged.len() < 64 && logged.insert(why.to_string()) {
            tracing::warn!(
                sandbox = self.id(),
                reason = why,
                "pristine reset is not done in place: the sandbox is replaced at each reset"
            );
        }
    }

    /// After the start-up commands: the first in-place reset, which fixes
    /// the state later resets return to (the start-up commands' changes
    /// become the sandbox's delta). Nothing for other sandboxes.
    pub(crate) async fn enter_pristine(&self) -> Result<(), Error> {
        if self.resets_in_place().is_err() {
            return Ok(());
        }
        self.agent_reset(false)
            .await
            .map(drop)
            .map_err(|e| Error::Startup {
                sandbox: self.id().to_string(),
                index: self.spec().startup.len(),
                detail: format!("preparing in-place reset failed: {e}"),
            })
    }

    /// One `Reset` exchange with the agent.
    pub(crate) async fn agent_reset(&self, keep: bool) -> Result<ResetReport, String> {
        self.agent_reset_with(keep, false).await
    }

    /// One `Reset` exchange with the agent; `to_root` also applies the
    /// sandbox's delta to its container's root file system.
    pub(crate) async fn agent_reset_with(
        &self,
        keep: bool,
        to_root: bool,
    ) -> Result<ResetReport, String> {
        self.agent_reset_request(keep, to_root, false).await
    }

    async fn agent_reset_request(
        &self,
        keep: bool,
        to_root: bool,
        restore: bool,
    ) -> Result<ResetReport, String> {
        let conn = self.current_conn();
        let id = conn.next_id();
        let mut rx = conn.register_reset(id)?;
        let request = ResetRequest {
            keep,
            to_root,
            restore,
        };
        let frame = Frame::json(FrameKind::Reset, id, &request);
        conn.send(frame).await?;
        let answer = tokio::time::timeout(RESET_TIMEOUT, rx.recv())
            .await
            .map_err(|_| format!("no answer within {RESET_TIMEOUT:?}"))?;
        let Some(frame) = answer else {
            return Err(format!(
                "the control stream ended: {}",
                conn.closed_reason()
            ));
        };
        if frame.kind != FrameKind::ResetDone {
            return Err(format!(
                "the agent refused: {}",
                String::from_utf8_lossy(&frame.payload)
            ));
        }
        let report: ResetReport = frame
            .parse()
            .map_err(|e| format!("unreadable reset report: {e}"))?;
        match report.error {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }
}
