//! `corral events`: follows a service's lifecycle events (`GET
//! /v1/events`, server-sent events) and prints one line per event, or one
//! JSON object per line.
//!
//! Unlike the other subcommands it talks to a running `corral serve`, not
//! to the engine: the events are the service's (its runtime's window). The
//! service is `--url`, else `$CORRAL_URL`, else the config's
//! `server.unix_socket` (whose owner needs no token), else
//! `http://` + `server.listen`. The token is `--token`, else the config's
//! `server.admin_token` (the operator sees every tenant's events), else
//! `server.token` (`$CORRAL_TOKEN`), else, for a loopback URL, the token a
//! local service generated and wrote to its file in the runtime directory
//! (as the Python client finds it).

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::Args;
use corral::host::RealHost;
use corral_core::config::Config;
use futures_util::StreamExt;
use http_body_util::{BodyExt, Empty};
use hyper::header;
use hyper_util::rt::TokioIo;
use serde_json::Value;

use crate::diagnostics::{CliError, TokenSource};

/// The event kinds the service names (`corral::events::EventKind`).
const KINDS: [&str; 9] = [
    "created",
    "start_failed",
    "command",
    "reset",
    "snapshot",
    "lost",
    "recovered",
    "evicted",
    "removed",
];

/// Largest error body read from the service.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// Follow a service's sandbox lifecycle events.
///
/// Prints the events of `GET /v1/events` of a running `corral serve` as
/// they happen, one line each (id, time in UTC, kind, sandbox, outcome,
/// detail), or with --json the service's event objects one per line. Each
/// event has an increasing id: `--since ID` resumes after it (0: every
/// event the service still keeps, its last 10000). Without --since only
/// events from now on are shown. A `gap` (events lost to the window, or a
/// reader too slow) is reported on stderr.
///
/// The service is --url, else $CORRAL_URL, else the config's
/// `server.unix_socket`, else `server.listen`. The token is --token, else
/// the config's `server.admin_token` (the operator sees everyone's events),
/// else `server.token` ($CORRAL_TOKEN), else the token a local service
/// generated (its file in the runtime directory); over the Unix socket its
/// owner needs none. A tenant's token shows that tenant's sandboxes only.
#[derive(Args, Debug)]
pub struct EventsArgs {
    /// The service: http://HOST:PORT or unix:///PATH.
    #[arg(long, env = "CORRAL_URL", value_name = "URL")]
    url: Option<String>,

    /// Bearer token to send (see above for the default).
    #[arg(long, value_name = "TOKEN")]
    token: Option<String>,

    /// Resume after this event id (0: everything still kept).
    #[arg(long, value_name = "ID")]
    since: Option<u64>,

    /// Only events of this sandbox: its id in the API (the session key) or
    /// its runtime id (sb-...). Repeatable.
    #[arg(long, value_name = "ID")]
    sandbox: Vec<String>,

    /// Only events of this kind. Repeatable.
    #[arg(long, value_name = "KIND", value_parser = KINDS)]
    kind: Vec<String>,

    /// One JSON object per line (the API's EventBody) instead of text.
    #[arg(long)]
    json: bool,

    /// Exit after printing this many events (those passing the filters).
    #[arg(long, value_name = "N")]
    count: Option<u64>,
}

/// Where the service is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// TCP: host and port (the `Host` header), with a path prefix.
    Tcp {
        host: String,
        port: u16,
        prefix: String,
    },
    /// A Unix socket.
    Unix(String),
}

impl Target {
    fn parse(url: &str) -> anyhow::Result<Target> {
        if let Some(path) = url.strip_prefix("unix://") {
            if !path.starts_with('/') {
                bail!("--url '{url}': a Unix socket URL is unix:///ABSOLUTE/PATH");
            }
            return Ok(Target::Unix(path.to_string()));
        }
        let uri: hyper::Uri = url
            .parse()
            .with_context(|| format!("--url '{url}' is not a URL"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => bail!(
                "--url '{url}': https is not supported here; reach the service over http on \
                 loopback or its Unix socket"
            ),
            _ => bail!("--url '{url}': expected http://HOST:PORT or unix:///PATH"),
        }
        let host = uri
            .host()
            .with_context(|| format!("--url '{url}' names no host"))?
            .to_string();
        let port = uri.port_u16().unwrap_or(80);
        let prefix = uri.path().trim_end_matches('/').to_string();
        Ok(Target::Tcp { host, port, prefix })
    }

    fn path(&self, rest: &str) -> String {
        match self {
            Target::Tcp { prefix, .. } => format!("{prefix}{rest}"),
            Target::Unix(_) => rest.to_string(),
        }
    }

    fn host_header(&self) -> String {
        match self {
            Target::Tcp { host, port, .. } if host.contains(':') => format!("[{host}]:{port}"),
            Target::Tcp { host, port, .. } => format!("{host}:{port}"),
            Target::Unix(_) => "localhost".into(),
        }
    }
}

/// The service the config describes: its Unix socket, else its listen
/// address (an unspecified one reached on loopback).
fn default_url(config: &Config) -> String {
    if let Some(sock) = &config.server.unix_socket {
        return format!("unix://{sock}");
    }
    let listen = config.server.listen.trim();
    match listen.parse::<std::net::SocketAddr>() {
        Ok(a) if a.ip().is_unspecified() => format!("http://127.0.0.1:{}", a.port()),
        _ => format!("http://{listen}"),
    }
}

/// The token a local service generated for `target`, from its file in
/// `dir` (only files this user owns and others cannot write, as the Python
/// client reads them; never for a host that is not loopback).
fn discovered_token(dir: &Path, target: &Target) -> Option<(String, PathBuf)> {
    let Target::Tcp { host, port, .. } = target else {
        return None;
    };
    let ip = if host == "localhost" {
        std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
    } else {
        host.parse::<std::net::IpAddr>().ok()?
    };
    if !ip.is_loopback() {
        return None;
    }
    // This process's uid: the owner of its /proc entry.
    let me = std::fs::metadata("/proc/self").ok()?.uid();
    let mut best: Option<(u8, String, PathBuf)> = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with("server-") && name.ends_with(".json")) {
            continue;
        }
        let Ok(meta) = entry.metadata() else { continue };
        if meta.uid() != me || !meta.is_file() || meta.mode() & 0o022 != 0 {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        let (Some(token), Some(p), Some(listen)) = (
            v["token"].as_str().filter(|t| !t.is_empty()),
            v["port"].as_u64(),
            v["listen"].as_str(),
        ) else {
            continue;
        };
        if p != u64::from(*port) {
            continue;
        }
        let Ok(addr) = listen.parse::<std::net::SocketAddr>() else {
            continue;
        };
        let rank = if addr.ip() == ip {
            0
        } else if addr.ip().is_loopback() {
            1
        } else if addr.ip().is_unspecified() {
            2
        } else {
            continue;
        };
        if best.as_ref().is_none_or(|(r, _, _)| rank < *r) {
            best = Some((rank, token.to_string(), entry.path()));
        }
    }
    best.map(|(_, t, path)| (t, path))
}

/// The token to send, or `None` (the Unix socket's owner needs none), and
/// where it came from (for the help when it is refused).
fn token_for(args: &EventsArgs, config: &Config, target: &Target) -> (Option<String>, TokenSource) {
    if let Some(t) = &args.token {
        return (Some(t.clone()), TokenSource::Flag);
    }
    if matches!(target, Target::Unix(_)) {
        return (None, TokenSource::None);
    }
    if let Some(t) = &config.server.admin_token {
        return (Some(t.clone()), TokenSource::Config("server.admin_token"));
    }
    if let Some(t) = &config.server.token {
        // CORRAL_TOKEN overrides the file's server.token when set.
        let from_env = std::env::var("CORRAL_TOKEN").is_ok_and(|v| !v.is_empty());
        let source = if from_env {
            TokenSource::Env("CORRAL_TOKEN")
        } else {
            TokenSource::Config("server.token")
        };
        return (Some(t.clone()), source);
    }
    match discovered_token(&config.runtime_dir(&RealHost), target) {
        Some((t, path)) => (Some(t), TokenSource::File(path)),
        None => (None, TokenSource::None),
    }
}

/// Whether an event passes `--sandbox` and `--kind`.
fn wanted(args: &EventsArgs, v: &Value) -> bool {
    let kind_ok = args.kind.is_empty() || args.kind.iter().any(|k| v["kind"] == k.as_str());
    let sandbox_ok = args.sandbox.is_empty()
        || args
            .sandbox
            .iter()
            .any(|s| v["sandbox"] == s.as_str() || v["session"] == s.as_str());
    kind_ok && sandbox_ok
}

/// `HH:MM:SS.mmm` (UTC) of a time in ms since the epoch.
fn clock(time_ms: u64) -> String {
    let day_ms = time_ms % 86_400_000;
    let (h, m, s, ms) = (
        day_ms / 3_600_000,
        day_ms / 60_000 % 60,
        day_ms / 1000 % 60,
        day_ms % 1000,
    );
    format!("{h:02}:{m:02}:{s:02}.{ms:03}")
}

/// One event as a line: id, time, kind, the sandbox (its session key and
/// runtime id), outcome, detail.
fn line(v: &Value) -> String {
    let text = |k: &str| v[k].as_str().unwrap_or("").to_string();
    let sandbox = text("sandbox");
    let who = match v["session"].as_str() {
        Some(s) if !s.is_empty() => format!("{s} ({sandbox})"),
        _ => sandbox,
    };
    let mut out = format!(
        "{} {} {:<12} {}",
        v["id"].as_u64().unwrap_or(0),
        clock(v["time_ms"].as_u64().unwrap_or(0)),
        text("kind"),
        who
    );
    for part in [text("outcome"), text("detail")] {
        if !part.is_empty() {
            out.push(' ');
            out.push_str(&part);
        }
    }
    // One line per event, whatever a detail holds.
    out.replace(['\n', '\r'], " ")
}

/// Opens an HTTP/1.1 connection to the service.
async fn connect(
    target: &Target,
) -> anyhow::Result<hyper::client::conn::http1::SendRequest<Empty<Bytes>>> {
    // The connection's task runs until the response body is read or the
    // process exits.
    match target {
        Target::Tcp { host, port, .. } => {
            let stream = tokio::net::TcpStream::connect((host.as_str(), *port))
                .await
                .map_err(|e| CliError::ServiceUnreachable {
                    url: format!("{host}:{port}"),
                    reason: e.to_string(),
                })?;
            let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .context("HTTP handshake with the service")?;
            tokio::spawn(conn);
            Ok(send)
        }
        Target::Unix(path) => {
            let stream = tokio::net::UnixStream::connect(path).await.map_err(|e| {
                CliError::ServiceUnreachable {
                    url: format!("unix://{path}"),
                    reason: e.to_string(),
                }
            })?;
            let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .context("HTTP handshake with the service")?;
            tokio::spawn(conn);
            Ok(send)
        }
    }
}

/// Runs `corral events`.
pub async fn run(config: &Config, args: EventsArgs) -> anyhow::Result<ExitCode> {
    let url = args.url.clone().unwrap_or_else(|| default_url(config));
    let target = Target::parse(&url)?;
    let (token, token_source) = token_for(&args, config, &target);
    let query = match args.since {
        Some(id) => format!("/v1/events?after={id}"),
        None => "/v1/events".to_string(),
    };
    let mut req = hyper::Request::get(target.path(&query))
        .header(header::HOST, target.host_header())
        .header(header::ACCEPT, "text/event-stream");
    if let Some(t) = &token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let req = req
        .body(Empty::<Bytes>::new())
        .context("building the request")?;
    let mut send = connect(&target).await?;
    let resp = send
        .send_request(req)
        .await
        .with_context(|| format!("GET /v1/events from {url}"))?;
    let status = resp.status();
    if !status.is_success() {
        let mut body = Vec::new();
        let mut stream = resp.into_body().into_data_stream();
        while let Some(Ok(chunk)) = stream.next().await {
            body.extend_from_slice(&chunk);
            if body.len() >= MAX_ERROR_BODY {
                break;
            }
        }
        let message = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(String::from))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).trim().to_string());
        return Err(CliError::ServiceRefused {
            url,
            status: status.as_u16(),
            message,
            token: token_source,
        }
        .into());
    }
    let mut events = sse_stream::SseStream::new(resp.into_body());
    let mut printed = 0u64;
    let stdout = std::io::stdout();
    while let Some(item) = events.next().await {
        let sse = match item {
            Ok(sse) => sse,
            Err(e) => bail!("reading events from {url}: {e}"),
        };
        let data = sse.data.unwrap_or_default();
        match sse.event.as_deref() {
            Some("gap") => {
                eprintln!("corral events: gap: {data}");
                continue;
            }
            Some("error") => {
                eprintln!("corral events: the service could not encode an event: {data}");
                continue;
            }
            _ => {}
        }
        let Ok(v) = serde_json::from_str::<Value>(&data) else {
            eprintln!("corral events: not an event: {data}");
            continue;
        };
        if !wanted(&args, &v) {
            continue;
        }
        let text = if args.json { v.to_string() } else { line(&v) };
        let mut out = stdout.lock();
        // A closed stdout (`| head`) ends the command quietly.
        if writeln!(out, "{text}").and_then(|()| out.flush()).is_err() {
            return Ok(ExitCode::SUCCESS);
        }
        printed += 1;
        if args.count.is_some_and(|n| printed >= n) {
            return Ok(ExitCode::SUCCESS);
        }
    }
    eprintln!("corral events: the service ended the stream");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        args: EventsArgs,
    }

    fn args(argv: &[&str]) -> EventsArgs {
        T::try_parse_from(std::iter::once("events").chain(argv.iter().copied()))
            .expect("parses")
            .args
    }

    #[test]
    fn urls_and_their_host_headers() {
        let t = Target::parse("http://127.0.0.1:7070").expect("url");
        assert_eq!(t.host_header(), "127.0.0.1:7070");
        assert_eq!(t.path("/v1/events"), "/v1/events");
        let t = Target::parse("http://corral.internal:80/api/").expect("url");
        assert_eq!(t.path("/v1/events"), "/api/v1/events");
        assert_eq!(
            Target::parse("unix:///run/c.sock").expect("url"),
            Target::Unix("/run/c.sock".into())
        );
        for bad in ["unix://rel.sock", "https://x:1", "ftp://x", "::"] {
            let e = Target::parse(bad).expect_err(bad).to_string();
            assert!(e.contains(bad), "{e}");
        }
    }

    #[test]
    fn the_config_names_the_default_service() {
        let mut c = Config::default();
        assert_eq!(default_url(&c), "http://127.0.0.1:7070");
        c.server.listen = "0.0.0.0:9000".into();
        assert_eq!(default_url(&c), "http://127.0.0.1:9000");
        c.server.unix_socket = Some("/run/corral.sock".into());
        assert_eq!(default_url(&c), "unix:///run/corral.sock");
    }

    #[test]
    fn filters_match_a_session_key_or_a_runtime_id_and_kinds() {
        let v = serde_json::json!({"id": 3, "kind": "command", "sandbox": "sb-1", "session": "ep"});
        assert!(wanted(&args(&[]), &v));
        assert!(wanted(&args(&["--sandbox", "ep"]), &v));
        assert!(wanted(
            &args(&["--sandbox", "sb-1", "--kind", "command"]),
            &v
        ));
        assert!(!wanted(&args(&["--sandbox", "other"]), &v));
        assert!(!wanted(
            &args(&["--kind", "reset", "--kind", "removed"]),
            &v
        ));
        assert!(T::try_parse_from(["events", "--kind", "nope"]).is_err());
    }

    #[test]
    fn a_line_per_event() {
        let v = serde_json::json!({"id": 42, "time_ms": 3_723_004u64, "kind": "command",
            "sandbox": "sb-1", "session": "ep", "outcome": "exit", "detail": "exit 3\nin 2 ms"});
        assert_eq!(
            line(&v),
            "42 01:02:03.004 command      ep (sb-1) exit exit 3 in 2 ms"
        );
        let v = serde_json::json!({"id": 1, "time_ms": 0, "kind": "created", "sandbox": "sb-2",
            "session": null, "outcome": null, "detail": ""});
        assert_eq!(line(&v), "1 00:00:00.000 created      sb-2");
    }

    #[test]
    fn only_this_users_private_token_files_for_loopback() {
        let dir = std::env::temp_dir().join(format!("corral-events-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let write = |name: &str, listen: &str, port: u16, token: &str, mode: u32| {
            use std::os::unix::fs::PermissionsExt;
            let p = dir.join(name);
            std::fs::write(
                &p,
                serde_json::json!({"listen": listen, "port": port, "token": token}).to_string(),
            )
            .expect("write");
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
        };
        write(
            "server-0.0.0.0-7070.json",
            "0.0.0.0:7070",
            7070,
            "any",
            0o600,
        );
        write(
            "server-127.0.0.1-7070.json",
            "127.0.0.1:7070",
            7070,
            "exact",
            0o600,
        );
        write(
            "server-127.0.0.1-7071.json",
            "127.0.0.1:7071",
            7071,
            "writable",
            0o622,
        );
        let at = |url: &str| {
            discovered_token(&dir, &Target::parse(url).expect("url")).map(|(token, _)| token)
        };
        assert_eq!(at("http://127.0.0.1:7070").as_deref(), Some("exact"));
        assert_eq!(at("http://localhost:7070").as_deref(), Some("exact"));
        assert_eq!(at("http://127.0.0.1:7071"), None, "others may write it");
        assert_eq!(at("http://10.0.0.1:7070"), None, "not loopback");
        assert_eq!(at("http://127.0.0.1:7072"), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
