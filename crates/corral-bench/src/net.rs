//! The network rows (`corral bench --rows net`): what the egress gateway
//! and the port links cost, each against a direct path measured in the
//! same run to the same server.
//!
//! The servers are [`corral_internet`]'s (`pypi.test` over HTTP and HTTPS,
//! its 32 MiB `/big`), made for the run and torn down by
//! [`Bench::clean_up`]. The direct side is a raw container of the
//! internet's client image on the servers' own network (no policy); the
//! egress side a sandbox of the same image whose policy allows
//! `pypi.test`, on a backend whose gateways reach out through that network
//! (`DockerConfig::egress_network`). Both time connection setup with curl
//! inside (`time_total` of a fresh connection and one small GET), so the
//! command that runs curl is outside the clock. The port rows time one
//! HTTP round trip (a new connection, `GET /`, the answer) from this
//! process to busybox `httpd` in a sandbox: straight to the container's
//! address, and through a port link of a `corral serve` run in this
//! process over the bench's runtime.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use corral::{Provider, Runtime, RuntimeConfig};
use corral_core::config::Config;
use corral_core::egress::EgressPolicy;
use corral_core::{CommandSpec, Network, SandboxSpec};
use corral_docker::{DockerBackend, DockerConfig};
use corral_internet::Internet;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::report::{Ratio, Row};
use crate::stats::{times, Latency};
use crate::{lock, Bench, SANDBOX_BENCH_LABEL};

/// Bytes of the transfer rows (`/big` of the internet's servers).
const BIG: f64 = (32 << 20) as f64;

/// What the network rows measured.
pub(crate) struct NetReport {
    pub(crate) http_direct: Latency,
    pub(crate) http_egress: Latency,
    pub(crate) https_direct: Latency,
    pub(crate) https_egress: Latency,
    pub(crate) big_direct: Latency,
    pub(crate) big_egress: Latency,
    pub(crate) port_direct: Latency,
    pub(crate) port_link: Latency,
}

/// MB/s of 32 MiB in `d`.
fn mb_per_s(d: Duration) -> f64 {
    BIG / d.as_secs_f64().max(1e-9) / 1e6
}

impl NetReport {
    /// The line under the table's header.
    pub(crate) fn describe(&self) -> String {
        format!(
            "network: {} connections per kind, {} transfers of 32 MiB, {} port round trips",
            self.http_egress.n, self.big_egress.n, self.port_link.n
        )
    }

    pub(crate) fn rows(&self) -> Vec<Row<'_>> {
        let rate = |l: &Latency| {
            let best = mb_per_s(l.p50);
            (format!("{best:.0} MB/s at p50"), json!(best))
        };
        let (big_direct_note, big_direct_rate) = rate(&self.big_direct);
        let (big_egress_note, big_egress_rate) = rate(&self.big_egress);
        vec![
            Row::new(
                "net_http_direct",
                "",
                "HTTP connect+GET, direct (no policy)",
                self.http_direct,
            )
            .floor(),
            Row::new(
                "net_http_egress",
                "10",
                "HTTP connect+GET through the egress gateway",
                self.http_egress,
            ),
            Row::new(
                "net_https_direct",
                "",
                "HTTPS connect+GET, direct (no policy)",
                self.https_direct,
            )
            .floor(),
            Row::new(
                "net_https_egress",
                "11",
                "HTTPS connect+GET through the egress gateway",
                self.https_egress,
            ),
            Row::new(
                "net_32mib_direct",
                "",
                "32 MiB over HTTP, direct (no policy)",
                self.big_direct,
            )
            .floor()
            .noted(Some(big_direct_note))
            .with("mb_per_s", big_direct_rate),
            Row::new(
                "net_32mib_egress",
                "12",
                "32 MiB over HTTP through the egress gateway",
                self.big_egress,
            )
            .noted(Some(big_egress_note))
            .with("mb_per_s", big_egress_rate),
            Row::new(
                "port_direct",
                "",
                "HTTP round trip, container address",
                self.port_direct,
            )
            .floor(),
            Row::new(
                "port_link",
                "13",
                "HTTP round trip through a corral serve link",
                self.port_link,
            ),
        ]
    }

    /// Direct over corral (higher is better, 1 would be free). The targets
    /// bound what the extra hops may cost: the gateway's resolver and its
    /// upstream lookup per plain connection (at most 3x), a relay that
    /// TLS's own round trips dwarf (at most 1.25x), half the direct bulk
    /// throughput through the gateway's two relay threads, and a port link
    /// through the service's HTTP stack at most 4x a direct connection.
    pub(crate) fn ratios(&self) -> Vec<Ratio> {
        let ratio = |id, label, value, target| Ratio {
            id,
            label,
            value,
            target,
            applies: true,
        };
        vec![
            ratio(
                "egress_http_vs_direct",
                "egress HTTP connect+GET p50 vs direct p50",
                times(self.http_direct.p50, self.http_egress.p50),
                0.33,
            ),
            ratio(
                "egress_https_vs_direct",
                "egress HTTPS connect+GET p50 vs direct p50",
                times(self.https_direct.p50, self.https_egress.p50),
                0.8,
            ),
            ratio(
                "egress_32mib_vs_direct",
                "egress 32 MiB throughput vs direct",
                times(self.big_direct.p50, self.big_egress.p50),
                0.5,
            ),
            ratio(
                "port_link_vs_direct",
                "port link round trip p50 vs direct p50",
                times(self.port_direct.p50, self.port_link.p50),
                0.25,
            ),
        ]
    }
}

/// `n` fresh connections to `url` by curl, each one's `time_total`.
fn curl_times(n: usize, url: &str) -> String {
    format!(
        "for i in $(seq {n}); do curl -sf -o /dev/null -w '%{{time_total}}\\n' {url} || echo fail; done"
    )
}

/// The seconds curl printed, one a line; an error quoting the output when
/// any request failed or a line is not a number.
fn seconds(out: &str, what: &str, n: usize) -> anyhow::Result<Vec<Duration>> {
    let v: Vec<Duration> = out
        .lines()
        .map(|l| {
            l.trim()
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(Duration::from_secs_f64)
                .with_context(|| format!("{what}: a request failed: {l:?} in {out:?}"))
        })
        .collect::<anyhow::Result<_>>()?;
    if v.len() != n {
        bail!("{what}: {} measurements, not {n}: {out:?}", v.len());
    }
    Ok(v)
}

/// One HTTP/1.0 exchange on a new connection to `addr`; the answer.
fn http(addr: &str, method: &str, path: &str, token: &str, body: Option<&Value>) -> String {
    http_to(addr, addr, method, path, token, body)
}

/// [`http`] under the host name `host` (a port link's, which the test
/// resolves no more than glibc does).
fn http_to(
    addr: &str,
    host: &str,
    method: &str,
    path: &str,
    token: &str,
    body: Option<&Value>,
) -> String {
    let exchange = || -> std::io::Result<String> {
        let mut s = TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(60)))?;
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let req = format!(
            "{method} {path} HTTP/1.0\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes())?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    };
    exchange().unwrap_or_else(|e| format!("(no answer: {e})"))
}

/// The JSON body of an answer.
fn body_of(answer: &str, what: &str) -> anyhow::Result<Value> {
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    serde_json::from_str(body).with_context(|| format!("{what}: not JSON: {answer:?}"))
}

/// `n` round trips of `GET path` through `addr`, each checked for the page.
fn round_trips(addr: &str, host: &str, path: &str, n: usize) -> anyhow::Result<Vec<Duration>> {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            let answer = http_to(addr, host, "GET", path, "", None);
            let took = t.elapsed();
            if !answer.contains("bench-page") {
                bail!("GET {path} through {addr} did not reach the page: {answer:?}");
            }
            Ok(took)
        })
        .collect()
}

impl Bench {
    /// The network rows. The internet is kept in the bench so
    /// [`Bench::clean_up`] removes it whatever happens here.
    pub(crate) async fn measure_net(&self) -> anyhow::Result<NetReport> {
        let n = self.samples.connections;
        let transfers = self.samples.transfers;
        self.progress.set_message("network: the test internet");
        let tag = format!("corral-{}-net", self.run_id);
        let net = tokio::task::spawn_blocking(move || Internet::start(&tag))
            .await
            .context("making the test internet")?
            .context("making the test internet (corral-internet)")?;
        *lock(&self.internet) = Some(net.clone());

        // Direct: a raw container on the servers' network.
        let direct = self
            .raw_start_on(&net.image, &net.network)
            .await
            .context("the direct client container")?;
        // Egress: a sandbox whose gateway reaches out through that network.
        let backend = DockerBackend::connect(&DockerConfig {
            egress_network: Some(net.network.clone()),
            ..self.backend.config().clone()
        })
        .await
        .context("a second connection to the daemon (the egress gateways' network)")?;
        let runtime = Runtime::new(
            Arc::new(backend),
            RuntimeConfig {
                reap_orphans: false,
                ..RuntimeConfig::default()
            },
        );
        let mut spec = SandboxSpec::new(net.image.clone());
        spec.labels
            .insert(SANDBOX_BENCH_LABEL.into(), self.run_id.clone());
        spec.network = Network::Egress(EgressPolicy {
            allow: vec!["pypi.test".into()],
            deny: vec![],
        });
        let sb = runtime
            .create(&spec)
            .await
            .context("the sandbox with an egress policy")?;
        let in_sandbox = |script: String| {
            let sb = &sb;
            async move {
                let r = sb
                    .run(&CommandSpec::shell(script).timeout(Duration::from_secs(900)))
                    .await;
                String::from_utf8_lossy(&r.stdout).into_owned()
            }
        };
        // Warm both paths: page cache, resolvers, the server's threads.
        self.raw_output(&direct, &curl_times(3, "http://pypi.test/"))
            .await?;
        in_sandbox(curl_times(3, "http://pypi.test/")).await;

        let mut measured = Vec::new();
        for (what, url, count) in [
            ("HTTP", "http://pypi.test/", n),
            ("HTTPS", "https://pypi.test/", n),
            ("32 MiB", "http://pypi.test/big", transfers),
        ] {
            self.progress
                .set_message(format!("network: {what}, direct"));
            let out = self.raw_output(&direct, &curl_times(count, url)).await?;
            let d = seconds(&out, &format!("{what} direct"), count)?;
            self.progress
                .set_message(format!("network: {what}, egress gateway"));
            let out = in_sandbox(curl_times(count, url)).await;
            let e = seconds(&out, &format!("{what} through the egress gateway"), count)?;
            self.progress.inc(2 * count as u64);
            measured.push((Latency::of(d), Latency::of(e)));
        }
        sb.destroy()
            .await
            .context("removing the sandbox with an egress policy")?;
        self.raw_remove(&direct).await?;

        self.progress.set_message("network: port links");
        let (port_direct, port_link) = self.ports(n).await?;
        self.progress.inc(2 * n as u64);
        Ok(NetReport {
            http_direct: measured[0].0,
            http_egress: measured[0].1,
            https_direct: measured[1].0,
            https_egress: measured[1].1,
            big_direct: measured[2].0,
            big_egress: measured[2].1,
            port_direct,
            port_link,
        })
    }

    /// `n` round trips to busybox `httpd` in a sandbox on corral's network:
    /// straight to its address, and through a port link of a `corral
    /// serve` in this process.
    async fn ports(&self, n: usize) -> anyhow::Result<(Latency, Latency)> {
        let token = format!("bench-{}", corral::host::random_hex(16));
        let mut config = Config::default();
        config.defaults.image = self.options.image.clone();
        config
            .defaults
            .labels
            .insert(SANDBOX_BENCH_LABEL.into(), self.run_id.clone());
        config.server.listen = "127.0.0.1:0".into();
        config.server.token = Some(token.clone());
        let runtime_dir = std::env::temp_dir().join(format!("corral-{}", self.run_id));
        config.server.runtime_dir = Some(runtime_dir.to_string_lossy().into_owned());
        let provider = Provider::new(self.runtime.clone(), config.provider.clone());
        let stop = CancellationToken::new();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let service = tokio::spawn(corral_server::serve(
            config,
            self.runtime.clone(),
            provider,
            self.options.image.clone(),
            stop.clone(),
            move |bound| {
                let _ = tx.send((bound.tcp, bound.ports));
            },
        ));
        let measured = async {
            let (addr, ports) = rx
                .await
                .context("the in-process corral serve did not listen")?;
            // Links are served by the port-link listener, an origin of its own.
            let (addr, ports) = (addr.to_string(), ports.to_string());
            let image = self.options.image.clone();
            tokio::task::spawn_blocking(move || -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
                let created = body_of(
                    &http(&addr, "POST", "/v1/sandboxes", &token, Some(&json!({"spec": {"image": image, "network": "bridge"}}))),
                    "POST /v1/sandboxes",
                )?;
                let (Some(id), Some(container)) =
                    (created["id"].as_str(), created["container_id"].as_str())
                else {
                    bail!("POST /v1/sandboxes: no id or container_id in {created}");
                };
                let started = body_of(
                    &http(&addr, "POST", &format!("/v1/sandboxes/{id}/exec"), &token, Some(&json!({
                        "command": "mkdir -p /www && echo bench-page > /www/index.html && \
                                    httpd -p 8080 -h /www </dev/null >/dev/null 2>&1 && \
                                    for i in $(seq 1 50); do wget -q -O /dev/null http://127.0.0.1:8080/ && exit 0; sleep 0.1; done; exit 1",
                        "timeout_ms": 60_000
                    }))),
                    "starting httpd",
                )?;
                if started["exit_code"] != 0 {
                    bail!("httpd did not start in the port rows' sandbox: {started}");
                }
                let link = body_of(
                    &http(&addr, "GET", &format!("/v1/sandboxes/{id}/ports/8080"), &token, None),
                    "the port link",
                )?;
                let (Some(path), Some(host)) = (
                    link["path"].as_str().map(str::to_string),
                    link["host"].as_str().map(str::to_string),
                ) else {
                    bail!("no path or host in the port link {link}");
                };
                let ip = corral_internet::docker(&[
                    "inspect",
                    "-f",
                    "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                    container,
                ])?;
                let direct = format!("{ip}:8080");
                round_trips(&direct, &direct, "/", 3)?;
                round_trips(&ports, &host, &path, 3)?;
                let d = round_trips(&direct, &direct, "/", n)?;
                let l = round_trips(&ports, &host, &path, n)?;
                let _ = http(&addr, "DELETE", &format!("/v1/sandboxes/{id}"), &token, None);
                Ok((d, l))
            })
            .await
            .context("the port rows")?
        }
        .await;
        // The service removes its sandboxes as it stops.
        stop.cancel();
        let _ = service.await;
        let _ = std::fs::remove_dir_all(&runtime_dir);
        let (d, l) = measured?;
        Ok((Latency::of(d), Latency::of(l)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn curl_output_is_read_or_the_failure_quoted() {
        let v = seconds("0.001\n0.002500\n", "HTTP", 2).expect("two numbers");
        assert_eq!(v, [Duration::from_millis(1), Duration::from_micros(2500)]);
        let e = seconds("0.001\nfail\n", "HTTP direct", 2).expect_err("a failed request");
        assert!(
            e.to_string().contains("HTTP direct") && e.to_string().contains("fail"),
            "{e}"
        );
        let e = seconds("0.001\n", "HTTPS", 2).expect_err("one missing");
        assert!(e.to_string().contains("1 measurements, not 2"), "{e}");
    }

    #[test]
    fn a_transfer_row_shows_its_rate() {
        assert!((mb_per_s(Duration::from_secs(1)) - 33.554432).abs() < 1e-9);
    }
}
