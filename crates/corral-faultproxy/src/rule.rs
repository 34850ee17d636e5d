//! Fault rules, tracked matchers and the proxy configuration: their types,
//! constructors and validation. Their JSON form is in `rule/json.rs`.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::glob::{normalize_path, Glob};

mod json;

pub(crate) use json::{parse_rules, parse_seed, parse_tracked};

/// The seed used when none is given, so runs are reproducible by default.
pub const DEFAULT_SEED: u64 = 0x5eed_c0ff_ee00_0001;

/// The longest delay a rule may ask for; anything longer is almost surely a
/// unit mistake (seconds written as milliseconds twice over).
pub const MAX_DELAY_MS: u64 = 3_600_000;

/// A configuration value that was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ConfigError {
    /// Where the bad value is, e.g. `rules[0].probability`.
    pub field: String,
    /// What is wrong with it, including the value.
    pub reason: String,
}

impl ConfigError {
    fn new(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
        ConfigError {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Selects requests by method and path.
///
/// The path is matched without its query string and without any `/v1.NN`
/// version prefix: `*` matches any run of characters except `/`, `**`
/// matches anything.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Value")]
pub struct Matcher {
    /// HTTP method (compared case-insensitively); `None` matches any method.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Path glob, e.g. `/containers/*/start`.
    pub path: String,
}

impl Matcher {
    /// A matcher for `method` requests whose path matches `path`.
    pub fn new(method: impl Into<String>, path: impl Into<String>) -> Matcher {
        Matcher {
            method: Some(method.into()),
            path: path.into(),
        }
    }

    /// A matcher for requests of any method whose path matches `path`.
    pub fn any_method(path: impl Into<String>) -> Matcher {
        Matcher {
            method: None,
            path: path.into(),
        }
    }

    /// Parses `"POST /containers/*/start"` or `"/containers/*/start"` (any
    /// method), the form the binary's `--track` flag takes.
    pub fn parse(spec: &str) -> Result<Matcher, ConfigError> {
        let spec = spec.trim();
        let matcher = match spec.split_once(char::is_whitespace) {
            Some((method, path)) => Matcher::new(method, path.trim()),
            None => Matcher::any_method(spec),
        };
        matcher.validate("matcher")?;
        Ok(matcher)
    }

    /// Whether a request with `method` and `path` (without query string;
    /// a `/v1.NN` prefix is ignored) matches. Compiles the glob on each
    /// call; the proxy keeps its matchers compiled.
    pub fn matches(&self, method: &str, path: &str) -> bool {
        CompiledMatcher::new(self).matches(method, normalize_path(path))
    }

    pub(crate) fn validate(&self, field: &str) -> Result<(), ConfigError> {
        if let Some(method) = &self.method {
            if method.is_empty() || http::Method::from_bytes(method.as_bytes()).is_err() {
                return Err(ConfigError::new(
                    format!("{field}.method"),
                    format!("{method:?} is not an HTTP method"),
                ));
            }
        }
        if !(self.path.starts_with('/') || self.path.starts_with('*')) {
            return Err(ConfigError::new(
                format!("{field}.path"),
                format!("{:?} must start with '/' or '*'", self.path),
            ));
        }
        Ok(())
    }
}

/// A matcher with its glob compiled, as the proxy keeps it.
#[derive(Clone, Debug)]
pub(crate) struct CompiledMatcher {
    method: Option<String>,
    glob: Glob,
}

impl CompiledMatcher {
    pub(crate) fn new(matcher: &Matcher) -> CompiledMatcher {
        CompiledMatcher {
            method: matcher.method.clone(),
            glob: Glob::new(&matcher.path),
        }
    }

    pub(crate) fn matches(&self, method: &str, path: &str) -> bool {
        self.method
            .as_deref()
            .is_none_or(|m| m.eq_ignore_ascii_case(method))
            && self.glob.matches(path)
    }
}

/// What a rule does to a request it fires on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", try_from = "Value")]
pub enum Action {
    /// Answer with `status` and Docker's error body `{"message": ...}`
    /// without forwarding. JSON: `{"error": {"status": 500, "message": "..."}}`.
    Error {
        /// HTTP status, 400..=599.
        status: u16,
        /// The daemon's error message as the client will see it.
        message: String,
    },
    /// Read the request, then close the client connection without an
    /// answer. JSON: `"reset"`.
    Reset,
    /// Wait this many milliseconds, then forward. JSON: `{"delay_ms": 300}`.
    DelayMs(u64),
}

impl Action {
    /// An injected daemon error.
    pub fn error(status: u16, message: impl Into<String>) -> Action {
        Action::Error {
            status,
            message: message.into(),
        }
    }

    /// A delay before forwarding.
    pub fn delay(delay: Duration) -> Action {
        Action::DelayMs(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX))
    }

    fn validate(&self, field: &str) -> Result<(), ConfigError> {
        match self {
            Action::Error { status, .. } if !(400..=599).contains(status) => Err(ConfigError::new(
                format!("{field}.error.status"),
                format!("{status} is not an error status (400..=599)"),
            )),
            Action::DelayMs(ms) if *ms > MAX_DELAY_MS => Err(ConfigError::new(
                format!("{field}.delay_ms"),
                format!("{ms} is longer than the maximum of {MAX_DELAY_MS}"),
            )),
            _ => Ok(()),
        }
    }
}

/// A fault rule: requests matching `matcher` get `action` with
/// `probability`, at most `max_hits` times. The first rule whose matcher
/// matches decides; if it does not fire (lost draw, hits used up) the request
/// is forwarded untouched.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "Value")]
pub struct Rule {
    /// Which requests the rule applies to.
    #[serde(flatten)]
    pub matcher: Matcher,
    /// What to do to them.
    pub action: Action,
    /// Chance of firing per matching request, 0.0..=1.0 (default 1.0), drawn
    /// from the proxy's seeded generator.
    pub probability: f64,
    /// Fire at most this many times (counted from when the rules were set);
    /// `None` for no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_hits: Option<u64>,
}

impl Rule {
    /// A rule that always fires, without limit.
    pub fn new(matcher: Matcher, action: Action) -> Rule {
        Rule {
            matcher,
            action,
            probability: 1.0,
            max_hits: None,
        }
    }

    /// The same rule firing with `probability`.
    pub fn with_probability(mut self, probability: f64) -> Rule {
        self.probability = probability;
        self
    }

    /// The same rule firing at most `max_hits` times.
    pub fn with_max_hits(mut self, max_hits: u64) -> Rule {
        self.max_hits = Some(max_hits);
        self
    }

    pub(crate) fn validate(&self, field: &str) -> Result<(), ConfigError> {
        self.matcher.validate(field)?;
        self.action.validate(&format!("{field}.action"))?;
        if !(0.0..=1.0).contains(&self.probability) {
            return Err(ConfigError::new(
                format!("{field}.probability"),
                format!("{} is not within 0.0..=1.0", self.probability),
            ));
        }
        Ok(())
    }
}

/// Everything that can be configured on a running proxy.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Config {
    /// Seed of the generator behind `probability` (default [`DEFAULT_SEED`]).
    pub seed: u64,
    /// Fault rules, first match wins.
    pub rules: Vec<Rule>,
    /// Requests whose concurrency is measured in the stats.
    pub tracked: Vec<Matcher>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            seed: DEFAULT_SEED,
            rules: Vec::new(),
            tracked: Vec::new(),
        }
    }
}

impl Config {
    /// Checks every rule and matcher, naming the first bad field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate_rules(&self.rules, "rules")?;
        validate_tracked(&self.tracked, "tracked")
    }
}

pub(crate) fn validate_rules(rules: &[Rule], field: &str) -> Result<(), ConfigError> {
    rules
        .iter()
        .enumerate()
        .try_for_each(|(i, rule)| rule.validate(&format!("{field}[{i}]")))
}

pub(crate) fn validate_tracked(tracked: &[Matcher], field: &str) -> Result<(), ConfigError> {
    tracked
        .iter()
        .enumerate()
        .try_for_each(|(i, matcher)| matcher.validate(&format!("{field}[{i}]")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matcher_compares_method_case_insensitively() -> Result<(), ConfigError> {
        let m = Matcher::parse("post /containers/*/start")?;
        assert!(m.matches("POST", "/containers/c1/start"));
        assert!(!m.matches("GET", "/containers/c1/start"));
        let any = Matcher::parse("/containers/**")?;
        assert!(any.matches("DELETE", "/containers/c1"));
        assert!(m.matches("POST", "/v1.41/containers/c1/start"));
        assert!(Matcher::parse("GET containers").is_err());
        Ok(())
    }
}
