//! Prometheus metrics of the service (`GET /metrics`): what the service saw
//! (command latency, failures by kind) plus, read at scrape time, the
//! provider's sandboxes and pools and the runtime's counters (starts,
//! retries, slot waits, recreations, resets), and what the service's
//! ceilings hold (`server.limits`), and the sandboxes' usage with bounded
//! labels (`usage.rs`).

pub mod usage;

use std::fmt;

use corral::metrics::StartPhase;
use corral::{Provider, Runtime};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// Labels of command metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CommandLabels {
    /// `exec`, `stream` or `shell`.
    pub via: &'static str,
}

/// Labels of failure counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    /// The failure kind, e.g. `timeout`.
    pub kind: &'static str,
}

/// The service's metrics.
pub struct Metrics {
    registry: Registry,
    /// Command wall time, in seconds.
    pub command_seconds: Family<CommandLabels, Histogram>,
    /// Commands that did not run to their own exit, by kind.
    pub failures: Family<FailureLabels, Counter>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Metrics")
    }
}

fn latency_histogram() -> Histogram {
    // 0.5 ms .. ~65 s: agent round trips sit near 1 ms, starts near 300 ms.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.0005, 2.0, 18,
    ))
}

impl Metrics {
    /// Metrics over `provider` and `runtime`.
    pub fn new(provider: Provider, runtime: Runtime) -> Metrics {
        let mut registry = Registry::with_prefix("corral");
        let command_seconds = Family::<CommandLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> _,
        );
        registry.register(
            "command_duration_seconds",
            "Wall time of commands run through the service",
            command_seconds.clone(),
        );
        let failures = Family::<FailureLabels, Counter>::default();
        registry.register(
            "command_failures",
            "Commands that did not run to their own exit, by failure kind",
            failures.clone(),
        );
        registry.register_collector(Box::new(Snapshot { provider, runtime }));
        Metrics {
            registry,
            command_seconds,
            failures,
        }
    }

    /// Also reports what `ceilings` hold at each scrape: bytes reserved
    /// against the budget, requests in flight, and `overloaded` refusals.
    pub fn watch_ceilings(&mut self, ceilings: crate::ceilings::Ceilings) {
        self.registry
            .register_collector(Box::new(CeilingsUsage(ceilings)));
    }

    /// Records one command's outcome.
    pub fn command(&self, via: &'static str, result: &corral_core::CommandResult) {
        self.command_seconds
            .get_or_create(&CommandLabels { via })
            .observe(result.duration.as_secs_f64());
        if let Some(f) = &result.failure {
            self.failures
                .get_or_create(&FailureLabels {
                    kind: f.kind.as_str(),
                })
                .inc();
        }
    }

    /// The text exposition format, with the usage metrics of `usage` (what
    /// the scrape's caller may see of the last usage sample) after the
    /// rest.
    pub fn render(&self, usage: Option<usage::UsageView>) -> String {
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        let mut out = String::new();
        let mut result = encode_registry(&mut out, &self.registry);
        if let Some(view) = usage {
            let mut extra = Registry::with_prefix("corral");
            extra.register_collector(Box::new(view));
            result = result.and_then(|()| encode_registry(&mut out, &extra));
        }
        if let Err(e) = result.and_then(|()| encode_eof(&mut out)) {
            tracing::warn!(error = %e, "encoding metrics failed");
        }
        out
    }
}

/// What the ceilings hold, read at each scrape.
struct CeilingsUsage(crate::ceilings::Ceilings);

impl fmt::Debug for CeilingsUsage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CeilingsUsage")
    }
}

impl Collector for CeilingsUsage {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let u = self.0.usage();
        gauge(
            &mut e,
            "server_buffer_reserved_bytes",
            "Bytes requests in flight have reserved from server.limits.buffer_bytes",
            u.reserved_bytes as f64,
        )?;
        gauge(
            &mut e,
            "server_buffer_budget_bytes",
            "The budget of bytes all requests in flight may hold (server.limits.buffer_bytes)",
            u.budget_bytes as f64,
        )?;
        gauge(
            &mut e,
            "server_in_flight",
            "Commands, file operations and MCP tool calls in flight (at most server.limits.max_concurrent)",
            u.in_flight as f64,
        )?;
        let mut m = e.encode_descriptor(
            "server_overloaded",
            "Requests refused as overloaded, by the limit that was reached",
            None,
            MetricType::Counter,
        )?;
        for (limit, n) in [
            ("buffer_bytes", u.refused_budget),
            ("max_concurrent", u.refused_slots),
            ("share_percent", u.refused_share),
        ] {
            ConstCounter::new(n).encode(m.encode_family(&[("limit", limit)])?)?;
        }
        Ok(())
    }
}

/// Values read from the provider and the runtime at each scrape.
struct Snapshot {
    provider: Provider,
    runtime: Runtime,
}

impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Snapshot")
    }
}

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> fmt::Result {
    let m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    ConstCounter::new(v).encode(m)
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: f64) -> fmt::Result {
    let m = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    ConstGauge::new(v).encode(m)
}

impl Collector for Snapshot {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let p = self.provider.stats();
        let b = self.runtime.metrics();
        {
            let mut m = e.encode_descriptor(
                "sandboxes",
                "Sandboxes of the provider by state (session: bound to a key, pooled: warm and idle)",
                None,
                MetricType::Gauge,
            )?;
            let pooled: usize = p.pooled.values().sum();
            for (state, n) in [("session", p.sessions), ("pooled", pooled)] {
                ConstGauge::new(n as i64).encode(m.encode_family(&[("state", state)])?)?;
            }
        }
        gauge(
            &mut e,
            "sandboxes_live",
            "Sandboxes alive or being created",
            p.live as f64,
        )?;
        {
            let mut m = e.encode_descriptor(
                "pool_ready",
                "Warm sandboxes ready per pool",
                None,
                MetricType::Gauge,
            )?;
            for (pool, n) in &p.pooled {
                ConstGauge::new(*n as i64).encode(m.encode_family(&[("pool", pool.as_str())])?)?;
            }
        }
        counter(
            &mut e,
            "pool_hits",
            "Acquires served from a warm pool",
            p.pool_hits,
        )?;
        counter(
            &mut e,
            "pool_misses",
            "Acquires that had to start a sandbox",
            p.pool_misses,
        )?;
        let asked = p.pool_hits + p.pool_misses;
        gauge(
            &mut e,
            "pool_hit_ratio",
            "Fraction of acquires served from a warm pool",
            if asked == 0 {
                0.0
            } else {
                p.pool_hits as f64 / asked as f64
            },
        )?;
        {
            let mut m = e.encode_descriptor(
                "evictions",
                "Sandboxes evicted, by reason",
                None,
                MetricType::Counter,
            )?;
            for (reason, n) in [
                ("lru", p.evicted_lru),
                ("idle", p.evicted_idle),
                ("lifetime", p.evicted_lifetime),
                ("restarted", p.restarted),
                // Released, but a snapshot had changed its base: destroyed
                // rather than returned to its pool.
                ("changed_base", p.discarded_changed),
            ] {
                ConstCounter::new(n).encode(m.encode_family(&[("reason", reason)])?)?;
            }
        }
        counter(
            &mut e,
            "sandboxes_started",
            "Sandboxes started",
            b.sandboxes_started,
        )?;
        counter(
            &mut e,
            "start_failures",
            "Sandbox starts that failed",
            b.start_failures,
        )?;
        counter(
            &mut e,
            "recreated",
            "Containers recreated by the recreate recovery policy",
            b.recreated,
        )?;
        counter(
            &mut e,
            "daemon_retries",
            "Daemon calls retried after a transient error",
            b.retries,
        )?;
        counter(
            &mut e,
            "slot_waits",
            "Times a start or exec waited for a slot",
            b.slot_waits,
        )?;
        gauge(
            &mut e,
            "slot_wait_seconds_sum",
            "Total time spent waiting for start and exec slots",
            b.slot_wait_us as f64 / 1e6,
        )?;
        gauge(
            &mut e,
            "slot_wait_max_seconds",
            "Longest single slot wait",
            b.slot_wait_max_us as f64 / 1e6,
        )?;
        counter(
            &mut e,
            "breaker_opened",
            "Times the start circuit breaker opened",
            b.breaker_opened,
        )?;
        {
            let mut m = e.encode_descriptor(
                "start_phase_seconds",
                "Time successful sandbox starts spent in each phase (first_command: the first command's round trip)",
                None,
                MetricType::Counter,
            )?;
            for phase in StartPhase::ALL {
                ConstCounter::new(b.start_phase(phase).as_secs_f64())
                    .encode(m.encode_family(&[("phase", phase.as_str())])?)?;
            }
        }
        counter(
            &mut e,
            "first_commands",
            "Sandboxes whose first command has run",
            b.first_commands,
        )?;
        {
            let mut m = e.encode_descriptor(
                "resets",
                "Sandbox resets, by how they were done (in_place: by the agent; replaced: a new container)",
                None,
                MetricType::Counter,
            )?;
            for (mode, n) in [
                ("in_place", b.resets_in_place),
                ("replaced", b.resets_replaced),
            ] {
                ConstCounter::new(n).encode(m.encode_family(&[("mode", mode)])?)?;
            }
        }
        {
            let m = e.encode_descriptor(
                "reset_in_place_seconds",
                "Total time of in-place resets",
                None,
                MetricType::Counter,
            )?;
            ConstCounter::new(b.reset_us as f64 / 1e6).encode(m)?;
        }
        counter(
            &mut e,
            "orphans_reaped",
            "Orphaned containers removed",
            b.orphans_reaped,
        )?;
        Ok(())
    }
}
