//! `corral config`: check, show and print an example of the configuration
//! file; and the loading every other subcommand starts with.
//!
//! Precedence, highest first: command-line flags, `CORRAL_*` environment
//! variables, the file, the built-in defaults. The file is `--config FILE`
//! (or `$CORRAL_CONFIG`), else `$XDG_CONFIG_HOME/corral/config.yaml` or
//! `~/.config/corral/config.yaml` when it exists.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use corral::host::RealHost;
use corral_core::config::{Config, EXAMPLE_YAML};

/// Check, show or print an example of corral's configuration file.
#[derive(Args, Debug)]
pub struct ConfigArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(Subcommand, Debug)]
enum Action {
    /// Parse FILE (default: --config, $CORRAL_CONFIG, else the default
    /// file if it exists), apply CORRAL_* environment overrides, and
    /// validate every value, mount paths against this host. Prints
    /// `ok: FILE`, or the error naming the key and the value and exits 1.
    Check {
        /// The file to check.
        file: Option<PathBuf>,
    },
    /// Print the configuration in force, as YAML: the file, then the
    /// environment overrides, then the global flags (not validated: use
    /// `corral config check`).
    Show,
    /// Print an example file: every key with its default and what it does.
    Example,
}

/// The global flags that override the configuration.
#[derive(Debug, Default)]
pub struct Flags {
    /// `--endpoint`.
    pub endpoint: Option<String>,
    /// `--start-limit`.
    pub start_limit: Option<usize>,
    /// `--exec-limit`.
    pub exec_limit: Option<usize>,
}

impl Flags {
    fn apply(&self, config: &mut Config) {
        if let Some(e) = &self.endpoint {
            config.endpoint = Some(e.clone());
        }
        if let Some(n) = self.start_limit {
            config.daemon.start_limit = n;
        }
        if let Some(n) = self.exec_limit {
            config.daemon.exec_limit = n;
        }
    }
}

/// The file to read: the one named (which must exist), else the default
/// file when it exists, else none.
fn locate(named: Option<&Path>) -> Option<PathBuf> {
    match named {
        Some(p) => Some(p.to_path_buf()),
        None => Config::default_path(&RealHost).filter(|p| p.is_file()),
    }
}

/// How errors name the source of a bad value.
fn source(file: Option<&Path>) -> String {
    match file {
        Some(path) => format!("config file {}", path.display()),
        None => "configuration".to_string(),
    }
}

/// Reads and parses `file` (defaults when `None`) and applies the
/// environment overrides.
fn read(file: Option<&Path>) -> anyhow::Result<Config> {
    let mut config = match file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read config file {}", path.display()))?;
            Config::from_yaml(&text).with_context(|| source(file))?
        }
        None => Config::default(),
    };
    config.apply_env(|name| std::env::var(name).ok())?;
    Ok(config)
}

/// The configuration every subcommand runs with: file, environment, flags,
/// validated against this host.
pub fn load(named: Option<&Path>, flags: &Flags) -> anyhow::Result<Config> {
    let file = locate(named);
    let mut config = read(file.as_deref())?;
    flags.apply(&mut config);
    config
        .validate(&RealHost)
        .with_context(|| source(file.as_deref()))?;
    Ok(config)
}

/// Runs `corral config ...`; `named` is the global `--config`.
pub fn run(named: Option<&Path>, flags: &Flags, args: ConfigArgs) -> ExitCode {
    match args.action {
        Action::Check { file } => {
            let file = locate(file.as_deref().or(named));
            let checked = read(file.as_deref()).and_then(|c| {
                c.validate(&RealHost)
                    .with_context(|| source(file.as_deref()))
            });
            match (checked, &file) {
                (Ok(()), Some(path)) => {
                    println!("ok: {}", path.display());
                    ExitCode::SUCCESS
                }
                (Ok(()), None) => {
                    println!("ok: built-in defaults (no config file)");
                    ExitCode::SUCCESS
                }
                (Err(e), _) => {
                    crate::diagnostics::Diagnostic::of(&e).emit();
                    ExitCode::from(1)
                }
            }
        }
        Action::Show => {
            let shown = read(locate(named).as_deref()).and_then(|mut c| {
                flags.apply(&mut c);
                Ok(c.to_yaml()?)
            });
            match shown {
                Ok(yaml) => {
                    print!("{yaml}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    crate::diagnostics::Diagnostic::of(&e).emit();
                    ExitCode::from(1)
                }
            }
        }
        Action::Example => {
            print!("{EXAMPLE_YAML}");
            ExitCode::SUCCESS
        }
    }
}
