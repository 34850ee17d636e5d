//! The report: every row and ratio of a run, as the table `corral bench`
//! prints and as its `--json` object (scripts rely on those keys).

use corral::metrics::MetricsSnapshot;
use std::borrow::Cow;

use serde_json::{json, Value};

use crate::fork::ForkRun;
use crate::stats::{ms, times, Latency};
use crate::workload::Workload;
use crate::{Bench, BenchOptions};

/// The throughput target is set for this workload: rollouts, commands, parallel.
const TARGET_SHAPE: (usize, usize, usize) = (16, 10, 8);

/// Everything one run measured: the default rows, the network rows, or
/// both (`--rows`); [`table`](Report::table) and [`json`](Report::json)
/// show it.
pub struct Report {
    /// The default rows (starts, round trips, resets, workloads, forks).
    pub(crate) core: Option<CoreReport>,
    /// The network rows (egress gateway, port links).
    pub(crate) net: Option<crate::net::NetReport>,
    /// The pool-fork rows (`--rows forks`).
    pub(crate) forks: Option<Vec<crate::fork::PoolForkRun>>,
    /// gVisor against runc (`--rows isolation`).
    pub(crate) isolation: Option<crate::isolation::IsolationReport>,
    /// Live snapshots, pause to disk, live forks (`--rows live`).
    pub(crate) live: Option<crate::live::LiveReport>,
}

/// The default rows of a run.
pub(crate) struct CoreReport {
    pub(crate) raw_start: Latency,
    pub(crate) cold_start: Latency,
    pub(crate) warm_acquire: Latency,
    pub(crate) pool_hits: u64,
    pub(crate) pool_misses: u64,
    pub(crate) raw_exec: Latency,
    pub(crate) agent: Latency,
    pub(crate) shell: Latency,
    /// `Sandbox::reset` of a pristine sandbox after a mess, every one in place.
    pub(crate) reset: Latency,
    /// Processes those resets killed, in all.
    pub(crate) reset_killed: u64,
    pub(crate) corral: Workload,
    pub(crate) plain: Workload,
    /// The workload end to end, each rollout taking its sandbox from a warm
    /// pool sized to the batch (filled before the clock).
    pub(crate) corral_pooled: Workload,
    /// The same with a pool that reuses sandboxes: each rollout's sandbox is
    /// reset and handed back instead of destroyed and replaced.
    pub(crate) corral_reused: Workload,
    /// The same with a pristine pool (P plus slack): each release is reset
    /// in place in the background and handed to a later rollout; the clock
    /// includes waiting for a reset sandbox and the last resets.
    pub(crate) corral_pristine: Workload,
    /// The commands of the workload alone, on sandboxes started beforehand.
    pub(crate) corral_commands: Workload,
    /// The same on plain containers started beforehand, one raw exec each.
    pub(crate) plain_commands: Workload,
    /// P sandboxes forked from a prepared one against P prepared from
    /// scratch.
    pub(crate) fork: ForkRun,
}

/// What the report says of the run besides its measurements.
struct Header<'a> {
    image: &'a str,
    run_id: &'a str,
    cpus: usize,
    options: &'a BenchOptions,
}

impl<'a> Header<'a> {
    fn of(bench: &'a Bench) -> Self {
        Header {
            image: &bench.options.image,
            run_id: &bench.run_id,
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            options: &bench.options,
        }
    }
}

/// One line of the table.
pub(crate) struct Row<'a> {
    id: Cow<'static, str>,
    num: &'static str,
    label: Cow<'static, str>,
    floor: bool,
    pub(crate) latency: Latency,
    workload: Option<&'a Workload>,
    pub(crate) note: Option<String>,
    /// Keys the row's JSON object has besides the common ones.
    extra: serde_json::Map<String, Value>,
}

impl<'a> Row<'a> {
    pub(crate) fn new(
        id: impl Into<Cow<'static, str>>,
        num: &'static str,
        label: impl Into<Cow<'static, str>>,
        latency: Latency,
    ) -> Self {
        Row {
            id: id.into(),
            num,
            label: label.into(),
            floor: false,
            latency,
            workload: None,
            note: None,
            extra: serde_json::Map::new(),
        }
    }

    /// The row with `key: value` in its JSON object.
    pub(crate) fn with(mut self, key: &str, value: Value) -> Self {
        self.extra.insert(key.to_string(), value);
        self
    }

    pub(crate) fn floor(mut self) -> Self {
        self.floor = true;
        self
    }

    fn workload(mut self, w: &'a Workload) -> Self {
        self.workload = Some(w);
        self
    }

    pub(crate) fn noted(mut self, note: Option<String>) -> Self {
        self.note = note;
        self
    }
}

/// A ratio against its target (higher is better).
pub(crate) struct Ratio {
    pub(crate) id: &'static str,
    pub(crate) label: &'static str,
    pub(crate) value: f64,
    pub(crate) target: f64,
    /// False when the target was set for another workload shape than the
    /// one run.
    pub(crate) applies: bool,
}

impl Ratio {
    fn met(&self) -> bool {
        self.value >= self.target
    }
}

impl CoreReport {
    fn rows(&self) -> Vec<Row<'_>> {
        let mut warm = Row::new(
            "warm_acquire",
            "3",
            "warm acquire (provider pool)",
            self.warm_acquire,
        );
        warm.note = Some(format!(
            "{}/{} from the pool",
            self.pool_hits,
            self.pool_hits + self.pool_misses
        ));
        let warm = warm
            .with("pool_hits", json!(self.pool_hits))
            .with("pool_misses", json!(self.pool_misses));
        let mut reset = Row::new(
            "reset",
            "",
            "reset in place (pristine, after a mess)",
            self.reset,
        );
        reset.note = Some(format!(
            "all in place, {} processes killed",
            self.reset_killed
        ));
        let reset = reset.with("killed", json!(self.reset_killed));
        vec![
            Row::new("raw_create_start", "1", "raw create+start", self.raw_start).floor(),
            Row::new(
                "cold_start",
                "2",
                "cold start (hardened sandbox, agent)",
                self.cold_start,
            ),
            warm,
            Row::new("raw_exec", "4", "raw docker exec `true`", self.raw_exec).floor(),
            Row::new(
                "agent_round_trip",
                "5",
                "agent round trip `true`",
                self.agent,
            ),
            Row::new(
                "shell_round_trip",
                "6",
                "shell session round trip `/bin/true`",
                self.shell,
            ),
            reset,
            Row::new(
                "workload_corral",
                "7",
                "workload through corral, per rollout",
                self.corral.per_rollout,
            )
            .workload(&self.corral),
            Row::new(
                "workload_plain",
                "",
                "workload plain, per rollout",
                self.plain.per_rollout,
            )
            .floor()
            .workload(&self.plain),
            Row::new(
                "workload_pooled_corral",
                "",
                "workload through corral, batch-sized pool",
                self.corral_pooled.per_rollout,
            )
            .workload(&self.corral_pooled),
            Row::new(
                "workload_reused_corral",
                "",
                "workload through corral, reused pool (reset)",
                self.corral_reused.per_rollout,
            )
            .workload(&self.corral_reused),
            Row::new(
                "workload_pristine_corral",
                "",
                "workload through corral, pristine per episode",
                self.corral_pristine.per_rollout,
            )
            .workload(&self.corral_pristine)
            .noted(self.corral_pristine.reused.map(|n| {
                format!(
                    "{n}/{} on a sandbox used and reset before",
                    self.corral_pristine.per_rollout.n
                )
            })),
            Row::new(
                "workload_commands_corral",
                "8",
                "workload commands only, through corral",
                self.corral_commands.per_rollout,
            )
            .workload(&self.corral_commands),
            Row::new(
                "workload_commands_plain",
                "",
                "workload commands only, raw exec",
                self.plain_commands.per_rollout,
            )
            .floor()
            .workload(&self.plain_commands),
            Row::new(
                "fork_prepared",
                "9",
                "fork a prepared sandbox (snapshot + fork)",
                Latency::of(vec![self.fork.fork_wall()]),
            )
            .noted(Some(format!(
                "into {}: snapshot {:.0} ms, fork {:.0} ms (source prepared in {:.0} ms)",
                self.fork.k,
                ms(self.fork.snapshot),
                ms(self.fork.fork),
                ms(self.fork.prepare_source)
            )))
            .with("forks", json!(self.fork.k))
            .with("snapshot_ms", json!(ms(self.fork.snapshot)))
            .with("fork_ms", json!(ms(self.fork.fork)))
            .with("prepare_source_ms", json!(ms(self.fork.prepare_source))),
            Row::new(
                "fork_commit",
                "",
                "the same by docker commit + creates",
                Latency::of(vec![self.fork.commit.wall()]),
            )
            .noted(Some(format!(
                "snapshot {:.0} ms, fork {:.0} ms",
                ms(self.fork.commit.snapshot),
                ms(self.fork.commit.fork)
            )))
            .with("snapshot_ms", json!(ms(self.fork.commit.snapshot)))
            .with("fork_ms", json!(ms(self.fork.commit.fork))),
            Row::new(
                "prepare_from_scratch",
                "",
                "prepare each from scratch",
                Latency::of(vec![self.fork.scratch]),
            )
            .floor()
            .noted(Some(format!("{} at once", self.fork.k))),
        ]
    }

    fn ratios(&self, args: &BenchOptions) -> Vec<Ratio> {
        vec![
            Ratio {
                id: "warm_acquire_vs_raw_start",
                label: "warm acquire p50 vs raw create+start p50",
                value: times(self.raw_start.p50, self.warm_acquire.p50),
                target: 20.0,
                applies: true,
            },
            Ratio {
                id: "agent_vs_raw_exec",
                label: "agent round trip p50 vs raw exec p50",
                value: times(self.raw_exec.p50, self.agent.p50),
                target: 20.0,
                applies: true,
            },
            Ratio {
                id: "reset_vs_cold_start",
                label: "reset p50 vs cold start p50",
                value: times(self.cold_start.p50, self.reset.p50),
                target: 20.0,
                applies: true,
            },
            Ratio {
                id: "workload_vs_plain",
                label: "workload commands/s vs plain (starts incl.)",
                value: self.corral.per_second() / self.plain.per_second().max(1e-9),
                target: 10.0,
                applies: (args.sandboxes, args.commands, args.parallel) == TARGET_SHAPE,
            },
            Ratio {
                id: "workload_pooled_vs_plain",
                label: "workload (batch pool) commands/s vs plain",
                value: self.corral_pooled.per_second() / self.plain.per_second().max(1e-9),
                target: 10.0,
                applies: (args.sandboxes, args.commands, args.parallel) == TARGET_SHAPE,
            },
            Ratio {
                id: "workload_reused_vs_plain",
                label: "workload (reused pool) commands/s vs plain",
                value: self.corral_reused.per_second() / self.plain.per_second().max(1e-9),
                target: 10.0,
                applies: (args.sandboxes, args.commands, args.parallel) == TARGET_SHAPE,
            },
            Ratio {
                id: "workload_pristine_vs_plain",
                label: "workload (pristine pool) commands/s vs plain",
                value: self.corral_pristine.per_second() / self.plain.per_second().max(1e-9),
                target: 10.0,
                applies: (args.sandboxes, args.commands, args.parallel) == TARGET_SHAPE,
            },
            Ratio {
                id: "fork_vs_prepare",
                label: "fork into P vs preparing P from scratch",
                value: times(self.fork.scratch, self.fork.fork_wall()),
                target: 1.0,
                applies: true,
            },
            Ratio {
                id: "fork_stream_vs_commit",
                label: "fork through the agents vs docker commit",
                value: times(self.fork.commit.wall(), self.fork.fork_wall()),
                target: 1.0,
                applies: true,
            },
            Ratio {
                id: "workload_commands_vs_plain_exec",
                label: "workload commands/s vs exec-per-command",
                value: self.corral_commands.per_second()
                    / self.plain_commands.per_second().max(1e-9),
                target: 10.0,
                applies: (args.sandboxes, args.commands, args.parallel) == TARGET_SHAPE,
            },
        ]
    }
}

/// A ratio's value or target as the table shows it: one decimal, two
/// below 1 (a target of a third is 0.33, not 0).
fn shown(x: f64, whole: bool) -> String {
    if whole && x.fract() == 0.0 {
        format!("{x:.0}")
    } else if x < 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.1}")
    }
}

impl Report {
    /// The rows of the parts that ran, default rows first.
    fn rows(&self) -> Vec<Row<'_>> {
        let mut rows = self.core.as_ref().map(|c| c.rows()).unwrap_or_default();
        if let Some(net) = &self.net {
            rows.extend(net.rows());
        }
        if let Some(forks) = &self.forks {
            rows.extend(forks.iter().flat_map(crate::fork::PoolForkRun::rows));
        }
        if let Some(isolation) = &self.isolation {
            rows.extend(isolation.rows());
        }
        if let Some(live) = &self.live {
            rows.extend(live.rows());
        }
        rows
    }

    fn ratios(&self, args: &BenchOptions) -> Vec<Ratio> {
        let mut ratios = self
            .core
            .as_ref()
            .map(|c| c.ratios(args))
            .unwrap_or_default();
        if let Some(net) = &self.net {
            ratios.extend(net.ratios());
        }
        if let Some(forks) = &self.forks {
            ratios.extend(crate::fork::pool_fork_ratios(forks));
        }
        if let Some(isolation) = &self.isolation {
            ratios.extend(isolation.ratios());
        }
        if let Some(live) = &self.live {
            ratios.extend(live.ratios());
        }
        ratios
    }

    /// The table `corral bench` prints: a header, a line per row, the
    /// ratios against their targets.
    pub fn table(&self, bench: &Bench) -> String {
        self.table_of(&Header::of(bench))
    }

    /// The object `corral bench --json` prints, with the runtime's
    /// counters as they are now.
    pub fn json(&self, bench: &Bench) -> Value {
        self.json_of(&Header::of(bench), &bench.runtime.metrics())
    }

    fn table_of(&self, header: &Header<'_>) -> String {
        use std::fmt::Write;
        let args = header.options;
        let mut out = String::new();
        // The default rows' sandboxes have no network; the network rows
        // say what theirs are on their own rows.
        let network = if self.core.is_some() {
            "network none, "
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "corral bench: image {}, {network}{} CPUs, run {}",
            header.image, header.cpus, header.run_id
        );
        if self.core.is_some() {
            let _ = writeln!(
                out,
                "workload: {} rollouts x {} commands, {} in parallel; times in ms",
                args.sandboxes, args.commands, args.parallel
            );
        }
        if let Some(net) = &self.net {
            let _ = writeln!(out, "{}; times in ms", net.describe());
        }
        if let Some(isolation) = &self.isolation {
            let _ = writeln!(out, "{}; times in ms", isolation.describe());
        }
        if let Some(live) = &self.live {
            let _ = writeln!(out, "{}; times in ms", live.describe());
        }
        out.push('\n');
        let _ = writeln!(
            out,
            "   {:<46} {:>5} {:>9} {:>9} {:>9}  throughput",
            "", "n", "p50", "p90", "p99"
        );
        for row in self.rows() {
            let label = if row.floor {
                format!("{:<38} [floor]", row.label)
            } else {
                row.label.to_string()
            };
            let l = row.latency;
            let _ = write!(
                out,
                "{:>2} {label:<46} {:>5} {:>9.3} {:>9.3} {:>9.3}",
                row.num,
                l.n,
                ms(l.p50),
                ms(l.p90),
                ms(l.p99)
            );
            if let Some(w) = row.workload {
                let _ = write!(
                    out,
                    "  {:.1} cmd/s ({} in {:.2} s)",
                    w.per_second(),
                    w.commands,
                    w.wall.as_secs_f64()
                );
            }
            if let Some(note) = &row.note {
                let _ = write!(out, "  {note}");
            }
            out.push('\n');
        }
        let _ = writeln!(out, "\nratios (higher is better)");
        for r in self.ratios(args) {
            let verdict = match (r.met(), r.applies) {
                (true, true) => "met",
                (false, true) => "missed",
                (true, false) => "met (target set for 16x10, 8 parallel)",
                (false, false) => "missed (target set for 16x10, 8 parallel)",
            };
            let _ = writeln!(
                out,
                "   {:<46} {:>9}x  target >= {}x  {verdict}",
                r.label,
                shown(r.value, false),
                shown(r.target, true)
            );
        }
        out
    }

    fn json_of(&self, header: &Header<'_>, m: &MetricsSnapshot) -> Value {
        let args = header.options;
        let rows: serde_json::Map<String, Value> = self
            .rows()
            .into_iter()
            .map(|row| {
                let l = row.latency;
                let mut v = json!({
                    "label": row.label,
                    "floor": row.floor,
                    "n": l.n,
                    "p50_ms": ms(l.p50),
                    "p90_ms": ms(l.p90),
                    "p99_ms": ms(l.p99),
                });
                if let Some(w) = row.workload {
                    v["commands"] = json!(w.commands);
                    v["wall_ms"] = json!(ms(w.wall));
                    v["commands_per_s"] = json!(w.per_second());
                    if let Some(reused) = w.reused {
                        v["reused_sandboxes"] = json!(reused);
                    }
                }
                for (key, value) in row.extra {
                    v[key] = value;
                }
                (row.id.to_string(), v)
            })
            .collect();
        let ratios: serde_json::Map<String, Value> = self
            .ratios(args)
            .into_iter()
            .map(|r| {
                let v = json!({
                    "label": r.label,
                    "value": r.value,
                    "target": r.target,
                    "met": r.met(),
                    "target_applies": r.applies,
                });
                (r.id.to_string(), v)
            })
            .collect();
        json!({
            "run_id": header.run_id,
            "image": header.image,
            "network": "none",
            "cpus": header.cpus,
            "workload": {
                "sandboxes": args.sandboxes,
                "commands": args.commands,
                "parallel": args.parallel,
            },
            "rows": rows,
            "ratios": ratios,
            "metrics": {
                "sandboxes_started": m.sandboxes_started,
                "start_failures": m.start_failures,
                "retries": m.retries,
                "slot_waits": m.slot_waits,
                "breaker_opened": m.breaker_opened,
                "resets_in_place": m.resets_in_place,
                "resets_replaced": m.resets_replaced,
                "start_phase_mean_ms": m.start_phase_means_ms(),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::time::Duration;

    use super::*;

    fn lat(ms: u64) -> Latency {
        Latency::of(vec![Duration::from_millis(ms)])
    }

    fn wl(per_rollout_ms: u64, commands: usize, wall_ms: u64) -> Workload {
        Workload {
            per_rollout: lat(per_rollout_ms),
            commands,
            wall: Duration::from_millis(wall_ms),
            reused: None,
        }
    }

    /// Floors 20x slower than corral's latency rows (a reset 20x faster
    /// than a cold start); corral's workloads 10x (end to end) and 5x
    /// (commands only) the plain commands/s.
    fn report() -> CoreReport {
        CoreReport {
            raw_start: lat(200),
            cold_start: lat(300),
            warm_acquire: lat(10),
            pool_hits: 5,
            pool_misses: 1,
            raw_exec: lat(40),
            agent: lat(2),
            shell: lat(3),
            reset: lat(15),
            reset_killed: 7,
            corral: wl(100, 160, 1_000),
            plain: wl(1_000, 160, 10_000),
            corral_pooled: wl(50, 160, 500),
            corral_reused: wl(25, 160, 250),
            corral_pristine: Workload {
                per_rollout: Latency::of(vec![Duration::from_millis(20); 16]),
                reused: Some(16),
                ..wl(20, 160, 200)
            },
            corral_commands: wl(20, 160, 200),
            plain_commands: wl(100, 160, 1_000),
            fork: ForkRun {
                k: 8,
                prepare_source: Duration::from_millis(400),
                snapshot: Duration::from_millis(300),
                fork: Duration::from_millis(700),
                commit: crate::fork::ForkWay {
                    snapshot: Duration::from_millis(1_500),
                    fork: Duration::from_millis(500),
                },
                scratch: Duration::from_millis(3_000),
            },
        }
    }

    /// The network rows: the gateway at half the direct speed for HTTP,
    /// 0.83 for HTTPS, a quarter of the throughput (missing its target),
    /// a port link at a quarter.
    fn net() -> crate::net::NetReport {
        crate::net::NetReport {
            http_direct: lat(1),
            http_egress: lat(2),
            https_direct: lat(20),
            https_egress: lat(24),
            big_direct: lat(100),
            big_egress: lat(400),
            port_direct: lat(1),
            port_link: lat(4),
        }
    }

    #[test]
    fn net_rows_have_floors_rates_and_ratios_with_targets() {
        let opts = options((4, 3, 2));
        let only = Report {
            core: None,
            net: Some(net()),
            forks: None,
            isolation: None,
            live: None,
        };
        let table = only.table_of(&header(&opts));
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "corral bench: image corral-test/busybox, 2 CPUs, run bench-0123456789"
        );
        // Header, the network line, blank, column titles, 8 rows, blank,
        // title, 4 ratios; no workload line.
        assert_eq!(lines.len(), 3 + 1 + 8 + 2 + 4, "{table}");
        assert_eq!(
            lines[1],
            "network: 1 connections per kind, 1 transfers of 32 MiB, 1 port round trips; times in ms"
        );
        assert!(
            lines[4].starts_with("   HTTP connect+GET, direct") && lines[4].contains("[floor]"),
            "{table}"
        );
        assert!(
            lines[5].starts_with("10 HTTP connect+GET through the egress gateway"),
            "{table}"
        );
        assert!(lines[8].ends_with("  336 MB/s at p50"), "{table}");
        assert!(lines[9].ends_with("  84 MB/s at p50"), "{table}");
        assert!(
            lines[11].starts_with("13 HTTP round trip through a corral serve link"),
            "{table}"
        );
        assert_eq!(lines[13], "ratios (higher is better)");
        assert!(
            lines[14].ends_with("0.50x  target >= 0.33x  met"),
            "{table}"
        );
        assert!(
            lines[15].ends_with("0.83x  target >= 0.80x  met"),
            "{table}"
        );
        assert!(
            lines[16].starts_with("   egress 32 MiB throughput vs direct")
                && lines[16].ends_with("0.25x  target >= 0.50x  missed"),
            "{table}"
        );
        assert!(
            lines[17].ends_with("0.25x  target >= 0.25x  met"),
            "{table}"
        );

        let v = only.json_of(&header(&opts), &MetricsSnapshot::default());
        assert_eq!(
            keys(&v["rows"]),
            BTreeSet::from([
                "net_http_direct",
                "net_http_egress",
                "net_https_direct",
                "net_https_egress",
                "net_32mib_direct",
                "net_32mib_egress",
                "port_direct",
                "port_link",
            ])
        );
        assert_eq!(
            keys(&v["ratios"]),
            BTreeSet::from([
                "egress_http_vs_direct",
                "egress_https_vs_direct",
                "egress_32mib_vs_direct",
                "port_link_vs_direct",
            ])
        );
        assert_eq!(v["rows"]["net_http_direct"]["floor"], true);
        assert_eq!(v["rows"]["net_http_egress"]["p50_ms"], 2.0);
        let rate = v["rows"]["net_32mib_egress"]["mb_per_s"]
            .as_f64()
            .expect("a rate");
        assert!((rate - 83.886_08).abs() < 1e-6, "{rate}");
        assert_eq!(
            v["ratios"]["egress_32mib_vs_direct"],
            json!({"label": "egress 32 MiB throughput vs direct", "value": 0.25,
                   "target": 0.5, "met": false, "target_applies": true})
        );

        // Both: every default row and ratio kept, the network ones after.
        let all = Report {
            core: Some(report()),
            net: Some(net()),
            forks: None,
            isolation: None,
            live: None,
        };
        let v = all.json_of(&header(&opts), &MetricsSnapshot::default());
        assert_eq!(keys(&v["rows"]).len(), 17 + 8);
        assert_eq!(keys(&v["ratios"]).len(), 10 + 4);
        assert!(keys(&v["rows"]).contains("fork_commit"));
        assert!(keys(&v["ratios"]).contains("fork_stream_vs_commit"));
        let table = all.table_of(&header(&opts));
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 5 + 17 + 8 + 2 + 10 + 4, "{table}");
        assert!(lines[3].is_empty(), "{table}");
        assert!(lines[1].starts_with("workload: 4 rollouts"), "{table}");
        assert!(lines[2].starts_with("network: 1 connections"), "{table}");
    }

    fn options(shape: (usize, usize, usize)) -> BenchOptions {
        BenchOptions {
            image: "corral-test/busybox".into(),
            sandboxes: shape.0,
            commands: shape.1,
            parallel: shape.2,
            samples: None,
            progress: false,
            rows: crate::Rows::Default,
            forks: crate::ForkRows::defaults(),
        }
    }

    fn header(options: &BenchOptions) -> Header<'_> {
        Header {
            image: &options.image,
            run_id: "bench-0123456789",
            cpus: 2,
            options,
        }
    }

    fn keys(v: &Value) -> BTreeSet<&str> {
        v.as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default()
    }

    #[test]
    fn ratios_are_floor_over_corral_and_apply_only_to_the_target_shape() {
        let r = report();
        let at_target = r.ratios(&options(TARGET_SHAPE));
        let values: Vec<(&str, f64, f64, bool)> = at_target
            .iter()
            .map(|x| (x.id, x.value, x.target, x.met()))
            .collect();
        assert_eq!(
            values,
            vec![
                ("warm_acquire_vs_raw_start", 20.0, 20.0, true),
                ("agent_vs_raw_exec", 20.0, 20.0, true),
                ("reset_vs_cold_start", 20.0, 20.0, true),
                ("workload_vs_plain", 10.0, 10.0, true),
                ("workload_pooled_vs_plain", 20.0, 10.0, true),
                ("workload_reused_vs_plain", 40.0, 10.0, true),
                ("workload_pristine_vs_plain", 50.0, 10.0, true),
                ("fork_vs_prepare", 3.0, 1.0, true),
                ("fork_stream_vs_commit", 2.0, 1.0, true),
                ("workload_commands_vs_plain_exec", 5.0, 10.0, false),
            ]
        );
        assert!(at_target.iter().all(|x| x.applies));
        let other = r.ratios(&options((4, 3, 2)));
        let applies: Vec<bool> = other.iter().map(|x| x.applies).collect();
        assert_eq!(
            applies,
            [true, true, true, false, false, false, false, true, true, false]
        );
    }

    #[test]
    fn json_has_every_row_ratio_and_counter() {
        let opts = options((4, 3, 2));
        let v = Report {
            core: Some(report()),
            net: None,
            forks: None,
            isolation: None,
            live: None,
        }
        .json_of(&header(&opts), &MetricsSnapshot::default());
        assert_eq!(
            keys(&v),
            BTreeSet::from([
                "run_id", "image", "network", "cpus", "workload", "rows", "ratios", "metrics"
            ])
        );
        assert_eq!(v["run_id"], "bench-0123456789");
        assert_eq!(v["image"], "corral-test/busybox");
        assert_eq!(v["network"], "none");
        assert_eq!(v["cpus"], 2);
        assert_eq!(
            v["workload"],
            json!({"sandboxes": 4, "commands": 3, "parallel": 2})
        );
        assert_eq!(
            keys(&v["rows"]),
            BTreeSet::from([
                "raw_create_start",
                "cold_start",
                "warm_acquire",
                "raw_exec",
                "agent_round_trip",
                "shell_round_trip",
                "reset",
                "workload_corral",
                "workload_plain",
                "workload_pooled_corral",
                "workload_reused_corral",
                "workload_pristine_corral",
                "workload_commands_corral",
                "workload_commands_plain",
                "fork_prepared",
                "fork_commit",
                "prepare_from_scratch",
            ])
        );
        assert_eq!(v["rows"]["fork_commit"]["snapshot_ms"], 1500.0);
        assert_eq!(v["rows"]["fork_prepared"]["p50_ms"], 1000.0);
        assert_eq!(v["rows"]["fork_prepared"]["forks"], 8);
        assert_eq!(v["rows"]["prepare_from_scratch"]["floor"], true);
        assert_eq!(
            v["rows"]["raw_exec"],
            json!({"label": "raw docker exec `true`", "floor": true, "n": 1,
                   "p50_ms": 40.0, "p90_ms": 40.0, "p99_ms": 40.0})
        );
        assert_eq!(v["rows"]["warm_acquire"]["pool_hits"], 5);
        assert_eq!(v["rows"]["warm_acquire"]["pool_misses"], 1);
        assert_eq!(
            v["rows"]["reset"],
            json!({"label": "reset in place (pristine, after a mess)", "floor": false,
                   "n": 1, "p50_ms": 15.0, "p90_ms": 15.0, "p99_ms": 15.0, "killed": 7})
        );
        assert_eq!(
            v["ratios"]["reset_vs_cold_start"],
            json!({"label": "reset p50 vs cold start p50", "value": 20.0,
                   "target": 20.0, "met": true, "target_applies": true})
        );
        assert_eq!(
            v["rows"]["workload_pristine_corral"]["commands_per_s"],
            800.0
        );
        assert_eq!(
            v["rows"]["workload_pristine_corral"]["reused_sandboxes"],
            16
        );
        assert_eq!(
            v["rows"]["workload_plain"],
            json!({"label": "workload plain, per rollout", "floor": true, "n": 1,
                   "p50_ms": 1000.0, "p90_ms": 1000.0, "p99_ms": 1000.0,
                   "commands": 160, "wall_ms": 10000.0, "commands_per_s": 16.0})
        );
        assert_eq!(
            v["ratios"]["workload_commands_vs_plain_exec"],
            json!({"label": "workload commands/s vs exec-per-command", "value": 5.0,
                   "target": 10.0, "met": false, "target_applies": false})
        );
        assert_eq!(
            keys(&v["metrics"]),
            BTreeSet::from([
                "sandboxes_started",
                "start_failures",
                "retries",
                "slot_waits",
                "breaker_opened",
                "resets_in_place",
                "resets_replaced",
                "start_phase_mean_ms",
            ])
        );
        assert_eq!(
            keys(&v["metrics"]["start_phase_mean_ms"]),
            BTreeSet::from([
                "breaker_wait",
                "slot_wait",
                "image",
                "agent_volume",
                "create",
                "start",
                "attach",
                "startup",
                "first_command",
            ])
        );
    }

    #[test]
    fn table_has_a_line_per_row_and_ratio_with_the_verdicts() {
        let opts = options((4, 3, 2));
        let table = Report {
            core: Some(report()),
            net: None,
            forks: None,
            isolation: None,
            live: None,
        }
        .table_of(&header(&opts));
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "corral bench: image corral-test/busybox, network none, 2 CPUs, run bench-0123456789"
        );
        assert_eq!(
            lines[1],
            "workload: 4 rollouts x 3 commands, 2 in parallel; times in ms"
        );
        // Header, workload, blank, column titles, 17 rows, blank, title, 10 ratios.
        assert_eq!(lines.len(), 4 + 17 + 2 + 10, "{table}");
        assert!(lines[4].starts_with(" 1 raw create+start"), "{table}");
        assert!(lines[4].contains("[floor]"), "{table}");
        assert!(lines[6].ends_with("  5/6 from the pool"), "{table}");
        assert!(lines[10].starts_with("   reset in place"), "{table}");
        assert!(
            lines[10].ends_with("  all in place, 7 processes killed"),
            "{table}"
        );
        assert!(
            lines[12].ends_with("  16.0 cmd/s (160 in 10.00 s)"),
            "{table}"
        );
        assert!(
            lines[15].contains("pristine per episode")
                && lines[15].ends_with(
                    "  800.0 cmd/s (160 in 0.20 s)  16/16 on a sandbox used and reset before"
                ),
            "{table}"
        );
        assert!(
            lines[18].starts_with(" 9 fork a prepared sandbox")
                && lines[18].ends_with(
                    "  into 8: snapshot 300 ms, fork 700 ms (source prepared in 400 ms)"
                ),
            "{table}"
        );
        assert!(
            lines[19].contains("docker commit")
                && lines[19].ends_with("  snapshot 1500 ms, fork 500 ms"),
            "{table}"
        );
        assert!(lines[20].ends_with("  8 at once"), "{table}");
        assert_eq!(lines[22], "ratios (higher is better)");
        assert!(lines[23].ends_with("20.0x  target >= 20x  met"), "{table}");
        assert!(
            lines[25].starts_with("   reset p50 vs cold start p50")
                && lines[25].ends_with("20.0x  target >= 20x  met"),
            "{table}"
        );
        assert!(
            lines[29].ends_with("50.0x  target >= 10x  met (target set for 16x10, 8 parallel)"),
            "{table}"
        );
        assert!(
            lines[30].starts_with("   fork into P vs preparing P from scratch")
                && lines[30].ends_with("3.0x  target >= 1x  met"),
            "{table}"
        );
        assert!(
            lines[31].starts_with("   fork through the agents vs docker commit")
                && lines[31].ends_with("2.0x  target >= 1x  met"),
            "{table}"
        );
        assert!(
            lines[32].ends_with("5.0x  target >= 10x  missed (target set for 16x10, 8 parallel)"),
            "{table}"
        );
        let at_target = options(TARGET_SHAPE);
        let table = Report {
            core: Some(report()),
            net: None,
            forks: None,
            isolation: None,
            live: None,
        }
        .table_of(&header(&at_target));
        assert!(
            table.trim_end().ends_with("target >= 10x  missed"),
            "{table}"
        );
    }
}
