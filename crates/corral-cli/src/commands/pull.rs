//! `corral pull IMAGE`: fetch an image onto the daemon ahead of the first
//! sandbox, through the same path a start takes (one pull per image at a
//! time, bounded by `daemon.pull_timeout_ms`, failures typed).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use corral_core::backend::PullProgress;

use crate::diagnostics::{CliError, Diagnostic};
use crate::progress::{self, Progress};

/// Pull an image onto the daemon ahead of its first sandbox.
///
/// Pull an image onto the daemon (a no-op when it is there). Exits 0 when
/// the image is present, 125 with the typed failure otherwise
/// (image_not_found: the registry has no such name or tag; daemon_unavailable:
/// the registry or daemon could not be reached, or the pull took longer than
/// daemon.pull_timeout_ms, and trying again may help). On a terminal a
/// spinner shows the layers and bytes (--quiet: none; off a terminal, a
/// line every 2 s).
#[derive(Args, Debug)]
pub struct PullArgs {
    /// The image, `[registry/]repository[:tag]` (the tag defaults to latest).
    image: String,
}

fn describe(p: &PullProgress) -> String {
    format!(
        "{}/{} layers, {:.1} of {:.1} MB",
        p.layers_done,
        p.layers,
        p.bytes as f64 / 1e6,
        p.total_bytes as f64 / 1e6
    )
}

pub async fn run(config: super::BackendConfig, args: PullArgs) -> anyhow::Result<ExitCode> {
    let image = args.image.trim();
    if image.is_empty() {
        return Err(CliError::BadArgument {
            command: "pull",
            what: "IMAGE",
            value: args.image.clone(),
            reason: "name an image such as python:3.12-slim",
        }
        .into());
    }
    let runtime = super::connect(config).await?;
    let backend = runtime.backend().clone();
    let started = Instant::now();
    let drawn = progress::wanted(false);
    let bar = Progress::spinner(drawn, "pull", format!("pulling {image}"));
    // The engine's own view of its pulls (`Backend::pulls`, what
    // `GET /v1/images` shows), read while the pull runs.
    let pulling = backend.pull(image);
    tokio::pin!(pulling);
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    // Off a terminal: a plain line at most every 2 s.
    let mut last_line: Option<Instant> = None;
    let outcome = loop {
        tokio::select! {
            done = &mut pulling => break done,
            _ = tick.tick() => {
                let Some(p) = backend.pulls().into_iter().find(|p| p.image == image) else {
                    continue;
                };
                if drawn {
                    bar.message(format!("pulling {image}: {}", describe(&p.progress)));
                } else if !progress::quiet()
                    && last_line.is_none_or(|t| t.elapsed() >= Duration::from_secs(2))
                {
                    last_line = Some(Instant::now());
                    eprintln!("corral pull: {image}: {}", describe(&p.progress));
                }
            }
        }
    };
    bar.clear();
    match outcome {
        Ok(()) => {
            eprintln!(
                "corral pull: {image} is present ({:.1} s)",
                started.elapsed().as_secs_f64()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            let retry = if e.retryable() { "; retryable" } else { "" };
            let mut d = Diagnostic::of_core(&e);
            d.error = format!("{} ({}{retry})", d.error, e.kind().as_str());
            d.emit();
            Ok(ExitCode::from(125))
        }
    }
}
