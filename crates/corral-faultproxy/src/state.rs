//! The proxy's shared state: rules with their budgets, the generator, the
//! counters and the in-flight gauges, behind one mutex that is never held
//! across an `.await`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::rng::XorShift;
use crate::rule::{Action, CompiledMatcher, Config, Matcher, Rule};
use crate::stats::{RuleStats, Stats, TrackedStats};

/// What to do with one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    Forward,
    Error { status: u16, message: String },
    Reset,
    Delay(Duration),
}

struct RuleState {
    rule: Rule,
    compiled: CompiledMatcher,
    /// Budget used against `max_hits`; unlike `stats`, a stats reset keeps
    /// it, so a reset between test phases cannot re-arm a one-shot fault.
    hits: u64,
    stats: RuleStats,
}

struct TrackedState {
    compiled: CompiledMatcher,
    stats: TrackedStats,
}

struct Inner {
    seed: u64,
    rng: XorShift,
    rules: Vec<RuleState>,
    tracked: Vec<TrackedState>,
    /// Bumped whenever `tracked` is replaced, so a guard taken against an
    /// older list does not decrement a gauge it never incremented.
    tracked_generation: u64,
    requests: u64,
    forwarded: u64,
    upgraded: u64,
    upstream_errors: u64,
}

/// State shared by the accept loop, every connection and the handle.
pub(crate) struct Shared {
    pub(crate) upstream: PathBuf,
    inner: Mutex<Inner>,
    /// Bumped to cut every hijacked connection open at that moment.
    pub(crate) cut: tokio::sync::watch::Sender<u64>,
}

impl Shared {
    pub(crate) fn new(upstream: PathBuf, config: Config) -> Shared {
        let shared = Shared {
            upstream,
            cut: tokio::sync::watch::channel(0).0,
            inner: Mutex::new(Inner {
                seed: config.seed,
                rng: XorShift::new(config.seed),
                rules: Vec::new(),
                tracked: Vec::new(),
                tracked_generation: 0,
                requests: 0,
                forwarded: 0,
                upgraded: 0,
                upstream_errors: 0,
            }),
        };
        shared.set_rules(config.rules);
        shared.set_tracked(config.tracked);
        shared
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Nothing panics while holding the lock, and the counters stay
        // meaningful even if something did.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Replaces the rules (already validated); budgets and the generator
    /// restart, so the same rules and seed give the same faults.
    pub(crate) fn set_rules(&self, rules: Vec<Rule>) {
        let mut inner = self.lock();
        inner.rules = rules
            .into_iter()
            .map(|rule| RuleState {
                compiled: CompiledMatcher::new(&rule.matcher),
                hits: 0,
                stats: RuleStats {
                    method: rule.matcher.method.clone(),
                    path: rule.matcher.path.clone(),
                    matched: 0,
                    injected: 0,
                },
                rule,
            })
            .collect();
        inner.rng = XorShift::new(inner.seed);
    }

    pub(crate) fn rules(&self) -> Vec<Rule> {
        self.lock().rules.iter().map(|r| r.rule.clone()).collect()
    }

    /// Replaces the tracked matchers (already validated); their gauges start
    /// at zero and requests already in flight are not counted.
    pub(crate) fn set_tracked(&self, tracked: Vec<Matcher>) {
        let mut inner = self.lock();
        inner.tracked_generation += 1;
        inner.tracked = tracked
            .into_iter()
            .map(|matcher| TrackedState {
                compiled: CompiledMatcher::new(&matcher),
                stats: TrackedStats {
                    method: matcher.method,
                    path: matcher.path,
                    ..TrackedStats::default()
                },
            })
            .collect();
    }

    pub(crate) fn tracked(&self) -> Vec<Matcher> {
        self.lock()
            .tracked
            .iter()
            .map(|t| Matcher {
                method: t.stats.method.clone(),
                path: t.stats.path.clone(),
            })
            .collect()
    }

    /// Sets the seed and restarts the generator from it.
    pub(crate) fn set_seed(&self, seed: u64) {
        let mut inner = self.lock();
        inner.seed = seed;
        inner.rng = XorShift::new(seed);
    }

    pub(crate) fn seed(&self) -> u64 {
        self.lock().seed
    }

    pub(crate) fn config(&self) -> Config {
        Config {
            seed: self.seed(),
            rules: self.rules(),
            tracked: self.tracked(),
        }
    }

    pub(crate) fn stats(&self) -> Stats {
        let inner = self.lock();
        Stats {
            requests: inner.requests,
            forwarded: inner.forwarded,
            upgraded: inner.upgraded,
            upstream_errors: inner.upstream_errors,
            rules: inner.rules.iter().map(|r| r.stats.clone()).collect(),
            tracked: inner.tracked.iter().map(|t| t.stats.clone()).collect(),
        }
    }

    /// Zeroes the counters; gauges keep what is in flight now, and rule
    /// budgets are kept (see [`RuleState::hits`]).
    pub(crate) fn reset_stats(&self) {
        let mut inner = self.lock();
        inner.requests = 0;
        inner.forwarded = 0;
        inner.upgraded = 0;
        inner.upstream_errors = 0;
        for rule in &mut inner.rules {
            rule.stats.matched = 0;
            rule.stats.injected = 0;
        }
        for tracked in &mut inner.tracked {
            tracked.stats.max_in_flight = tracked.stats.in_flight;
            tracked.stats.total = 0;
        }
    }

    /// Counts a new request, enters it into the gauges and decides its fate.
    pub(crate) fn begin(self: &Arc<Self>, method: &str, path: &str) -> (Decision, InFlight) {
        let mut inner = self.lock();
        inner.requests += 1;

        let mut gauges = Vec::new();
        for (i, tracked) in inner.tracked.iter_mut().enumerate() {
            if tracked.compiled.matches(method, path) {
                let stats = &mut tracked.stats;
                stats.in_flight += 1;
                stats.total += 1;
                stats.max_in_flight = stats.max_in_flight.max(stats.in_flight);
                gauges.push(i);
            }
        }
        let guard = InFlight {
            shared: Arc::clone(self),
            generation: inner.tracked_generation,
            gauges,
        };

        let inner = &mut *inner;
        let Some(rule) = inner
            .rules
            .iter_mut()
            .find(|r| r.compiled.matches(method, path))
        else {
            return (Decision::Forward, guard);
        };
        rule.stats.matched += 1;
        if rule.rule.max_hits.is_some_and(|max| rule.hits >= max) {
            return (Decision::Forward, guard);
        }
        let p = rule.rule.probability;
        // Certain outcomes take no draw, so adding an always-on rule does not
        // shift the sequence the probabilistic ones see.
        let fire = p >= 1.0 || (p > 0.0 && inner.rng.next_f64() < p);
        if !fire {
            return (Decision::Forward, guard);
        }
        rule.hits += 1;
        rule.stats.injected += 1;
        let decision = match &rule.rule.action {
            Action::Error { status, message } => Decision::Error {
                status: *status,
                message: message.clone(),
            },
            Action::Reset => Decision::Reset,
            Action::DelayMs(ms) => Decision::Delay(Duration::from_millis(*ms)),
        };
        (decision, guard)
    }

    pub(crate) fn note_forwarded(&self, upgraded: bool) {
        let mut inner = self.lock();
        inner.forwarded += 1;
        if upgraded {
            inner.upgraded += 1;
        }
    }

    pub(crate) fn note_upstream_error(&self) {
        self.lock().upstream_errors += 1;
    }
}

/// Keeps a request counted in the in-flight gauges until dropped; dropping
/// also covers a client that disconnects mid-request.
pub(crate) struct InFlight {
    shared: Arc<Shared>,
    generation: u64,
    gauges: Vec<usize>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.gauges.is_empty() {
            return;
        }
        let mut inner = self.shared.lock();
        if inner.tracked_generation != self.generation {
            return;
        }
        for &i in &self.gauges {
            if let Some(tracked) = inner.tracked.get_mut(i) {
                tracked.stats.in_flight = tracked.stats.in_flight.saturating_sub(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(rules: Vec<Rule>, tracked: Vec<Matcher>) -> Arc<Shared> {
        Arc::new(Shared::new(
            PathBuf::from("/nonexistent"),
            Config {
                seed: 1,
                rules,
                tracked,
            },
        ))
    }

    #[test]
    fn first_match_wins_and_budget_runs_out() {
        let s = shared(
            vec![
                Rule::new(
                    Matcher::new("POST", "/containers/*/start"),
                    Action::error(500, "database is locked"),
                )
                .with_max_hits(1),
                Rule::new(Matcher::any_method("/**"), Action::Reset),
            ],
            vec![],
        );
        let (first, _) = s.begin("POST", "/containers/c1/start");
        assert_eq!(
            first,
            Decision::Error {
                status: 500,
                message: "database is locked".into()
            }
        );
        // Exhausted, but still the first match: forwarded, not reset.
        assert_eq!(s.begin("POST", "/containers/c1/start").0, Decision::Forward);
        assert_eq!(s.begin("GET", "/_ping").0, Decision::Reset);
        let stats = s.stats();
        assert_eq!(stats.requests, 3);
        assert_eq!((stats.rules[0].matched, stats.rules[0].injected), (2, 1));
        assert_eq!((stats.rules[1].matched, stats.rules[1].injected), (1, 1));
        s.reset_stats();
        assert_eq!(s.stats().rules[0].matched, 0);
        assert_eq!(s.begin("POST", "/containers/c1/start").0, Decision::Forward);
    }

    #[test]
    fn probability_is_reproducible_per_seed() {
        let rule = Rule::new(Matcher::any_method("/_ping"), Action::Reset).with_probability(0.5);
        let s = shared(vec![rule.clone()], vec![]);
        let run = |s: &Arc<Shared>| -> Vec<bool> {
            (0..40)
                .map(|_| s.begin("GET", "/_ping").0 == Decision::Reset)
                .collect()
        };
        let first = run(&s);
        let fired = first.iter().filter(|f| **f).count();
        assert!(fired > 0 && fired < 40, "{fired}");
        s.set_rules(vec![rule]);
        assert_eq!(run(&s), first);
    }

    #[test]
    fn gauges_follow_guards_and_survive_replacement() {
        let s = shared(vec![], vec![Matcher::new("POST", "/containers/*/start")]);
        let a = s.begin("POST", "/containers/a/start").1;
        let b = s.begin("POST", "/containers/b/start").1;
        let _other = s.begin("GET", "/containers/json").1;
        let g = |s: &Arc<Shared>| s.stats().tracked[0].clone();
        assert_eq!(
            (g(&s).in_flight, g(&s).max_in_flight, g(&s).total),
            (2, 2, 2)
        );
        drop(a);
        assert_eq!((g(&s).in_flight, g(&s).max_in_flight), (1, 2));
        s.reset_stats();
        assert_eq!(
            (g(&s).in_flight, g(&s).max_in_flight, g(&s).total),
            (1, 1, 0)
        );
        s.set_tracked(vec![Matcher::new("POST", "/containers/*/start")]);
        drop(b);
        assert_eq!(g(&s).in_flight, 0);
    }
}
