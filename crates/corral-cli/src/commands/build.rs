//! `corral build NAME [CONTEXT]`: a template from a Dockerfile, built in
//! corral sandboxes of the config's `defaults` (see the book's Templates
//! chapter), as the operator's.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use corral_core::template::Recipe;

use crate::diagnostics::CliError;

/// Build a template from a Dockerfile and its context.
///
/// Builds template NAME from a Dockerfile (CONTEXT/Dockerfile unless
/// --file) with the directory CONTEXT as its build context. Every step runs
/// in a corral sandbox of the config's `defaults:` (its hardening, limits,
/// network and isolation; never the daemon's own builder) and is committed
/// as a cached layer: an unchanged step is taken from the cache and not run
/// ("CACHED"). Each step and its output are printed as they run. The
/// template is the operator's: `corral serve` starts sandboxes from it with
/// `"template": NAME` in an operator's create. Exits 0 when built, 1 when
/// a step failed (its Dockerfile line and output are shown), 125 when the
/// build could not run.
#[derive(Args, Debug)]
pub struct BuildArgs {
    /// The template's name: lower-case letters, digits, '.', '_', '-'.
    name: String,
    /// The build context: a directory, which COPY reads.
    #[arg(default_value = ".")]
    context: PathBuf,
    /// The Dockerfile [default: CONTEXT/Dockerfile].
    #[arg(long, short = 'f', value_name = "PATH")]
    file: Option<PathBuf>,
    /// A value of one of the Dockerfile's ARGs (repeatable).
    #[arg(long = "build-arg", value_name = "NAME=VALUE")]
    build_args: Vec<String>,
    /// Run every step, cached or not.
    #[arg(long)]
    no_cache: bool,
}

pub async fn run(
    config: super::BackendConfig,
    settings: &corral_core::config::Config,
    args: BuildArgs,
) -> anyhow::Result<ExitCode> {
    let file = args
        .file
        .clone()
        .unwrap_or_else(|| args.context.join("Dockerfile"));
    let text = std::fs::read_to_string(&file).map_err(|e| {
        anyhow::anyhow!(
            "cannot read the Dockerfile --file '{}': {e}",
            file.display()
        )
    })?;
    let mut build_args = BTreeMap::new();
    for a in &args.build_args {
        let Some((k, v)) = a.split_once('=') else {
            return Err(CliError::BadArgument {
                command: "build",
                what: "--build-arg",
                value: a.clone(),
                reason: "give NAME=VALUE",
            }
            .into());
        };
        build_args.insert(k.to_string(), v.to_string());
    }
    let recipe = Recipe::from_dockerfile(&text, &build_args).map_err(|e| {
        anyhow::anyhow!(
            "the Dockerfile '{}', {}: {}",
            file.display(),
            e.value,
            e.reason
        )
    })?;
    if !args.context.is_dir() {
        return Err(CliError::BadArgument {
            command: "build",
            what: "CONTEXT",
            value: args.context.display().to_string(),
            reason: "name a directory",
        }
        .into());
    }
    let mut tar = tar::Builder::new(Vec::new());
    tar.follow_symlinks(false);
    tar.append_dir_all(".", &args.context)?;
    let context = tar.into_inner()?;
    let mut spec = settings.defaults.clone();
    if spec.image.is_empty() {
        spec.image = super::default_image();
    }
    let runtime = super::connect(config).await?;
    let mut req = corral::BuildRequest::new(&args.name, recipe, spec);
    req.context = Some(context);
    req.skip_cache = args.no_cache;
    let progress = |e: corral::BuildEvent| {
        let mut err = std::io::stderr().lock();
        let _ = match e {
            corral::BuildEvent::Step {
                index,
                total,
                text,
                cached,
                ..
            } => writeln!(
                err,
                "[{index}/{total}] {}{text}",
                if cached { "CACHED " } else { "" }
            ),
            corral::BuildEvent::Output { text, .. } => write!(err, "{text}"),
            corral::BuildEvent::Note { text } => writeln!(err, "note: {text}"),
        };
    };
    match runtime.build_template(&req, &progress).await {
        Ok(t) => {
            let b = t.build.unwrap_or_default();
            println!(
                "{} ({} steps, {} cached, {:.1} s)",
                t.image,
                b.steps,
                b.cached,
                b.took_ms as f64 / 1e3
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(corral_core::Error::Build(b)) => {
            eprintln!("corral build: {b}");
            eprintln!("{}", b.output.trim_end());
            Ok(ExitCode::from(1))
        }
        Err(e) => Err(e.into()),
    }
}
