//! The reset row: [`Sandbox::reset`] of a pristine sandbox that has just
//! made a mess (files written outside `/tmp`, a process left running), each
//! reset checked to have been done in place, and the mess checked gone.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use corral::{ResetMode, ResetOutcome, Sandbox};
use corral_core::CommandSpec;

use crate::stats::Latency;
use crate::{Bench, COMMAND_TIMEOUT};

/// What a rollout leaves behind before each reset: files on the root file
/// system (a new directory and a file in `/etc`) and a background `sleep`
/// (its output redirected, so the command ends without waiting for it). It
/// first checks that the previous reset took the last mess away.
const MESS: &str = "test ! -e /bench-mess && test ! -e /etc/bench-mess \
    && mkdir /bench-mess && echo a > /bench-mess/a && echo b > /bench-mess/b \
    && echo c > /etc/bench-mess && { sleep 600 </dev/null >/dev/null 2>&1 & }";

/// Resets before the timed ones, so the first sample pays no first-time cost.
const WARM_UP: usize = 3;

/// What the reset row measured.
pub(crate) struct Resets {
    /// `Sandbox::reset`, end to end as the caller waits for it.
    pub(crate) latency: Latency,
    /// Processes the resets killed, in all.
    pub(crate) killed: u64,
}

impl Bench {
    /// `n` resets of one pristine sandbox, each after a fresh mess; fails
    /// when a reset is not done in place (naming why) or leaves the mess.
    pub(crate) async fn resets(&self, n: usize) -> anyhow::Result<Resets> {
        let mut spec = self.spec.clone();
        spec.pristine = true;
        let sb = self
            .runtime
            .create(&spec)
            .await
            .context("starting the pristine sandbox")?;
        if let Err(why) = sb.resets_in_place() {
            let _ = sb.destroy().await;
            bail!("sandbox {} cannot reset in place: {why}", sb.id());
        }
        let measured = async {
            for _ in 0..WARM_UP {
                self.mess_and_reset(&sb).await?;
            }
            let mut samples = Vec::with_capacity(n);
            let mut killed = 0;
            for _ in 0..n {
                let (took, outcome) = self.mess_and_reset(&sb).await?;
                samples.push(took);
                killed += u64::from(outcome.killed);
                self.progress.inc(1);
            }
            // The last reset's mess is gone too.
            mess_gone(&sb).await?;
            anyhow::Ok(Resets {
                latency: Latency::of(samples),
                killed,
            })
        }
        .await;
        let destroyed = sb
            .destroy()
            .await
            .context("destroying the pristine sandbox");
        let resets = measured?;
        destroyed.map(|()| resets)
    }

    /// Makes the mess (not timed), then times one reset and checks it.
    async fn mess_and_reset(&self, sb: &Sandbox) -> anyhow::Result<(Duration, ResetOutcome)> {
        let r = sb
            .run(&CommandSpec::shell(MESS).timeout(COMMAND_TIMEOUT))
            .await;
        if !r.success() {
            bail!(
                "the mess before a reset failed in sandbox {} (exit {:?}, failure {:?}): \
                 the previous reset left files behind, or the image lacks a shell",
                sb.id(),
                r.exit_code,
                r.failure.as_ref().map(ToString::to_string)
            );
        }
        let t = Instant::now();
        let outcome = sb
            .reset()
            .await
            .with_context(|| format!("resetting sandbox {}", sb.id()))?;
        let took = t.elapsed();
        check_in_place(&outcome, sb.id())?;
        Ok((took, outcome))
    }
}

/// A reset the bench counts: done in place, and it killed the mess's
/// `sleep` (at least one process).
fn check_in_place(outcome: &ResetOutcome, sandbox: &str) -> anyhow::Result<()> {
    if outcome.mode != ResetMode::InPlace {
        bail!(
            "the reset of sandbox {sandbox} replaced the container instead of resetting in place: {}",
            outcome.fallback_reason.as_deref().unwrap_or("no reason given")
        );
    }
    if outcome.killed == 0 {
        bail!(
            "the reset of sandbox {sandbox} killed no process, but the mess left a `sleep` running"
        );
    }
    Ok(())
}

async fn mess_gone(sb: &Sandbox) -> anyhow::Result<()> {
    let check = "test ! -e /bench-mess && test ! -e /etc/bench-mess";
    let r = sb
        .run(&CommandSpec::shell(check).timeout(COMMAND_TIMEOUT))
        .await;
    if !r.success() {
        bail!("the last reset of sandbox {} left its mess behind", sb.id());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(mode: ResetMode, killed: u32) -> ResetOutcome {
        ResetOutcome {
            mode,
            fallback_reason: (mode == ResetMode::Replaced).then(|| "the agent cannot: x".into()),
            killed,
            elapsed_ms: 1.0,
        }
    }

    #[test]
    fn only_an_in_place_reset_that_killed_the_mess_counts() {
        assert!(check_in_place(&outcome(ResetMode::InPlace, 1), "sb-1").is_ok());
        let replaced = check_in_place(&outcome(ResetMode::Replaced, 0), "sb-1")
            .expect_err("a replacement fails the bench");
        assert_eq!(
            replaced.to_string(),
            "the reset of sandbox sb-1 replaced the container instead of resetting in place: \
             the agent cannot: x"
        );
        let idle = check_in_place(&outcome(ResetMode::InPlace, 0), "sb-1")
            .expect_err("nothing killed fails the bench");
        assert!(idle.to_string().contains("killed no process"), "{idle}");
    }
}
