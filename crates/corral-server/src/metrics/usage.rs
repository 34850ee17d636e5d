//! Sandbox usage in `/metrics`, with label sets that stay bounded however
//! many sandboxes come and go.
//!
//! A sandbox id as a label would make a new series per sandbox forever. So
//! usage is reported per owner (`operator`, `tenant:NAME`, `pool`: bounded
//! by the configured tenants) and profile (bounded by the configuration),
//! as gauge histograms (sandboxes by memory against their limit, by CPU
//! cores), and per sandbox only for the top `server.metrics.top_sandboxes`
//! by memory and by CPU, whose series are replaced at every sample, so a
//! gone sandbox's series vanish with it.
//!
//! Each sandbox's usage is read through its agent (its cgroup from inside,
//! `Sandbox::usage_from_agent`: no engine call), the engine's stats only
//! where the agent cannot answer. Reading 200 sandboxes is still 200
//! requests, so it is done at most once per
//! `server.metrics.usage_refresh_ms`, eight at a time, and only when
//! someone scrapes: a scrape of a fresh sample reads nothing, a scrape
//! of a stale one starts a new sample in the background and answers with
//! the last (only the very first scrape waits for one). A tenant's scrape
//! shows only its own sandboxes (`Principal::may_session`).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corral::{Held, Provider};
use corral_core::backend::Usage;
use corral_core::config::MetricsConfig;
use corral_core::principal::Principal;
use futures_util::StreamExt;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

/// Usage reads in flight at once while sampling.
const PARALLEL: usize = 8;
/// Longest one sandbox's usage read may take before it counts as an error.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest the first scrape waits for the first sample.
const FIRST_WAIT: Duration = Duration::from_secs(5);
/// Bucket bounds of the memory-against-limit gauge histogram.
const MEMORY_FRACTION_BOUNDS: [f64; 7] = [0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 1.0];
/// Bucket bounds of the CPU-cores gauge histogram.
const CPU_CORE_BOUNDS: [f64; 8] = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0];

/// Who owns a sandbox, as the service's books say; `None` for a key the
/// service did not hand out (it is then the operator's).
pub type OwnerOf = Arc<dyn Fn(&str) -> Option<Principal> + Send + Sync>;

/// One sandbox's usage at a sample.
#[derive(Debug, Clone)]
struct Measured {
    /// Its runtime id (`sb-...`).
    sandbox: String,
    /// The provider session key it serves; `None`: a pool's spare.
    key: Option<String>,
    /// Its owner; `None`: a pool's spare (the operator's).
    owner: Option<Principal>,
    profile: Option<String>,
    usage: Usage,
    /// CPU cores used since the previous sample, when it was in that one.
    cores: Option<f64>,
}

/// One session's usage in a sample, as [`UsageSampler::sessions`] lists it.
#[derive(Debug, Clone)]
pub struct SessionUsage {
    /// The session key, as the caller names it.
    pub session: String,
    /// The sandbox's runtime id.
    pub sandbox: String,
    /// CPU cores used between the sample before and this one.
    pub cpu_cores: Option<f64>,
    /// Its usage.
    pub usage: Usage,
}

/// Every held sandbox's usage at one moment.
#[derive(Debug)]
pub struct Sample {
    at: Instant,
    took: Duration,
    sandboxes: Vec<Measured>,
    /// Sandboxes whose usage could not be read (gone meanwhile, engine
    /// errors, too slow).
    errors: u64,
}

/// Takes samples of the provider's sandboxes' usage and keeps the last.
/// Cheap to clone.
#[derive(Clone)]
pub struct UsageSampler {
    inner: Arc<Inner>,
}

struct Inner {
    config: MetricsConfig,
    provider: Provider,
    owner_of: OwnerOf,
    last: Mutex<Option<Arc<Sample>>>,
    /// Held while a sample is being taken: one at a time.
    taking: tokio::sync::Mutex<()>,
}

impl fmt::Debug for UsageSampler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("UsageSampler")
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Sample {
    /// How long ago it was taken.
    pub fn age(&self) -> Duration {
        self.at.elapsed()
    }
}

impl UsageSampler {
    /// A sampler of `provider`'s sandboxes, owners told by `owner_of`.
    pub fn new(config: MetricsConfig, provider: Provider, owner_of: OwnerOf) -> Self {
        UsageSampler {
            inner: Arc::new(Inner {
                config,
                provider,
                owner_of,
                last: Mutex::new(None),
                taking: tokio::sync::Mutex::new(()),
            }),
        }
    }

    fn refresh_every(&self) -> Option<Duration> {
        match self.inner.config.usage_refresh_ms {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// Sandbox `sandbox`'s (a runtime id) usage in the latest sample, with
    /// its CPU cores and the sample's age; never takes a sample (a
    /// description's read path calls no engine).
    pub fn latest_of(&self, sandbox: &str) -> Option<(Usage, Option<f64>, Duration)> {
        let last = lock(&self.inner.last).clone()?;
        let m = last.sandboxes.iter().find(|m| m.sandbox == sandbox)?;
        Some((m.usage.clone(), m.cores, last.age()))
    }

    /// Sandbox `sandbox`'s usage for its description: its entry in the
    /// latest sample while that is fresh (younger than
    /// `server.metrics.usage_refresh_ms`), else read now from its agent
    /// (the engine's stats where the agent cannot answer), its CPU cores
    /// against the last sample's reading when it was in it. `None` when it
    /// cannot be read within `READ_TIMEOUT`. Not activity: the
    /// sandbox is read, not leased.
    pub async fn describe(
        &self,
        sandbox: &corral::Sandbox,
    ) -> Option<(Usage, Option<f64>, Duration)> {
        let last = lock(&self.inner.last).clone();
        let known = last
            .as_ref()
            .and_then(|s| Some((s, s.sandboxes.iter().find(|m| m.sandbox == sandbox.id())?)));
        let fresh = self.refresh_every().unwrap_or(Duration::ZERO);
        if let Some((s, m)) = known {
            if s.age() < fresh {
                return Some((m.usage.clone(), m.cores, s.age()));
            }
        }
        let usage = tokio::time::timeout(READ_TIMEOUT, async {
            // A paused sandbox's agent answers nothing until it is resumed:
            // the engine's counters, without waiting for it.
            if sandbox.is_paused() {
                return sandbox.usage().await;
            }
            match sandbox.usage_from_agent().await {
                Ok(u) => Ok(u),
                Err(_) => sandbox.usage().await,
            }
        })
        .await
        .ok()?
        .ok()?;
        let cores = known.and_then(|(s, m)| {
            let secs = s.at.elapsed().as_secs_f64();
            (secs > 0.0 && usage.cpu_ns >= m.usage.cpu_ns)
                .then(|| (usage.cpu_ns - m.usage.cpu_ns) as f64 / 1e9 / secs)
        });
        Some((usage, cores, Duration::ZERO))
    }

    /// The sample a scrape reports: the last one while it is fresh; a
    /// stale one while a new one is taken in the background; the first one
    /// waited for (at most [`FIRST_WAIT`]). `None` with usage metrics off
    /// or before any sample exists.
    pub async fn current(&self) -> Option<Arc<Sample>> {
        let every = self.refresh_every()?;
        let last = lock(&self.inner.last).clone();
        match last {
            Some(s) if s.at.elapsed() < every => Some(s),
            Some(s) => {
                let me = self.clone();
                tokio::spawn(async move { me.refresh(every).await });
                Some(s)
            }
            None => {
                // The sample is taken by a task of its own: a scrape that
                // stops waiting does not cancel it, the next one finds it.
                let me = self.clone();
                let taking = tokio::spawn(async move { me.refresh(every).await });
                let _ = tokio::time::timeout(FIRST_WAIT, taking).await;
                lock(&self.inner.last).clone()
            }
        }
    }

    /// Takes a sample unless one is being taken or a fresh one exists.
    async fn refresh(&self, every: Duration) {
        let Ok(_taking) = self.inner.taking.try_lock() else {
            // Another scrape's sample is on its way: wait for it.
            let _wait = self.inner.taking.lock().await;
            return;
        };
        if lock(&self.inner.last)
            .as_ref()
            .is_some_and(|s| s.at.elapsed() < every)
        {
            return;
        }
        let sample = self.take().await;
        *lock(&self.inner.last) = Some(Arc::new(sample));
    }

    /// Reads every held sandbox's usage, [`PARALLEL`] at a time.
    async fn take(&self) -> Sample {
        let started = Instant::now();
        let previous: HashMap<String, (Instant, u64)> = lock(&self.inner.last)
            .as_ref()
            .map(|s| {
                s.sandboxes
                    .iter()
                    .map(|m| (m.sandbox.clone(), (s.at, m.usage.cpu_ns)))
                    .collect()
            })
            .unwrap_or_default();
        let held = self.inner.provider.held();
        let reads = futures_util::stream::iter(held.into_iter().map(|h| async move {
            // The agent reads the cgroup from inside: no engine call, a
            // millisecond or two. The engine's stats (Docker's wait for
            // its collector's next tick, about a second) only where the
            // agent cannot answer.
            let read = tokio::time::timeout(READ_TIMEOUT, async {
                match h.sandbox.usage_from_agent().await {
                    Ok(u) => Ok(u),
                    Err(_) => h.sandbox.usage().await,
                }
            })
            .await;
            (h, read, Instant::now())
        }))
        .buffer_unordered(PARALLEL)
        .collect::<Vec<_>>()
        .await;
        let mut sandboxes = Vec::with_capacity(reads.len());
        let mut errors = 0;
        for (h, read, at) in reads {
            let Held {
                key,
                profile,
                sandbox,
            } = h;
            let usage = match read {
                Ok(Ok(u)) => u,
                _ => {
                    errors += 1;
                    continue;
                }
            };
            let id = sandbox.id().to_string();
            let cores = previous.get(&id).and_then(|(then, cpu)| {
                let secs = at.duration_since(*then).as_secs_f64();
                (secs > 0.0 && usage.cpu_ns >= *cpu)
                    .then(|| (usage.cpu_ns - cpu) as f64 / 1e9 / secs)
            });
            let owner = key
                .as_deref()
                .map(|k| (self.inner.owner_of)(k).unwrap_or(Principal::Operator));
            sandboxes.push(Measured {
                sandbox: id,
                key,
                owner,
                profile,
                usage,
                cores,
            });
        }
        Sample {
            at: Instant::now(),
            took: started.elapsed(),
            sandboxes,
            errors,
        }
    }

    /// The sessions of `sample` that `caller` may see, with their usage,
    /// sorted by session key: (the key as `caller` names it, the sandbox's
    /// runtime id, CPU cores used between the last two samples, usage).
    pub fn sessions(&self, sample: &Sample, caller: &Principal) -> Vec<SessionUsage> {
        let mut out: Vec<SessionUsage> = sample
            .sandboxes
            .iter()
            .filter_map(|m| {
                let key = m.key.as_deref()?;
                let owner = m.owner.as_ref()?;
                (matches!(caller, Principal::Operator) || caller.may_session(owner)).then(|| {
                    SessionUsage {
                        session: caller.display_key(key),
                        sandbox: m.sandbox.clone(),
                        cpu_cores: m.cores,
                        usage: m.usage.clone(),
                    }
                })
            })
            .collect();
        out.sort_by(|a, b| a.session.cmp(&b.session));
        out
    }

    /// The usage metrics of `sample` that `caller` may see, as a collector
    /// for a registry of the scrape.
    pub fn view(&self, sample: Arc<Sample>, caller: Principal) -> UsageView {
        UsageView {
            sample,
            caller,
            top: self.inner.config.top_sandboxes,
        }
    }
}

/// The owner label of a sandbox: `operator`, `tenant:NAME` (an MCP
/// session's sandbox counts for its tenant), or `pool` for a warm pool's
/// spare.
fn owner_label(owner: Option<&Principal>) -> String {
    match owner {
        None => "pool".into(),
        Some(Principal::Operator) | Some(Principal::Mcp { tenant: None, .. }) => "operator".into(),
        Some(Principal::Tenant(t))
        | Some(Principal::Mcp {
            tenant: Some(t), ..
        }) => {
            format!("tenant:{t}")
        }
    }
}

/// One scrape's view of a sample: what its caller may see.
#[derive(Debug)]
pub struct UsageView {
    sample: Arc<Sample>,
    caller: Principal,
    top: usize,
}

/// Sums per owner and profile.
#[derive(Default)]
struct Group {
    sandboxes: u64,
    cpu_seconds: f64,
    cores: f64,
    memory: u64,
    memory_limit: u64,
    pids: u64,
}

fn gauge_family<'a>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Vec<(&'a str, String)>, f64)>,
) -> fmt::Result {
    let mut m = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in rows {
        let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        ConstGauge::new(v).encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: f64) -> fmt::Result {
    let m = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    ConstGauge::new(v).encode(m)
}

/// A gauge histogram spelled as a gauge with an `le` label: how many
/// sandboxes are at or below each bound now (cumulative, `+Inf` all).
fn gauge_histogram(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    bounds: &[f64],
    values: &[f64],
) -> fmt::Result {
    let rows = bounds
        .iter()
        .map(|b| {
            let n = values.iter().filter(|v| **v <= *b).count();
            (vec![("le", b.to_string())], n as f64)
        })
        .chain(std::iter::once((
            vec![("le", "+Inf".to_string())],
            values.len() as f64,
        )));
    gauge_family(e, name, help, rows)
}

impl UsageView {
    fn visible(&self) -> Vec<&Measured> {
        self.sample
            .sandboxes
            .iter()
            .filter(|m| match (&self.caller, &m.owner) {
                (Principal::Operator, _) => true,
                (c, Some(o)) => c.may_session(o),
                (_, None) => false,
            })
            .collect()
    }

    fn top_rows(
        &self,
        seen: &[&Measured],
        value: impl Fn(&Measured) -> Option<f64>,
    ) -> Vec<(Vec<(&'static str, String)>, f64)> {
        let mut ranked: Vec<(&Measured, f64)> =
            seen.iter().filter_map(|m| Some((*m, value(m)?))).collect();
        ranked.sort_by(|a, b| {
            b.1.total_cmp(&a.1)
                .then_with(|| a.0.sandbox.cmp(&b.0.sandbox))
        });
        ranked
            .into_iter()
            .take(self.top)
            .map(|(m, v)| {
                let session = m
                    .key
                    .as_deref()
                    .map(|k| self.caller.display_key(k))
                    .unwrap_or_default();
                (
                    vec![
                        ("sandbox", m.sandbox.clone()),
                        ("session", session),
                        ("owner", owner_label(m.owner.as_ref())),
                    ],
                    v,
                )
            })
            .collect()
    }
}

impl Collector for UsageView {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let s = &self.sample;
        let seen = self.visible();
        let mut groups: BTreeMap<(String, String), Group> = BTreeMap::new();
        for m in &seen {
            let g = groups
                .entry((
                    owner_label(m.owner.as_ref()),
                    m.profile.clone().unwrap_or_else(|| "none".into()),
                ))
                .or_default();
            g.sandboxes += 1;
            g.cpu_seconds += m.usage.cpu_ns as f64 / 1e9;
            g.cores += m.cores.unwrap_or(0.0);
            g.memory += m.usage.memory_bytes;
            g.memory_limit += m.usage.memory_limit_bytes.unwrap_or(0);
            g.pids += m.usage.pids;
        }
        let by_group = |f: fn(&Group) -> f64| {
            groups
                .iter()
                .map(move |((o, p), g)| (vec![("owner", o.clone()), ("profile", p.clone())], f(g)))
                .collect::<Vec<_>>()
        };
        gauge(
            &mut e,
            "usage_sample_age_seconds",
            "Age of the usage sample these usage_ metrics come from",
            s.at.elapsed().as_secs_f64(),
        )?;
        gauge(
            &mut e,
            "usage_sample_duration_seconds",
            "Time the last usage sample took to read every sandbox",
            s.took.as_secs_f64(),
        )?;
        gauge(
            &mut e,
            "usage_sample_errors",
            "Sandboxes whose usage could not be read at the last sample",
            s.errors as f64,
        )?;
        gauge_family(
            &mut e,
            "usage_sandboxes",
            "Sandboxes in the usage sample, by owner and profile",
            by_group(|g| g.sandboxes as f64),
        )?;
        gauge_family(
            &mut e,
            "usage_cpu_seconds",
            "CPU time the live sandboxes used since they started, by owner and profile",
            by_group(|g| g.cpu_seconds),
        )?;
        gauge_family(
            &mut e,
            "usage_cpu_cores",
            "CPU cores the sandboxes used between the last two samples, by owner and profile",
            by_group(|g| g.cores),
        )?;
        gauge_family(
            &mut e,
            "usage_memory_bytes",
            "Memory the sandboxes use (page cache that can be dropped left out), by owner and profile",
            by_group(|g| g.memory as f64),
        )?;
        gauge_family(
            &mut e,
            "usage_memory_limit_bytes",
            "The memory limits of those sandboxes (sandboxes without one add nothing), by owner and profile",
            by_group(|g| g.memory_limit as f64),
        )?;
        gauge_family(
            &mut e,
            "usage_pids",
            "Processes and threads in the sandboxes, by owner and profile",
            by_group(|g| g.pids as f64),
        )?;
        let fractions: Vec<f64> = seen
            .iter()
            .filter_map(|m| {
                let limit = m.usage.memory_limit_bytes.filter(|l| *l > 0)?;
                Some(m.usage.memory_bytes as f64 / limit as f64)
            })
            .collect();
        gauge_histogram(
            &mut e,
            "usage_memory_limit_fraction_sandboxes",
            "Sandboxes (with a memory limit) whose memory in use is at most `le` of their limit, at the last sample",
            &MEMORY_FRACTION_BOUNDS,
            &fractions,
        )?;
        let cores: Vec<f64> = seen.iter().filter_map(|m| m.cores).collect();
        gauge_histogram(
            &mut e,
            "usage_cpu_cores_sandboxes",
            "Sandboxes that used at most `le` CPU cores between the last two samples",
            &CPU_CORE_BOUNDS,
            &cores,
        )?;
        if self.top > 0 {
            gauge_family(
                &mut e,
                "usage_top_memory_bytes",
                "Memory in use of the sandboxes using the most (server.metrics.top_sandboxes of them)",
                self.top_rows(&seen, |m| Some(m.usage.memory_bytes as f64)),
            )?;
            gauge_family(
                &mut e,
                "usage_top_cpu_cores",
                "CPU cores used between the last two samples by the sandboxes using the most (server.metrics.top_sandboxes of them)",
                self.top_rows(&seen, |m| m.cores),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    fn measured(i: usize, owner: Option<Principal>, memory: u64) -> Measured {
        Measured {
            sandbox: format!("sb-{i:03}"),
            key: owner.as_ref().map(|o| match o {
                Principal::Tenant(t) => format!("{t}:k{i}"),
                _ => format!("k{i}"),
            }),
            owner,
            profile: None,
            usage: Usage {
                memory_bytes: memory,
                memory_limit_bytes: Some(100),
                cpu_ns: 1_000_000_000,
                pids: 2,
                ..Usage::default()
            },
            cores: Some(i as f64 / 100.0),
        }
    }

    fn render(view: UsageView) -> String {
        let mut r = Registry::with_prefix("corral");
        r.register_collector(Box::new(view));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).expect("encode");
        out
    }

    fn series(text: &str, name: &str) -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with(name) && !l.starts_with('#'))
            .map(String::from)
            .collect()
    }

    #[test]
    fn labels_stay_bounded_and_tenants_see_their_own() {
        let alice = Principal::Tenant("alice".into());
        let bob = Principal::Tenant("bob".into());
        let mut sandboxes = Vec::new();
        for i in 0..60 {
            let owner = match i % 3 {
                0 => Some(alice.clone()),
                1 => Some(bob.clone()),
                _ => None,
            };
            sandboxes.push(measured(i, owner, i as u64));
        }
        let sample = Arc::new(Sample {
            at: Instant::now(),
            took: Duration::from_millis(3),
            sandboxes,
            errors: 1,
        });
        let view = |caller: Principal| UsageView {
            sample: sample.clone(),
            caller,
            top: 5,
        };
        let all = render(view(Principal::Operator));
        // Three owners, one profile: three series per group metric.
        assert_eq!(series(&all, "corral_usage_sandboxes{").len(), 3, "{all}");
        assert!(
            all.contains(r#"corral_usage_sandboxes{owner="pool",profile="none"} 20"#),
            "{all}"
        );
        // Top 5 by memory, highest first, whatever the number of sandboxes.
        let top = series(&all, "corral_usage_top_memory_bytes{");
        assert_eq!(top.len(), 5, "{all}");
        assert!(top[0].contains(r#"sandbox="sb-059""#), "{top:?}");
        assert_eq!(series(&all, "corral_usage_top_cpu_cores{").len(), 5);
        // Gauge histogram: cumulative, +Inf counts every sandbox.
        assert!(
            all.contains(r#"corral_usage_memory_limit_fraction_sandboxes{le="+Inf"} 60"#),
            "{all}"
        );
        assert!(
            all.contains(r#"corral_usage_memory_limit_fraction_sandboxes{le="0.1"} 11"#),
            "{all}"
        );
        assert!(all.contains("corral_usage_sample_errors 1"), "{all}");

        // Alice sees her own 20 and names them as she does.
        let hers = render(view(alice));
        assert_eq!(series(&hers, "corral_usage_sandboxes{").len(), 1, "{hers}");
        assert!(hers.contains(r#"corral_usage_sandboxes{owner="tenant:alice",profile="none"} 20"#));
        let top = series(&hers, "corral_usage_top_memory_bytes{");
        assert_eq!(top.len(), 5);
        assert!(
            top.iter().all(|l| l.contains(r#"owner="tenant:alice""#)),
            "{top:?}"
        );
        assert!(top[0].contains(r#"session="k57""#), "{top:?}");
        assert!(
            !hers.contains("tenant:bob") && !hers.contains("pool"),
            "{hers}"
        );
    }

    #[test]
    fn owners_of_mcp_sessions_count_for_their_tenant() {
        let mcp = Principal::Mcp {
            tenant: Some("alice".into()),
            session: "mcp-1".into(),
        };
        assert_eq!(owner_label(Some(&mcp)), "tenant:alice");
        assert_eq!(owner_label(None), "pool");
        assert_eq!(owner_label(Some(&Principal::Operator)), "operator");
    }
}
