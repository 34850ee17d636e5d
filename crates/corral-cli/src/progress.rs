//! Progress bars and spinners for the CLI's long-running actions (gc,
//! pulls, starting sandboxes, workloads, doctor's probes, `corral serve`'s
//! warm pools filling), one helper for all of them.
//!
//! They are drawn on stderr for a person watching: only when stderr is a
//! terminal and the user asked for neither `--quiet` nor `--json`. Off a
//! terminal nothing is drawn, so logs and pipes hold no bar characters.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// `--quiet`, set once by `main`.
static QUIET: AtomicBool = AtomicBool::new(false);

/// Turns every bar off (`--quiet`).
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// Whether `--quiet` was given.
pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// Whether bars are drawn: stderr is a terminal (not `TERM=dumb`) and
/// `--quiet` was not given. A command with `--json` passes `json` too.
pub fn wanted(json: bool) -> bool {
    let dumb = std::env::var_os("TERM").is_some_and(|t| t == "dumb");
    !json && !dumb && !quiet() && std::io::stderr().is_terminal()
}

const BAR: &str = "{prefix:>9} [{bar:30}] {pos}/{len} {msg} {elapsed}";
const SPINNER: &str = "{prefix:>9} {spinner} {msg} {elapsed}";
const DONE: &str = "{prefix:>9} {msg}";

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

/// One bar or spinner on stderr, or nothing when [`wanted`] said no. Going
/// out of scope unfinished (an error path) clears it, so the error that
/// follows is not drawn over.
pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A spinner showing `phase`, for work of no known size, under
    /// `prefix` (the command: `gc`, `pull`, `run`).
    pub fn spinner(on: bool, prefix: &'static str, phase: impl Into<String>) -> Self {
        if !on {
            return Progress { bar: None };
        }
        // Drawn from its first frame with its prefix and phase.
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden())
            .with_style(style(SPINNER))
            .with_prefix(prefix)
            .with_message(phase.into());
        bar.set_draw_target(ProgressDrawTarget::stderr());
        bar.enable_steady_tick(Duration::from_millis(100));
        Progress { bar: Some(bar) }
    }

    /// A bar counting `total` items (`what`: "sandboxes removed").
    pub fn counter(on: bool, prefix: &'static str, total: u64, what: impl Into<String>) -> Self {
        let progress = Progress::spinner(on, prefix, what);
        progress.count(total);
        progress
    }

    /// Turns the spinner into a bar of `total` items, from 0.
    pub fn count(&self, total: u64) {
        if let Some(bar) = &self.bar {
            bar.set_style(style(BAR));
            bar.set_length(total);
            bar.set_position(0);
        }
    }

    /// Back to a spinner, showing `phase`.
    pub fn phase(&self, phase: impl Into<String>) {
        if let Some(bar) = &self.bar {
            bar.set_style(style(SPINNER));
            bar.set_message(phase.into());
        }
    }

    /// Shows `message` beside the bar or spinner.
    pub fn message(&self, message: impl Into<String>) {
        if let Some(bar) = &self.bar {
            bar.set_message(message.into());
        }
    }

    /// `done` items done.
    pub fn set(&self, done: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(done);
        }
    }

    /// One more item done.
    pub fn inc(&self) {
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
    }

    /// Ends with `summary` as the bar's last line, which stays on screen.
    pub fn finish(mut self, summary: impl Into<String>) {
        if let Some(bar) = self.bar.take() {
            bar.set_style(style(DONE));
            bar.finish_with_message(summary.into());
            // The cursor stays on the bar's line: what is written next
            // starts on a line of its own.
            eprintln!();
        }
    }

    /// Ends and removes the bar from the screen.
    pub fn clear(mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}
