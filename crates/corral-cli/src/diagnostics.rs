//! How the CLI reports a failure, as cargo and git do: `error: WHAT`, then,
//! where corral can tell, `help: WHAT TO DO NEXT`.
//!
//! The help is derived from the error's type: the variant and fields of
//! [`corral_core::Error`], a [`ConfigError`]'s key path, a failure's
//! [`FailureKind`], the CLI's own [`CliError`]; never from matching the
//! text of a message. Colour only on a terminal, and not with `NO_COLOR`.
//! `--json` outputs are not rendered here: their failures stay JSON.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use corral_core::config::{ConfigError, ENV_OVERRIDES};
use corral_core::{Error as CoreError, Failure, FailureKind};

/// The CLI's own failures, the ones no library reports.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// No sandbox's id starts with what was given.
    #[error("no sandbox '{wanted}'")]
    NoSandbox {
        /// The id (or prefix) given.
        wanted: String,
    },
    /// More than one sandbox's id starts with what was given.
    #[error("'{wanted}' names {} sandboxes ({})", ids.len(), ids.join(", "))]
    AmbiguousSandbox {
        /// The prefix given.
        wanted: String,
        /// The sandboxes it matches.
        ids: Vec<String>,
    },
    /// `corral man NAME` of a command corral does not have.
    #[error("no command '{name}'")]
    NoCommand {
        /// The name given.
        name: String,
    },
    /// An argument that must name something was empty or out of range.
    #[error("invalid {what} '{value}': {reason}")]
    BadArgument {
        /// The subcommand (`pull`, `port`).
        command: &'static str,
        /// The argument (`IMAGE`, `PORT`, `--interval-ms`).
        what: &'static str,
        /// Its value.
        value: String,
        /// What it must be.
        reason: &'static str,
    },
    /// No service answered at the URL.
    #[error("cannot reach the service at {url}: {reason}")]
    ServiceUnreachable {
        /// Where corral looked.
        url: String,
        /// What the system said.
        reason: String,
    },
    /// The service answered with an error status.
    #[error("the service at {url} answered {status}: {message}")]
    ServiceRefused {
        /// The service's URL.
        url: String,
        /// The HTTP status code.
        status: u16,
        /// The service's message.
        message: String,
        /// Where the token sent came from.
        token: TokenSource,
    },
}

/// Where the bearer token a client command sent came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `--token`.
    Flag,
    /// An environment variable (`CORRAL_TOKEN`).
    Env(&'static str),
    /// A key of the config file (`server.admin_token`, `server.token`).
    Config(&'static str),
    /// The file a local `corral serve` wrote its generated token to.
    File(PathBuf),
    /// None was sent.
    None,
}

/// One failure as the user reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// What went wrong, with the ids involved.
    pub error: String,
    /// What to do next, one line each; empty when corral cannot tell.
    pub help: Vec<String>,
}

impl Diagnostic {
    /// A diagnostic of a message, with no help.
    pub fn new(error: impl Into<String>) -> Self {
        Diagnostic {
            error: error.into(),
            help: Vec::new(),
        }
    }

    /// `error` with the help the first typed error in its chain gives.
    pub fn of(e: &anyhow::Error) -> Self {
        let help = e.chain().find_map(|cause| {
            if let Some(x) = cause.downcast_ref::<CoreError>() {
                return Some(core_help(x));
            }
            if let Some(x) = cause.downcast_ref::<ConfigError>() {
                return Some(config_help(x));
            }
            if let Some(x) = cause.downcast_ref::<CliError>() {
                return Some(cli_help(x));
            }
            None
        });
        Diagnostic {
            error: format!("{e:#}"),
            help: help.unwrap_or_default(),
        }
    }

    /// A runtime error, with its help.
    pub fn of_core(e: &CoreError) -> Self {
        Diagnostic {
            error: e.to_string(),
            help: core_help(e),
        }
    }

    /// A command's typed failure (what `corral run` reports), with the
    /// help its kind gives.
    pub fn of_failure(f: &Failure) -> Self {
        Diagnostic {
            error: f.to_string(),
            help: kind_help(f.kind).into_iter().collect(),
        }
    }

    /// The text: `error: ...` and one `help: ...` line each, coloured as
    /// cargo colours them when `colour`.
    pub fn render(&self, colour: bool) -> String {
        let (error, help, reset) = if colour {
            (
                "\x1b[1;31merror\x1b[0m\x1b[1m",
                "\x1b[1;36mhelp\x1b[0m",
                "\x1b[0m",
            )
        } else {
            ("error", "help", "")
        };
        let mut out = format!("{error}: {}{reset}\n", self.error);
        for line in &self.help {
            out.push_str(&format!("{help}: {line}\n"));
        }
        out
    }

    /// Writes the diagnostic to stderr.
    pub fn emit(&self) {
        let text = self.render(colour());
        let _ = std::io::stderr().lock().write_all(text.as_bytes());
    }
}

/// Whether stderr gets colour: a terminal, `NO_COLOR` unset or empty, and
/// not `TERM=dumb`.
pub fn colour() -> bool {
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let dumb = std::env::var_os("TERM").is_some_and(|t| t == "dumb");
    !no_color && !dumb && std::io::stderr().is_terminal()
}

/// Writes `warning: MESSAGE` to stderr (yellow on a terminal).
pub fn warn(message: impl std::fmt::Display) {
    let label = if colour() {
        "\x1b[1;33mwarning\x1b[0m"
    } else {
        "warning"
    };
    eprintln!("{label}: {message}");
}

/// The flag, variable and key that raise a start or exec slot limit;
/// `None` for a wait that no limit caused (the circuit breaker's).
fn slot_limit_names(what: &str) -> Option<(&'static str, &'static str, &'static str)> {
    match what {
        "exec" => Some(("--exec-limit", "CORRAL_EXEC_LIMIT", "daemon.exec_limit")),
        "start" => Some(("--start-limit", "CORRAL_START_LIMIT", "daemon.start_limit")),
        _ => None,
    }
}

fn core_help(e: &CoreError) -> Vec<String> {
    let line = match e {
        CoreError::EngineUnavailable { engine, .. } if *engine == "Docker" => {
            "start the Docker daemon (or Podman's service), or point DOCKER_HOST or --endpoint \
             at one that runs; `corral doctor` checks the setup"
                .to_string()
        }
        CoreError::EngineUnavailable { .. } => {
            "check KUBECONFIG (or the config's kubernetes.kubeconfig and kubernetes.context) and \
             that the cluster's API server answers; `corral doctor` checks the setup"
                .to_string()
        }
        CoreError::EngineLost { .. } => {
            "the daemon stopped answering; check it runs (`corral doctor`), then try again"
                .to_string()
        }
        CoreError::Engine { kind, .. } => return kind_help(*kind).into_iter().collect(),
        CoreError::ImageNotFound { image, .. } => format!(
            "fetch it with `corral pull {image}`, or build it on this host \
             (`docker build -t {image} DIR`); `corral images` lists the images there are"
        ),
        CoreError::InvalidSpec(spec) if spec.field == "snapshot" => {
            "`corral snapshots` lists the snapshots there are".to_string()
        }
        CoreError::InvalidSpec(spec) => format!(
            "fix {}: `corral run --help` lists the flags and `corral config example` the keys \
             that set it",
            spec.field
        ),
        CoreError::SnapshotTooLarge { .. } => {
            "raise snapshots.max_bytes in the config, or write less in the sandbox".to_string()
        }
        CoreError::Unsupported { .. } => {
            "`corral doctor` reports what this daemon supports".to_string()
        }
        CoreError::Network { network, .. } => format!(
            "`corral doctor` checks corral's network; one made by someone else can be removed \
             (`docker network rm {network}`) and corral makes its own"
        ),
        CoreError::Capacity { .. } => {
            "try again when sandboxes have ended or the cluster has more room; `corral ps` \
             lists the sandboxes"
                .to_string()
        }
        CoreError::NoRoom { max_live, .. } => format!(
            "raise provider.max_live (or CORRAL_MAX_LIVE; now {max_live}), or end sandboxes \
             you no longer need (`corral ps`)"
        ),
        CoreError::ContainerLost { .. } => {
            return kind_help(e.kind()).into_iter().collect();
        }
        CoreError::Build(b) => format!(
            "step {}{} failed inside the build sandbox; its output is above. Fix the step \
             and build again: the steps before it are cached",
            b.step,
            b.line
                .map(|l| format!(" (Dockerfile line {l})"))
                .unwrap_or_default()
        ),
        CoreError::Startup { index, .. } => format!(
            "start-up command {index} comes from --startup or the config's `startup:`; run it \
             as the command (`corral run -- SCRIPT`) to see why it fails"
        ),
        CoreError::SlotTimeout { what, limit, .. } => match slot_limit_names(what) {
            Some((flag, var, key)) => format!(
                "raise {flag} (or {var}, {key}; now {limit}, 0: unlimited) or \
                 daemon.slot_wait_timeout_ms, or run fewer corral processes at once"
            ),
            None => "the daemon has been failing starts (circuit breaker open): check it \
                     (`corral doctor`), then try again"
                .to_string(),
        },
        CoreError::Agent { .. } | CoreError::ShutDown { .. } | CoreError::Host { .. } => {
            return Vec::new()
        }
    };
    vec![line]
}

/// What to do about a failure of `kind`, where the kind alone says.
fn kind_help(kind: FailureKind) -> Option<String> {
    let line = match kind {
        FailureKind::Timeout => "the command ran past its --timeout; give it more seconds",
        FailureKind::OomKilled => "the sandbox ran out of memory; raise --memory (e.g. 2g)",
        FailureKind::ContainerLost => {
            "the container was stopped or removed from outside corral; --recovery recreate \
             runs the command once more in a new one"
        }
        FailureKind::DaemonUnavailable => "check the daemon runs (`corral doctor`), then try again",
        FailureKind::Capacity => "try again when sandboxes have ended (`corral ps`)",
        FailureKind::ImageNotFound => {
            "fetch the image with `corral pull IMAGE`, or build it on this host"
        }
        FailureKind::Unsupported => "`corral doctor` reports what this daemon supports",
        FailureKind::InvalidSpec
        | FailureKind::SpawnFailed
        | FailureKind::AgentError
        | FailureKind::ProtocolViolation => return None,
    };
    Some(line.to_string())
}

fn config_help(e: &ConfigError) -> Vec<String> {
    if let Some(key) = e.closest_key() {
        return vec![format!(
            "did you mean `{key}`? (`corral config example` lists every key)"
        )];
    }
    let line = match e {
        ConfigError::Parse { .. } => {
            "`corral config example` lists every key with its default".to_string()
        }
        ConfigError::Invalid { path, .. } => format!(
            "`corral config example` shows what {path} takes; `corral config check` checks \
             a file"
        ),
        ConfigError::Env { var, .. } => match ENV_OVERRIDES.iter().find(|(name, _)| name == var) {
            Some((_, key)) => format!("fix or unset {var} (it overrides the config's {key})"),
            None => format!("fix or unset {var}"),
        },
        ConfigError::Serialize(_) => return Vec::new(),
    };
    vec![line]
}

fn cli_help(e: &CliError) -> Vec<String> {
    let line = match e {
        CliError::NoSandbox { .. } => "`corral ps` lists the sandboxes".to_string(),
        CliError::AmbiguousSandbox { .. } => "give more of the sandbox's id".to_string(),
        CliError::NoCommand { .. } => "`corral --help` lists the commands".to_string(),
        CliError::BadArgument { command, what, .. } => {
            format!("`corral {command} --help` says what {what} takes")
        }
        CliError::ServiceUnreachable { .. } => {
            "start the service (`corral serve`), or point --url at where it listens".to_string()
        }
        CliError::ServiceRefused {
            status: 401, token, ..
        } => match token {
            TokenSource::Flag => {
                "the --token given was refused: give the service's token (its server.token, \
                 CORRAL_TOKEN or server.admin_token)"
                    .to_string()
            }
            TokenSource::Env(var) => format!(
                "the token in {var} was refused: set {var} (or give --token) to the service's \
                 token"
            ),
            TokenSource::Config(key) => format!(
                "the config's {key} was refused: set it (or give --token) to the service's token"
            ),
            TokenSource::File(path) => format!(
                "the token in {} was refused (a service gone?): give --token or set \
                 CORRAL_TOKEN",
                path.display()
            ),
            TokenSource::None => {
                "no token was sent: give --token, or set CORRAL_TOKEN or the config's \
                 server.admin_token"
                    .to_string()
            }
        },
        CliError::ServiceRefused { status: 403, .. } => {
            "this token may not do that: the operator's (server.admin_token) may".to_string()
        }
        CliError::ServiceRefused { .. } => return Vec::new(),
    };
    vec![line]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn renders_error_then_help_and_colours_only_when_asked() {
        let d = Diagnostic {
            error: "no sandbox 'x'".into(),
            help: vec!["`corral ps` lists the sandboxes".into()],
        };
        assert_eq!(
            d.render(false),
            "error: no sandbox 'x'\nhelp: `corral ps` lists the sandboxes\n"
        );
        let coloured = d.render(true);
        assert!(coloured.contains("\x1b[1;31merror"), "{coloured:?}");
        assert!(coloured.contains("\x1b[1;36mhelp"), "{coloured:?}");
    }

    #[test]
    fn help_comes_from_the_type_through_context() {
        let e = anyhow::Error::new(CoreError::SlotTimeout {
            what: "exec",
            limit: 16,
            waited: Duration::from_secs(600),
        })
        .context("running a command");
        let d = Diagnostic::of(&e);
        assert!(
            d.error.starts_with("running a command: no exec slot"),
            "{}",
            d.error
        );
        assert!(
            d.help[0].starts_with("raise --exec-limit (or CORRAL_EXEC_LIMIT"),
            "{d:?}"
        );

        let e = anyhow::Error::new(CoreError::ImageNotFound {
            image: "py:9".into(),
            reason: "no such host".into(),
        });
        assert!(Diagnostic::of(&e).help[0].contains("`corral pull py:9`"));

        // The breaker's wait is no limit's: no flag to raise.
        let e = anyhow::Error::new(CoreError::SlotTimeout {
            what: "start (circuit breaker open)",
            limit: 8,
            waited: Duration::from_secs(600),
        });
        let help = &Diagnostic::of(&e).help[0];
        assert!(
            help.contains("circuit breaker") && !help.contains("--start-limit"),
            "{help}"
        );

        // Text alone gives no help: nothing is guessed from a message.
        let e = anyhow::anyhow!("no Docker daemon answered");
        assert!(Diagnostic::of(&e).help.is_empty());
    }

    #[test]
    fn failures_of_a_command_point_at_the_flag() {
        let f = Failure::new(FailureKind::Timeout, "command timed out after 1s");
        assert!(Diagnostic::of_failure(&f).help[0].contains("--timeout"));
        let f = Failure::new(FailureKind::OomKilled, "killed");
        assert!(Diagnostic::of_failure(&f).help[0].contains("--memory"));
    }
}
