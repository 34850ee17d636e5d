//! E2B's control plane (REST, `X-API-KEY`): create, list, describe, kill,
//! set the timeout of, and connect to sandboxes. Create goes through
//! [`AppState::create`] (client policy, tenant quota, provider), every
//! other call through [`AppState::lease`], [`AppState::observed`] or
//! [`AppState::release`] as the key's principal, so one tenant's key
//! neither sees nor touches another's sandboxes (they are answered as
//! absent, 404). Listing and describing observe: they are not activity for
//! the service's idle timeout (`provider.idle_timeout_ms`), so a monitor
//! polling `Sandbox.list` or `get_info` keeps no abandoned sandbox alive.
//!
//! Errors are E2B's `{"code": STATUS, "message": ...}`, naming the field.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Json;
use corral_core::principal::Principal;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{check_origin, lock, principal_of_key, E2b, Entry, ENVD_VERSION};
use crate::api::Observed;
use crate::error::ApiError;
use crate::wire::CreateSandbox;

/// E2B's default template: the service's default image.
const DEFAULT_TEMPLATE: &str = "base";

/// E2B's default sandbox lifetime, in seconds.
const DEFAULT_TIMEOUT_S: u64 = 300;

/// The longest lifetime a sandbox may be given (E2B's own maximum, 24 h).
const MAX_TIMEOUT_S: u64 = 24 * 3600;

pub(super) fn routes() -> axum::Router<E2b> {
    axum::Router::new()
        .route("/sandboxes", post(create).get(list))
        .route("/v2/sandboxes", post(create).get(list))
        .route("/sandboxes/{id}", get(detail).delete(kill))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/resume", post(resume))
        .route("/sandboxes/{id}/metrics", get(metrics))
        .route("/sandboxes/{id}/refreshes", post(refresh))
        .route("/sandboxes/{id}/network", put(update_network))
        .merge(super::snapshots::routes())
        .merge(super::templates::routes())
}

/// An E2B API error: `{"code": STATUS, "message": ...}`.
#[derive(Debug)]
pub(super) struct E2bError {
    status: StatusCode,
    message: String,
    retry_after: Option<u64>,
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let mut r = (
            self.status,
            Json(json!({"code": self.status.as_u16(), "message": self.message})),
        )
            .into_response();
        if let Some(secs) = self.retry_after {
            if let Ok(v) = secs.to_string().parse() {
                r.headers_mut().insert("retry-after", v);
            }
        }
        r
    }
}

impl E2bError {
    /// What it says.
    pub(super) fn message(&self) -> &str {
        &self.message
    }
}

/// An E2B API error of `status`.
pub(super) fn error(status: StatusCode, message: impl Into<String>) -> E2bError {
    E2bError {
        status,
        message: message.into(),
        retry_after: None,
    }
}

pub(super) fn api_error(e: ApiError) -> E2bError {
    let message = match &e.detail.field {
        Some(f) if !e.detail.message.contains(f.as_str()) => format!("{f}: {}", e.detail.message),
        _ => e.detail.message.clone(),
    };
    E2bError {
        status: e.status,
        message,
        retry_after: e.retry_after,
    }
}

pub(super) fn not_found(id: &str) -> E2bError {
    error(StatusCode::NOT_FOUND, format!("sandbox '{id}' not found"))
}

/// The caller of a control-plane request.
pub(super) fn caller(e2b: &E2b, headers: &HeaderMap) -> Result<Principal, E2bError> {
    let server = &e2b.app.config().server;
    check_origin(server, headers)?;
    principal_of_key(server, headers)
}

/// A JSON body, naming the field at fault; an empty body is `{}`.
pub(super) fn body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, E2bError> {
    let text: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        bytes
    };
    let de = &mut serde_json::Deserializer::from_slice(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            format!("invalid request body at '{}': {}", e.path(), e.inner()),
        )
    })
}

/// `POST /sandboxes` and `/v2/sandboxes` (E2B's NewSandbox). Fields this
/// service cannot honour are refused by name rather than ignored.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    timeout: Option<u64>,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    #[serde(default)]
    env_vars: BTreeMap<String, String>,
    #[serde(default)]
    auto_pause: bool,
    auto_pause_memory: Option<bool>,
    auto_resume: Option<Value>,
    #[serde(rename = "allow_internet_access", alias = "allowInternetAccess")]
    allow_internet_access: Option<bool>,
    mcp: Option<Value>,
    network: Option<Value>,
    #[serde(default)]
    volume_mounts: Vec<Value>,
}

pub(super) fn lifetime(field: &str, timeout: Option<u64>) -> Result<Duration, E2bError> {
    match timeout.unwrap_or(DEFAULT_TIMEOUT_S) {
        0 => Err(error(
            StatusCode::BAD_REQUEST,
            format!("{field} 0 must be at least 1 second"),
        )),
        t if t > MAX_TIMEOUT_S => Err(error(
            StatusCode::BAD_REQUEST,
            format!("{field} {t} is above the maximum of {MAX_TIMEOUT_S} seconds"),
        )),
        t => Ok(Duration::from_secs(t)),
    }
}

/// E2B's `network` options (`SandboxNetworkConfig`); anything else in it
/// is refused by name.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NetworkOpts {
    allow_out: Option<Vec<String>>,
    deny_out: Option<Vec<String>>,
    allow_public_traffic: Option<bool>,
    mask_request_host: Option<Value>,
    dns_servers: Option<Value>,
    egress_proxy: Option<Value>,
    https_ports: Option<Value>,
    rules: Option<Value>,
}

/// E2B's "all traffic" (`ctx.all_traffic`).
const ALL_TRAFFIC: &str = "0.0.0.0/0";

/// What E2B's `allow_internet_access` and `network` ask, as corral's: the
/// spec's `network` (`None`: the service's own), and whether the
/// sandbox's ports are public (`allowPublicTraffic`, E2B's default true;
/// false: `get_host` URLs need the traffic access token).
///
/// Internet access off (`allow_internet_access: false`, or `denyOut`
/// naming all traffic) with no `allowOut` is `network: none`; with
/// `allowOut` an egress allow-list of it, the rest of `denyOut` its deny
/// list (which wins in corral where `allowOut` wins in E2B: a name that
/// both allow is refused, never the other way round). The result goes
/// through `server.policy` as a REST create's `spec.network` does.
fn network_of(req: &NewSandbox) -> Result<(Option<Value>, bool), E2bError> {
    let bad = |message: String| Err(error(StatusCode::BAD_REQUEST, message));
    let opts: NetworkOpts = match &req.network {
        None | Some(Value::Null) => NetworkOpts::default(),
        Some(v) => match serde_path_to_error::deserialize(v.clone()) {
            Ok(o) => o,
            Err(e) => {
                return bad(format!(
                    "network.{}: {} (corral maps allowOut, denyOut and allowPublicTraffic)",
                    e.path(),
                    e.inner()
                ))
            }
        },
    };
    let unmapped = [
        (
            "maskRequestHost",
            opts.mask_request_host.is_some(),
            "requests reach a sandbox's port with Host localhost:PORT",
        ),
        (
            "dnsServers",
            opts.dns_servers.is_some(),
            "an allowed name is resolved by the sandbox's egress gateway",
        ),
        (
            "egressProxy",
            opts.egress_proxy.is_some(),
            "egress leaves through the sandbox's own gateway",
        ),
        (
            "httpsPorts",
            opts.https_ports.is_some(),
            "TLS is routed by SNI on any allowed port (name:PORT in allowOut)",
        ),
        (
            "rules",
            opts.rules.is_some(),
            "egress is relayed, never rewritten",
        ),
    ];
    for (field, given, why) in unmapped {
        if given {
            return bad(format!("network.{field} is not supported by corral: {why}"));
        }
    }
    let deny = opts.deny_out.unwrap_or_default();
    let allow = opts.allow_out.unwrap_or_default();
    let deny_all =
        req.allow_internet_access == Some(false) || deny.iter().any(|d| d == ALL_TRAFFIC);
    let deny: Vec<String> = deny.into_iter().filter(|d| d != ALL_TRAFFIC).collect();
    if let Some(i) = allow.iter().position(|a| a == ALL_TRAFFIC) {
        return bad(format!(
            "network.allowOut[{i}] '{ALL_TRAFFIC}' is not supported by corral: its egress is an \
             allow-list of names and networks; leave allow_internet_access and denyOut out to \
             keep the service's network"
        ));
    }
    let public = opts.allow_public_traffic.unwrap_or(true);
    let network = match (deny_all, allow.is_empty()) {
        (true, true) => Some(json!("none")),
        (true, false) => Some(json!({"egress": {"allow": allow, "deny": deny}})),
        (false, _) if !deny.is_empty() => {
            return bad(format!(
                "network.denyOut {deny:?} without '{ALL_TRAFFIC}' is not supported by corral: its \
                 egress is an allow-list; deny all traffic (denyOut ['{ALL_TRAFFIC}'] or \
                 allow_internet_access=False) and list what is allowed in allowOut"
            ))
        }
        // Without a denial E2B allows everything: allowOut changes nothing.
        (false, _) => None,
    };
    Ok((network, public))
}

fn refuse_unsupported(req: &NewSandbox) -> Result<(), E2bError> {
    let refuse = |field: &str, why: &str| {
        Err(error(
            StatusCode::BAD_REQUEST,
            format!("{field} is not supported by corral: {why}"),
        ))
    };
    if req.auto_pause && req.auto_pause_memory == Some(false) {
        return refuse(
            "autoPauseMemory false",
            "corral's pause freezes the sandbox with its memory",
        );
    }
    let resume_enabled = match &req.auto_resume {
        None | Some(Value::Null) => false,
        Some(v) => v.get("enabled").and_then(Value::as_bool).unwrap_or(true),
    };
    if resume_enabled {
        return refuse(
            "autoResume",
            "a paused sandbox resumes on Sandbox.connect (or resume), not on traffic",
        );
    }
    if req.mcp.as_ref().is_some_and(|v| !v.is_null()) {
        return refuse("mcp", "E2B's MCP gateway is not part of corral");
    }
    if !req.volume_mounts.is_empty() {
        return refuse("volumeMounts", "E2B volumes are not part of corral");
    }
    Ok(())
}

async fn create(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    bytes: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let owner = caller(&e2b, &headers)?;
    let req: NewSandbox = body(&bytes)?;
    refuse_unsupported(&req)?;
    let (network, public) = network_of(&req)?;
    let life = lifetime("timeout", req.timeout)?;
    if req.template_id.trim().is_empty() {
        return Err(error(StatusCode::BAD_REQUEST, "templateID '' is empty"));
    }
    let id = super::new_sandbox_id();
    // A template built here (`name`, `name:tag`, `name:BUILD`) first.
    let built = match e2b.templates.resolve(&owner, &req.template_id) {
        Some(r) => Some(r?),
        None => None,
    };
    let code_interpreter = match built {
        Some(_) => None,
        None => super::code::template_profile(e2b.app.config(), &req.template_id)?,
    };
    let create = CreateSandbox {
        session: Some(id.clone()),
        image: (req.template_id != DEFAULT_TEMPLATE
            && code_interpreter.is_none()
            && built.is_none())
        .then(|| req.template_id.clone()),
        profile: code_interpreter.clone(),
        spec: network.clone().map(|n| json!({"network": n})),
        template: built.clone(),
        ..CreateSandbox::default()
    };
    // A template naming one of the caller's snapshots (or a shared one)
    // starts a fork of it; anything else is an image.
    let forked = if req.template_id != DEFAULT_TEMPLATE
        && code_interpreter.is_none()
        && built.is_none()
        && !req.template_id.contains([':', '@'])
    {
        match e2b
            .app
            .fork_as(
                &owner,
                &req.template_id,
                std::slice::from_ref(&id),
                &req.env_vars,
            )
            .await
        {
            Ok(mut made) => made.pop(),
            Err(e) if matches!(e.status.as_u16(), 400 | 404) => None,
            Err(e) => return Err(api_error(e)),
        }
    } else {
        None
    };
    let was_forked = forked.is_some();
    let created = match forked {
        Some(info) => Ok((StatusCode::CREATED, info)),
        None => e2b.app.create(&owner, &create).await,
    };
    if created.is_ok() && was_forked && network.is_some() {
        // A fork keeps its snapshot's network: refused rather than ignored.
        if let Err(e) = e2b.app.release(&owner, &id).await {
            tracing::warn!(sandbox = %id, error = %e.detail.message, "cannot release a refused fork");
        }
        return Err(error(
            StatusCode::BAD_REQUEST,
            format!(
                "network / allow_internet_access with templateID '{}' (a snapshot) is not \
                 supported by corral: a fork keeps its snapshot's network",
                req.template_id
            ),
        ));
    }
    let info = match created {
        Ok((_, info)) => info,
        Err(mut e) => {
            // The template is what an E2B caller named as the image.
            if e.detail.field.as_deref() == Some("image") {
                e.detail.field = Some("templateID".into());
                e.detail.message = e.detail.message.replace("image '", "templateID '");
            }
            return Err(api_error(e));
        }
    };
    let entry = register(
        &e2b,
        Registered {
            id,
            owner,
            template: req.template_id.clone(),
            metadata: req.metadata,
            envs: req.env_vars,
            public,
            auto_pause: req.auto_pause,
        },
        &headers,
        life,
    );
    let mut answer = sandbox_json(&entry);
    // corral's own, beside E2B's fields (its SDK keeps unknown ones):
    // whether results are what commands did, and why not (the tier).
    answer["resultIntegrity"] = json!(info.result_integrity);
    if let Some(gap) = info.result_integrity_gap {
        answer["resultIntegrityGap"] = json!(gap);
    }
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

/// What a sandbox started through this front end is registered with.
pub(super) struct Registered {
    pub(super) id: String,
    pub(super) owner: Principal,
    pub(super) template: String,
    pub(super) metadata: BTreeMap<String, String>,
    pub(super) envs: BTreeMap<String, String>,
    pub(super) public: bool,
    pub(super) auto_pause: bool,
}

/// Registers a sandbox just started (by a create or a fork) under its E2B
/// id, with a fresh envd access token and its lifetime timer armed.
pub(super) fn register(
    e2b: &E2b,
    r: Registered,
    headers: &HeaderMap,
    life: Duration,
) -> Arc<Entry> {
    let now = SystemTime::now();
    let entry = Arc::new(Entry {
        id: r.id.clone(),
        owner: r.owner,
        template: r.template,
        token: corral::host::random_hex(48),
        traffic: corral::host::random_hex(48),
        metadata: r.metadata,
        domain: headers
            .get("host")
            .and_then(|h| h.to_str().ok())
            .map(str::to_string),
        envs: r.envs,
        started_at: now,
        end: Mutex::new((now + life, None)),
        procs: Default::default(),
        public: r.public,
        auto_pause: r.auto_pause,
        paused: Default::default(),
        watchers: Default::default(),
    });
    e2b.registry().insert(r.id, entry.clone());
    e2b.note(&entry);
    e2b.arm_timer(&entry, now + life);
    entry
}

/// E2B's `Sandbox`: what create and connect answer.
pub(super) fn sandbox_json(e: &Entry) -> Value {
    json!({
        "templateID": e.template,
        "sandboxID": e.id,
        "clientID": "corral",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": e.token,
        // A secret of its own, for viewers of a private port (the relay)
        // and the code interpreter's context calls, which E2B's SDK sends
        // with it alone: it never opens a command or a file.
        "trafficAccessToken": e.traffic,
        // `get_host(port)` is PORT-ID.DOMAIN: this listener, which relays
        // such a Host to that port of the sandbox.
        "domain": e.domain,
    })
}

/// E2B's `ListedSandbox` / `SandboxDetail` of a live sandbox.
fn detail_json(e: &Entry, sandbox: &corral::Sandbox, with_token: bool) -> Value {
    let limits = &sandbox.spec().limits;
    let end = lock(&e.end).0;
    let mut v = json!({
        "templateID": e.template,
        "sandboxID": e.id,
        "clientID": "corral",
        "startedAt": rfc3339(e.started_at),
        "endAt": rfc3339(end),
        "cpuCount": limits.cpus.map_or(0, |c| c.ceil() as u64),
        "memoryMB": limits.memory.map_or(0, |m| m >> 20),
        "diskSizeMB": limits.disk.map_or(0, |d| d >> 20),
        "state": if e.is_paused() { "paused" } else { "running" },
        "envdVersion": ENVD_VERSION,
        "metadata": e.metadata,
    });
    if with_token {
        v["envdAccessToken"] = json!(e.token);
        v["domain"] = json!(e.domain);
    }
    v
}

/// The entry `id` as `caller` may see it, with its sandbox looked at, not
/// used ([`AppState::observed`]: no activity for the idle timeout): 404 for
/// another principal's, as [`visible`].
fn observed(
    e2b: &E2b,
    caller: &Principal,
    id: &str,
) -> Result<(Arc<Entry>, corral::Sandbox), E2bError> {
    let Some(entry) = e2b.entry(id) else {
        return Err(not_found(id));
    };
    if !caller.may_session(&entry.owner) {
        return Err(not_found(id));
    }
    match e2b.app.observed(&entry.owner, id) {
        Ok(Observed::Live(sandbox)) => Ok((entry, sandbox)),
        Ok(Observed::Lost(f)) => Err(api_error(ApiError::failure(&f))),
        Err(e) if e.status == StatusCode::NOT_FOUND => {
            e2b.forget(id);
            Err(not_found(id))
        }
        Err(e) => Err(api_error(e)),
    }
}

/// The entry `id` as `caller` may see it, with its lease: 404 for another
/// principal's (the one ownership check, [`AppState::lease`]).
async fn visible(
    e2b: &E2b,
    caller: &Principal,
    id: &str,
) -> Result<(Arc<Entry>, corral::Lease), E2bError> {
    let Some(entry) = e2b.entry(id) else {
        return Err(not_found(id));
    };
    if !caller.may_session(&entry.owner) {
        return Err(not_found(id));
    }
    match e2b.app.lease(&entry.owner, id).await {
        Ok(lease) => Ok((entry, lease)),
        Err(e) if e.status == StatusCode::NOT_FOUND => {
            e2b.forget(id);
            Err(not_found(id))
        }
        Err(e) => Err(api_error(e)),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListQuery {
    metadata: Option<String>,
    state: Option<String>,
    limit: Option<String>,
    next_token: Option<String>,
    order: Option<String>,
    started_after: Option<String>,
    template: Option<String>,
}

/// The most sandboxes one page lists (E2B's own bound; its default is 100).
const MAX_PAGE: usize = 100;

/// A listing's sort key: start time (nanoseconds since the epoch), then id.
type ListKey = (u128, String);

fn list_key(e: &Entry) -> ListKey {
    let nanos = e
        .started_at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    (nanos, e.id.clone())
}

/// `nextToken`: the key of the last sandbox of the page before.
fn page_token(key: &ListKey) -> String {
    format!("{}.{}", key.0, key.1)
}

fn parse_page_token(token: &str) -> Result<ListKey, E2bError> {
    token
        .split_once('.')
        .and_then(|(n, id)| Some((n.parse().ok()?, id.to_string())))
        .filter(|(_, id)| !id.is_empty())
        .ok_or_else(|| {
            error(
                StatusCode::BAD_REQUEST,
                format!("nextToken: '{token}' is not a token this service gave"),
            )
        })
}

/// What `limit`, `order` and `startedAfter` ask of a listing, checked.
struct Page {
    limit: usize,
    ascending: bool,
    after: Option<ListKey>,
    started_after: Option<u64>,
}

fn page(q: &ListQuery) -> Result<Page, E2bError> {
    let bad = |field: &str, v: &str, why: &str| {
        error(StatusCode::BAD_REQUEST, format!("{field}: '{v}' {why}"))
    };
    let limit = match q.limit.as_deref() {
        None => MAX_PAGE,
        Some(v) => match v.trim().parse::<usize>() {
            Ok(n) if (1..=MAX_PAGE).contains(&n) => n,
            _ => return Err(bad("limit", v, "is not a number from 1 to 100")),
        },
    };
    let ascending = match q.order.as_deref().map(str::trim) {
        None | Some("desc") => false,
        Some("asc") => true,
        Some(v) => return Err(bad("order", v, "is neither 'asc' nor 'desc'")),
    };
    let after = q.next_token.as_deref().map(parse_page_token).transpose()?;
    let started_after = match q.started_after.as_deref() {
        None => None,
        Some(v) => {
            let t = chrono::DateTime::parse_from_rfc3339(v.trim())
                .map_err(|e| bad("startedAfter", v, &format!("is not an RFC 3339 time: {e}")))?;
            Some(u64::try_from(t.timestamp()).unwrap_or(0))
        }
    };
    Ok(Page {
        limit,
        ascending,
        after,
        started_after,
    })
}

async fn list(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, E2bError> {
    let caller = caller(&e2b, &headers)?;
    let Query(q) = match query {
        Ok(q) => q,
        Err(e) => {
            return Err(error(
                StatusCode::BAD_REQUEST,
                format!("query: {}", e.body_text()),
            ))
        }
    };
    let wanted: Vec<(String, String)> = q
        .metadata
        .as_deref()
        .map(|m| {
            // The SDK quotes keys and values, then encodes the pairs: two
            // decodings.
            serde_urlencoded::from_str::<Vec<(String, String)>>(m)
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (unquote(&k), unquote(&v)))
                .collect()
        })
        .unwrap_or_default();
    let states: Vec<&str> = q
        .state
        .as_deref()
        .map(|s| s.split(',').map(str::trim).collect())
        .unwrap_or_else(|| vec!["running", "paused"]);
    let page = page(&q)?;
    // startedAt is shown to the second: a sandbox started within the
    // second `startedAfter` names is after it, as the SDK's own value of
    // that sandbox's startedAt asks.
    let started = |e: &Entry| {
        e.started_at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    };
    let mut entries: Vec<Arc<Entry>> = e2b
        .registry()
        .values()
        .filter(|e| caller.may_session(&e.owner))
        .filter(|e| wanted.iter().all(|(k, v)| e.metadata.get(k) == Some(v)))
        .filter(|e| states.contains(&if e.is_paused() { "paused" } else { "running" }))
        .filter(|e| q.template.as_ref().is_none_or(|t| &e.template == t))
        .filter(|e| page.started_after.is_none_or(|after| started(e) >= after))
        .cloned()
        .collect();
    // Newest first unless `order=asc`, as E2B lists.
    entries.sort_by_key(|e| list_key(e));
    if !page.ascending {
        entries.reverse();
    }
    if let Some(after) = &page.after {
        entries.retain(|e| {
            let key = list_key(e);
            if page.ascending {
                key > *after
            } else {
                key < *after
            }
        });
    }
    let mut out = Vec::new();
    let mut last = None;
    let mut more = false;
    for entry in entries {
        if out.len() == page.limit {
            more = true;
            break;
        }
        if let Ok((entry, sandbox)) = observed(&e2b, &caller, &entry.id) {
            out.push(detail_json(&entry, &sandbox, false));
            last = Some(list_key(&entry));
        }
    }
    let mut response = Json(out).into_response();
    if let (true, Some(key)) = (more, last) {
        if let Ok(v) = page_token(&key).parse() {
            response.headers_mut().insert("x-next-token", v);
        }
    }
    Ok(response)
}

async fn detail(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, E2bError> {
    let caller = caller(&e2b, &headers)?;
    let (entry, sandbox) = observed(&e2b, &caller, &id)?;
    Ok(Json(detail_json(&entry, &sandbox, true)).into_response())
}

async fn kill(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, E2bError> {
    let caller = caller(&e2b, &headers)?;
    let Some(entry) = e2b.entry(&id).filter(|e| caller.may_session(&e.owner)) else {
        return Err(not_found(&id));
    };
    e2b.forget(&id);
    if entry.is_paused() {
        // A frozen sandbox is thawed so that its removal runs as any other.
        if let Ok(lease) = e2b.app.lease(&entry.owner, &id).await {
            let _ = lease.resume().await;
        }
    }
    let released = e2b.app.release(&entry.owner, &id).await;
    e2b.sweep_fork_bases().await;
    match released {
        Ok(()) => Ok(StatusCode::NO_CONTENT.into_response()),
        Err(e) if e.status == StatusCode::NOT_FOUND => Err(not_found(&id)),
        Err(e) => Err(api_error(e)),
    }
}

#[derive(Deserialize)]
struct TimeoutBody {
    timeout: Option<u64>,
}

async fn set_timeout(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let caller = caller(&e2b, &headers)?;
    let req: TimeoutBody = body(&bytes)?;
    if req.timeout.is_none() {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "timeout is required (seconds)",
        ));
    }
    // 0 is E2B's "time out now": the sandbox is released (or paused,
    // with autoPause) at once, as when its timeout passes.
    let life = match req.timeout {
        Some(0) => Duration::ZERO,
        t => lifetime("timeout", t)?,
    };
    match visible(&e2b, &caller, &id).await {
        Ok((entry, _)) => {
            e2b.arm_timer(&entry, SystemTime::now() + life);
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        Err(r) => Err(r),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RefreshBody {
    duration: Option<u64>,
}

/// E2B's keep-alive: the sandbox lives at least `duration` seconds more
/// (never shortened, as `connect`'s timeout).
async fn refresh(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let caller = caller(&e2b, &headers)?;
    let req: RefreshBody = body(&bytes)?;
    let life = lifetime("duration", req.duration)?;
    let (entry, _) = visible(&e2b, &caller, &id).await?;
    // A paused sandbox has no timer to extend (resuming starts one).
    if !entry.is_paused() {
        e2b.extend_timer(&entry, life);
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Changing a running sandbox's network (`sandbox.update_network`):
/// corral sets egress when a sandbox is created; refused by name (after
/// the same visibility check as every call on a sandbox).
async fn update_network(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, E2bError> {
    let caller = caller(&e2b, &headers)?;
    visible(&e2b, &caller, &id).await?;
    Err(error(
        StatusCode::NOT_IMPLEMENTED,
        "network: changing a running sandbox's network is not supported by corral; \
         set network (allow_out, deny_out) or allow_internet_access when creating it",
    ))
}

/// Connect to a running sandbox: its envd token, and with `timeout` a new
/// lifetime (E2B extends it; it never shortens it here either).
async fn connect(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let caller = caller(&e2b, &headers)?;
    let req: TimeoutBody = body(&bytes)?;
    let (entry, lease) = visible(&e2b, &caller, &id).await?;
    if entry.is_paused() {
        // E2B's connect resumes a paused sandbox.
        return resume_entry(&e2b, &entry, &lease, req.timeout, StatusCode::CREATED).await;
    }
    if req.timeout.is_some() {
        e2b.extend_timer(&entry, lifetime("timeout", req.timeout)?);
    }
    Ok((StatusCode::OK, Json(sandbox_json(&entry))).into_response())
}

/// E2B's `SandboxPauseRequest`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PauseRequest {
    memory: Option<bool>,
}

async fn pause(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let caller = caller(&e2b, &headers)?;
    let req: PauseRequest = body(&bytes)?;
    let (entry, lease) = visible(&e2b, &caller, &id).await?;
    if req.memory == Some(false) {
        // Accepting it would keep the memory all the same: say so instead.
        return Err(error(
            StatusCode::NOT_IMPLEMENTED,
            format!(
                "memory: false (a file-system-only pause, keep_memory=False) is not supported: \
                 corral's pause freezes the sandbox with its memory; sandbox '{id}' keeps running"
            ),
        ));
    }
    if entry.is_paused() {
        return Err(error(
            StatusCode::CONFLICT,
            format!("sandbox '{id}' is already paused"),
        ));
    }
    match lease.pause().await {
        Ok(()) => {
            entry
                .paused
                .store(true, std::sync::atomic::Ordering::Release);
            e2b.disarm_timer(&entry);
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        Err(corral::Error::Unsupported { what }) => Err(error(
            StatusCode::NOT_IMPLEMENTED,
            format!("pause is not supported here: {what}; the sandbox '{id}' keeps running"),
        )),
        Err(e) => Err(api_error(ApiError::runtime(&e, ""))),
    }
}

async fn resume(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let caller = caller(&e2b, &headers)?;
    let req: TimeoutBody = body(&bytes)?;
    let (entry, lease) = visible(&e2b, &caller, &id).await?;
    if !entry.is_paused() {
        return Err(error(
            StatusCode::CONFLICT,
            format!("sandbox '{id}' is not paused"),
        ));
    }
    resume_entry(&e2b, &entry, &lease, req.timeout, StatusCode::CREATED).await
}

/// Thaws a paused sandbox and starts its lifetime again (`timeout`, else
/// E2B's default).
async fn resume_entry(
    e2b: &E2b,
    entry: &Arc<Entry>,
    lease: &corral::Lease,
    timeout: Option<u64>,
    status: StatusCode,
) -> Result<Response, E2bError> {
    let life = lifetime("timeout", timeout)?;
    if let Err(e) = lease.resume().await {
        return Err(api_error(ApiError::runtime(&e, "")));
    }
    entry
        .paused
        .store(false, std::sync::atomic::Ordering::Release);
    e2b.arm_timer(entry, SystemTime::now() + life);
    Ok((status, Json(sandbox_json(entry))).into_response())
}

#[derive(Deserialize)]
struct MetricsQuery {
    start: Option<String>,
    end: Option<String>,
}

/// `get_metrics`: E2B keeps a series sampled every few seconds; corral
/// reads the sandbox's usage now ([`corral::Sandbox::usage`], as `GET
/// /v1/sandboxes/{id}/usage`), one entry, within `start`..`end` (Unix
/// seconds, or milliseconds as older SDKs send) when given, else none. `cpuUsedPct` is the average since the
/// sandbox started (CPU time over wall time and CPUs); `memTotal` its
/// memory limit (0: none); the disk is not measured (0).
async fn metrics(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<MetricsQuery>,
) -> Result<Response, E2bError> {
    let caller = caller(&e2b, &headers)?;
    let seconds = |field: &str, v: &Option<String>| -> Result<Option<u64>, E2bError> {
        v.as_deref()
            .map(|t| {
                t.trim().parse::<u64>().map_err(|_| {
                    error(
                        StatusCode::BAD_REQUEST,
                        format!("{field}: '{t}' is not a Unix time in seconds"),
                    )
                })
            })
            .transpose()
    };
    // Older SDKs (2.7.0 among them) send milliseconds: a value past the
    // year 5000 in seconds is one.
    let unit = |t: Option<u64>| t.map(|t| if t > 100_000_000_000 { t / 1000 } else { t });
    let (start, end) = (
        unit(seconds("start", &q.start)?),
        unit(seconds("end", &q.end)?),
    );
    let (entry, lease) = visible(&e2b, &caller, &id).await?;
    let now = SystemTime::now();
    let now_s = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    if start.is_some_and(|s| now_s < s) || end.is_some_and(|e| now_s > e) {
        return Ok(Json(Vec::<Value>::new()).into_response());
    }
    let usage = lease
        .sandbox()
        .usage()
        .await
        .map_err(|e| api_error(ApiError::runtime(&e, "")))?;
    let cpus = lease.spec().limits.cpus.map_or_else(
        || std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64),
        |c| c.max(0.01),
    );
    let wall = now
        .duration_since(entry.started_at)
        .map_or(0.0, |d| d.as_secs_f64());
    let pct = if wall > 0.0 {
        (usage.cpu_ns as f64 / 1e9 / wall / cpus * 100.0).clamp(0.0, 100.0)
    } else {
        0.0
    };
    Ok(Json(vec![json!({
        "timestamp": rfc3339(now),
        "timestampUnix": now_s,
        "cpuCount": cpus.ceil() as u64,
        "cpuUsedPct": pct,
        "memUsed": usage.memory_bytes,
        "memTotal": usage.memory_limit_bytes.unwrap_or(0),
        "memCache": 0,
        "diskUsed": 0,
        "diskTotal": 0,
    })])
    .into_response())
}

/// One percent-decoding of `s` (as it was before `urllib.parse.quote`).
fn unquote(s: &str) -> String {
    let pair = format!("{}=", s.replace('+', "%2B"));
    serde_urlencoded::from_str::<Vec<(String, String)>>(&pair)
        .ok()
        .and_then(|v| v.into_iter().next())
        .map_or_else(|| s.to_string(), |(k, _)| k)
}

/// `t` as RFC 3339 in UTC (what E2B's `startedAt`/`endAt` carry).
pub(super) fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days since 1970-01-01 to a civil date (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_795_996_800 + 3_723);
        assert_eq!(rfc3339(t), "2026-11-30T01:02:03Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn lifetimes_are_checked_by_name() {
        assert_eq!(
            lifetime("timeout", None).expect("should work"),
            Duration::from_secs(300)
        );
        assert!(lifetime("timeout", Some(0)).is_err());
        assert!(lifetime("timeout", Some(MAX_TIMEOUT_S + 1)).is_err());
    }
}
