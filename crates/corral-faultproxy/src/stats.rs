//! The counters a proxy reports, in the shape `GET /_faultproxy/stats`
//! returns them.

use serde::{Deserialize, Serialize};

/// A snapshot of a proxy's counters since start or the last reset.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Requests received, control requests (`/_faultproxy/...`) excluded.
    pub requests: u64,
    /// Requests that reached the daemon and got a response head back.
    pub forwarded: u64,
    /// Of those, connections hijacked by a `101` answer (exec, attach).
    pub upgraded: u64,
    /// Requests answered `502` because the daemon socket failed.
    pub upstream_errors: u64,
    /// One entry per rule, in rule order.
    pub rules: Vec<RuleStats>,
    /// One entry per tracked matcher, in the order they were set.
    pub tracked: Vec<TrackedStats>,
}

/// Counters of one rule.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleStats {
    /// The rule's method, `None` for any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// The rule's path glob.
    pub path: String,
    /// Requests for which this rule was the first match.
    pub matched: u64,
    /// Requests it fired on (error, reset or delay applied).
    pub injected: u64,
}

/// Concurrency gauge of one tracked matcher.
///
/// A request is in flight from when its head reaches the proxy until the
/// daemon's response head is back (or the proxy answers it itself); an
/// injected delay counts as in flight, since it stands for a slow daemon.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrackedStats {
    /// The matcher's method, `None` for any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// The matcher's path glob.
    pub path: String,
    /// Matching requests in flight now.
    pub in_flight: u64,
    /// The most ever in flight at once.
    pub max_in_flight: u64,
    /// Matching requests seen.
    pub total: u64,
}

impl Stats {
    /// The gauge of the tracked matcher with this method and path glob.
    pub fn tracked(&self, method: Option<&str>, path: &str) -> Option<&TrackedStats> {
        self.tracked
            .iter()
            .find(|t| t.method.as_deref() == method && t.path == path)
    }
}
