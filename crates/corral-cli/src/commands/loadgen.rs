//! `corral loadgen`: drives a running `corral serve`'s exec route
//! (`POST /v1/sandboxes/{id}/exec`, JSON over HTTP/1.1) as hard as one
//! keep-alive connection per sandbox, one command at a time on each, can,
//! and reports commands/s: the service's capacity from a client that costs
//! next to nothing, the floor `scripts/bench-python.py --throughput` sets
//! the Python client against.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Full};
use hyper::header;
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// Largest answer body read from the service.
const MAX_BODY: usize = 1 << 20;

/// Measure a running service's commands/s from Rust.
///
/// Sends `POST /v1/sandboxes/{id}/exec` with `{"argv": ["true"]}` to each
/// of the given sandboxes of a running `corral serve` (made beforehand, by
/// any client: this only runs commands), over one keep-alive HTTP/1.1
/// connection per sandbox and one command at a time on each, for
/// --seconds, and prints the commands done, the seconds and commands/s.
/// Any answer but 200 with exit code 0 stops it with an error.
#[derive(Args, Debug)]
pub struct LoadgenArgs {
    /// The service, http://HOST:PORT [default: $CORRAL_URL].
    #[arg(long, env = "CORRAL_URL")]
    url: String,
    /// Bearer token [default: $CORRAL_TOKEN].
    #[arg(long, env = "CORRAL_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Seconds to send commands for.
    #[arg(long, default_value = "5", value_parser = positive_seconds)]
    seconds: f64,
    /// `max_output` of each command (bytes kept per stream; the service
    /// reserves it per command in flight).
    #[arg(long, default_value = "4096")]
    max_output: u64,
    /// Print one JSON object instead of a line.
    #[arg(long)]
    json: bool,
    /// Sandbox ids (session keys), one connection each.
    #[arg(required = true, value_parser = sandbox_id)]
    sandboxes: Vec<String>,
}

fn positive_seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Ok(s),
        _ => Err(format!(
            "'{text}' is not a number of seconds above 0 (at most 86400)"
        )),
    }
}

/// An id that goes into a URL path as it is.
fn sandbox_id(text: &str) -> Result<String, String> {
    let fine = |c: char| c.is_ascii_alphanumeric() || "-._~".contains(c);
    if text.is_empty() || !text.chars().all(fine) {
        return Err(format!(
            "sandbox id '{text}': expected letters, digits and -._~ only"
        ));
    }
    Ok(text.to_string())
}

/// Where the service listens: `host:port` to connect to and the Host header.
fn target(url: &str) -> anyhow::Result<String> {
    let uri: hyper::Uri = url
        .parse()
        .with_context(|| format!("--url '{url}' is not a URL"))?;
    if uri.scheme_str() != Some("http") {
        bail!("--url '{url}': expected http://HOST:PORT");
    }
    if !matches!(uri.path(), "" | "/") {
        bail!("--url '{url}': expected no path after HOST:PORT");
    }
    let host = uri
        .host()
        .with_context(|| format!("--url '{url}' names no host"))?;
    let port = uri.port_u16().unwrap_or(80);
    Ok(if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    })
}

/// Runs `true` in sandbox `id` over one connection until `until`; returns
/// how many ran.
async fn drive(
    addr: String,
    auth: Option<String>,
    id: String,
    body: Bytes,
    until: Instant,
) -> anyhow::Result<u64> {
    let stream = tokio::net::TcpStream::connect(&addr)
        .await
        .with_context(|| format!("cannot connect to the service at {addr}"))?;
    stream.set_nodelay(true).ok();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .with_context(|| format!("HTTP handshake with {addr}"))?;
    let conn = tokio::spawn(conn);
    let path = format!("/v1/sandboxes/{id}/exec");
    let mut done = 0u64;
    while Instant::now() < until {
        let mut req = hyper::Request::post(&path)
            .header(header::HOST, &addr)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json");
        if let Some(auth) = &auth {
            req = req.header(header::AUTHORIZATION, auth);
        }
        let req = req
            .body(Full::new(body.clone()))
            .context("building the exec request")?;
        let answer = send
            .send_request(req)
            .await
            .with_context(|| format!("exec in sandbox {id}"))?;
        let status = answer.status();
        let bytes = http_body_util::Limited::new(answer.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| anyhow::anyhow!("reading the answer of exec in sandbox {id}: {e}"))?
            .to_bytes();
        if status != hyper::StatusCode::OK {
            bail!(
                "exec in sandbox {id}: HTTP {status}: {}",
                String::from_utf8_lossy(&bytes)
            );
        }
        let outcome: Value = serde_json::from_slice(&bytes)
            .with_context(|| format!("exec in sandbox {id}: the answer is not JSON"))?;
        if outcome.get("exit_code").and_then(Value::as_i64) != Some(0) {
            bail!("exec in sandbox {id}: `true` did not exit 0: {outcome}");
        }
        done += 1;
    }
    drop(send);
    conn.abort();
    Ok(done)
}

pub async fn run(args: LoadgenArgs) -> anyhow::Result<ExitCode> {
    let addr = target(&args.url)?;
    let auth = args.token.as_ref().map(|t| format!("Bearer {t}"));
    let body = Bytes::from(
        serde_json::json!({"argv": ["true"], "timeout_ms": 30_000, "max_output": args.max_output})
            .to_string(),
    );
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(args.seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for id in &args.sandboxes {
        tasks.spawn(drive(
            addr.clone(),
            auth.clone(),
            id.clone(),
            body.clone(),
            until,
        ));
    }
    let mut commands = 0u64;
    while let Some(joined) = tasks.join_next().await {
        commands += joined.context("a connection's task failed")??;
    }
    let seconds = started.elapsed().as_secs_f64();
    let rate = commands as f64 / seconds;
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "commands": commands,
                "seconds": seconds,
                "commands_per_second": rate,
                "connections": args.sandboxes.len(),
            })
        );
    } else {
        println!(
            "{commands} commands in {seconds:.2} s over {} connections: {rate:.0} commands/s",
            args.sandboxes.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_and_ids_are_checked() {
        assert_eq!(
            target("http://127.0.0.1:7070").ok().as_deref(),
            Some("127.0.0.1:7070")
        );
        assert_eq!(
            target("http://[::1]:7070/").ok().as_deref(),
            Some("[::1]:7070")
        );
        let e = target("https://127.0.0.1:7070")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("--url 'https://127.0.0.1:7070'"), "{e}");
        let e = target("http://127.0.0.1:7070/api")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("no path"), "{e}");
        assert!(sandbox_id("py-abc_1.2~").is_ok());
        let e = sandbox_id("a/../b").err().unwrap_or_default();
        assert!(e.contains("'a/../b'"), "{e}");
        assert!(positive_seconds("0").is_err());
        assert!(positive_seconds("nan").is_err());
        assert_eq!(positive_seconds("2.5"), Ok(2.5));
    }
}
