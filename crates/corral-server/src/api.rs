//! The REST API: sandboxes by session key, commands (JSON or streamed as
//! server-sent events), shell sessions, files, health and metrics. Every
//! handler is a thin translation onto [`Provider`] and
//! [`corral::Sandbox`]; the OpenAPI document is generated from the
//! handlers' annotations ([`openapi`]).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequest, Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use corral::{FileOptions, Lease, OutputStream, Provider, Runtime, Sandbox};
use corral_core::backend::ImagePresence;
use corral_core::client_policy::ImageRule;
use corral_core::config::Config;
use corral_core::{CommandSpec, Failure, FailureKind, SandboxSpec};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use tokio_stream::wrappers::UnboundedReceiverStream;
use utoipa::{IntoParams, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::ceilings::{Ceilings, Holder, Reservation, TimeUnit};
use crate::error::ApiError;
use crate::guard::{require_json, Caller};
use crate::metrics::Metrics;
use crate::tenancy::Tenancy;
use crate::wire::*;
use corral_core::principal::{Principal, SnapshotAccess};

mod code;
mod egress;
mod events;
mod images;
pub(crate) mod ports;
mod snapshots;
pub(crate) mod templates;
mod usage;

/// Longest session key and shell name.
const MAX_NAME: usize = 128;

/// Default cap of a file read or archive download: 64 MiB.
const DEFAULT_READ_CAP: u64 = 64 << 20;

/// The service's state; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Shared>,
}

struct Shared {
    provider: Provider,
    runtime: Runtime,
    config: Config,
    default_image: String,
    /// Sessions created through this service, by provider key (the
    /// owner's namespace and the client's key, see
    /// [`Principal::session_key`]).
    sessions: Mutex<BTreeMap<String, Meta>>,
    /// Owners of every sandbox the service hands out, and quotas.
    tenancy: Tenancy,
    metrics: Metrics,
    /// The sandboxes' usage for `/metrics`, sampled when scraped.
    usage: crate::metrics::usage::UsageSampler,
    closing: AtomicBool,
    /// `server.limits`: what one request may ask for, and the budget.
    ceilings: Ceilings,
    /// The key of the port links' tokens (`api/ports.rs`): made at start,
    /// so a link lives as long as the service and its sandbox.
    port_key: crate::port_links::PortKey,
    port_cookies: crate::port_links::CookieNames,
    /// Where port links are served, once `serve` has bound the port-link
    /// listener; before that (a router without it) no link is handed out.
    port_origin: std::sync::OnceLock<crate::port_links::PortOrigin>,
    /// Interactive commands running on an `exec/stream`, by sandbox key and
    /// handle: what `exec/{handle}/input` reaches.
    interactive: Mutex<BTreeMap<(String, u64), Interactive>>,
    next_handle: AtomicU64,
}

/// An interactive streamed command's input side.
struct Interactive {
    stdin: corral::StdinWriter,
    on_terminal: bool,
}

/// The note ([`Sandbox::set_note`]) naming a sandbox's owner
/// ([`Principal::id`]).
pub(crate) const OWNER_NOTE: &str = "owner";
/// The note naming the profile a sandbox was made from.
const PROFILE_NOTE: &str = "profile";

#[derive(Clone)]
struct Meta {
    /// Who created it: only it (and the operator) may see or touch it.
    owner: Principal,
    profile: Option<String>,
    persistent: bool,
    /// Set once the sandbox's container is lost under the `fail` policy:
    /// every later command reports it until the sandbox is deleted.
    lost: Option<Failure>,
}

/// A sandbox to act on, or the loss that ended it.
enum Leased {
    Live(Lease),
    Lost(Failure),
}

/// A sandbox as an observer sees it ([`AppState::observed`]): looked at,
/// not used.
pub(crate) enum Observed {
    Live(Sandbox),
    Lost(Failure),
}

impl AppState {
    /// State over `provider` and `runtime`; sandboxes without an image get
    /// `default_image`.
    pub fn new(
        provider: Provider,
        runtime: Runtime,
        config: Config,
        default_image: String,
    ) -> AppState {
        let mut metrics = Metrics::new(provider.clone(), runtime.clone());
        let ceilings = Ceilings::new(&config.server.limits, config.server.max_body_bytes);
        metrics.watch_ceilings(ceilings.clone());
        let tenancy = Tenancy::new(&config.server, provider.clone());
        let owners = tenancy.clone();
        let usage = crate::metrics::usage::UsageSampler::new(
            config.server.metrics.clone(),
            provider.clone(),
            Arc::new(move |key: &str| owners.owner(key)),
        );
        AppState {
            inner: Arc::new(Shared {
                usage,
                tenancy,
                provider,
                runtime,
                config,
                default_image,
                sessions: Mutex::new(BTreeMap::new()),
                metrics,
                closing: AtomicBool::new(false),
                ceilings,
                port_key: crate::port_links::PortKey::new(),
                port_cookies: crate::port_links::CookieNames::default(),
                port_origin: std::sync::OnceLock::new(),
                interactive: Mutex::new(BTreeMap::new()),
                next_handle: AtomicU64::new(1),
            }),
        }
    }

    /// The key of its port links (shared with the MCP endpoint).
    pub fn port_key(&self) -> &crate::port_links::PortKey {
        &self.inner.port_key
    }

    /// The cookie names each port's server set ([`crate::port_links::CookieNames`]).
    pub fn port_cookies(&self) -> &crate::port_links::CookieNames {
        &self.inner.port_cookies
    }

    /// Records where the port-link listener is bound (once; later calls
    /// change nothing).
    pub fn set_port_origin(&self, origin: crate::port_links::PortOrigin) {
        let _ = self.inner.port_origin.set(origin);
    }

    /// Where port links are served, once known.
    pub fn port_origin(&self) -> Option<crate::port_links::PortOrigin> {
        self.inner.port_origin.get().cloned()
    }

    /// The sandboxes' usage sample (`/metrics`, `GET /v1/usage`).
    pub(crate) fn usage_sampler(&self) -> &crate::metrics::usage::UsageSampler {
        &self.inner.usage
    }

    /// The configuration it serves with.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The runtime.
    pub fn runtime(&self) -> &Runtime {
        &self.inner.runtime
    }

    /// The provider.
    pub fn provider(&self) -> &Provider {
        &self.inner.provider
    }

    /// The owners of the service's sandboxes and the tenants' quotas
    /// (shared with the MCP endpoint).
    pub fn tenancy(&self) -> &Tenancy {
        &self.inner.tenancy
    }

    /// The ceilings and budget every request goes through (MCP's too).
    pub fn ceilings(&self) -> &Ceilings {
        &self.inner.ceilings
    }

    /// Refuses new work from now on (requests in flight go on).
    pub fn close(&self) {
        self.inner.closing.store(true, Ordering::Release);
    }

    fn interactive(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, u64), Interactive>> {
        // Plain map updates: a panic cannot leave one half-done.
        self.inner
            .interactive
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Meta>> {
        // Plain map updates: a panic cannot leave one half-done.
        self.inner
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the service is shutting down.
    fn is_closing(&self) -> bool {
        self.inner.closing.load(Ordering::Acquire)
    }

    /// 503 once the service is shutting down: nothing new starts then.
    pub(crate) fn refuse_when_closing(&self) -> Result<(), ApiError> {
        if self.inner.closing.load(Ordering::Acquire) {
            return Err(ApiError::shutting_down());
        }
        Ok(())
    }

    /// Serves `key`'s sandbox from now on as `meta` says, and notes its
    /// owner and profile on the sandbox, so a later process serves it as
    /// this one did when it is paused to disk ([`AppState::recover_paused`]).
    fn register(&self, key: &str, sandbox: &Sandbox, meta: Meta) {
        sandbox.set_note(OWNER_NOTE, meta.owner.id());
        if let Some(p) = &meta.profile {
            sandbox.set_note(PROFILE_NOTE, p.clone());
        }
        self.sessions().insert(key.to_string(), meta);
    }

    /// Serves again the sandboxes an earlier `corral serve` paused to disk
    /// ([`Provider::recover_paused`]): each is listed, owned and counted
    /// as before, paused until resumed. One whose owner was not noted is
    /// the operator's alone. Returns what each front end noted, by key.
    pub async fn recover_paused(
        &self,
    ) -> Result<Vec<(String, BTreeMap<String, String>)>, corral::Error> {
        let recovered = self.inner.provider.recover_paused().await?;
        for (key, notes) in &recovered {
            let owner = notes
                .get(OWNER_NOTE)
                .and_then(|o| Principal::from_id(o))
                .unwrap_or(Principal::Operator);
            self.inner.tenancy.adopt(key, &owner);
            self.sessions().insert(
                key.clone(),
                Meta {
                    owner,
                    profile: notes.get(PROFILE_NOTE).cloned(),
                    persistent: false,
                    lost: None,
                },
            );
        }
        Ok(recovered)
    }

    /// The sandbox `id` as `caller` names it: its lease, or the failure
    /// that ended it (its container lost under the `fail` policy); 404
    /// when there is no such sandbox, `caller` may not see it, or the
    /// provider evicted it.
    async fn leased(&self, caller: &Principal, id: &str) -> Result<Leased, ApiError> {
        self.refuse_when_closing()?;
        let key = caller.session_key(id);
        match self.sessions().get(&key) {
            None => return Err(no_sandbox(id)),
            // Another's is answered as absent.
            Some(meta) if !caller.may_session(&meta.owner) => return Err(no_sandbox(id)),
            Some(Meta { lost: Some(f), .. }) => return Ok(Leased::Lost(f.clone())),
            Some(_) => {}
        }
        let id = key.as_str();
        match self.inner.provider.lease(id).await {
            Some(Ok(lease)) => Ok(Leased::Live(lease)),
            Some(Err(e)) => {
                let f = e.failure();
                if matches!(f.kind, FailureKind::ContainerLost | FailureKind::OomKilled) {
                    if let Some(meta) = self.sessions().get_mut(id) {
                        meta.lost = Some(f.clone());
                    }
                    Ok(Leased::Lost(f))
                } else {
                    Err(ApiError::runtime(&e, ""))
                }
            }
            None => {
                self.sessions().remove(id);
                Err(evicted(caller, id))
            }
        }
    }

    /// The sandbox `id` as `caller` names it, looked at without using it
    /// (`Provider::peek`): listing, describing and reading usage are not
    /// activity, so a dashboard or monitor polling them keeps no abandoned
    /// sandbox from its idle timeout. 404 as [`AppState::lease`].
    pub(crate) fn observed(&self, caller: &Principal, id: &str) -> Result<Observed, ApiError> {
        let key = caller.session_key(id);
        let lost = match self.sessions().get(&key) {
            None => return Err(no_sandbox(id)),
            Some(meta) if !caller.may_session(&meta.owner) => return Err(no_sandbox(id)),
            Some(meta) => meta.lost.clone(),
        };
        if let Some(f) = lost {
            return Ok(Observed::Lost(f));
        }
        match self.inner.provider.peek(&key) {
            Some(sandbox) => Ok(Observed::Live(sandbox)),
            None => {
                self.sessions().remove(&key);
                Err(evicted(caller, &key))
            }
        }
    }

    /// The live lease of sandbox `id`; a lost one is an error (410).
    pub(crate) async fn lease(&self, caller: &Principal, id: &str) -> Result<Lease, ApiError> {
        match self.leased(caller, id).await? {
            Leased::Live(lease) => Ok(lease),
            Leased::Lost(f) => Err(ApiError::failure(&f)),
        }
    }

    /// Sandbox `key` (a provider key) as `caller` sees it.
    fn info(&self, caller: &Principal, key: &str, lease: &Sandbox) -> SandboxInfo {
        let meta = self.sessions().get(key).cloned().unwrap_or(Meta {
            owner: caller.clone(),
            profile: None,
            persistent: false,
            lost: None,
        });
        let reset_unavailable_reason = lease.resets_in_place().err();
        let result_integrity_gap = lease.result_integrity().err();
        let id = caller.display_key(key);
        SandboxInfo {
            id: id.clone(),
            session: id,
            owner: meta.owner.id(),
            sandbox_id: lease.id().to_string(),
            container_id: lease.container_id(),
            image: lease.spec().image.clone(),
            profile: meta.profile,
            persistent: meta.persistent,
            alive: lease.looks_alive(),
            shells: lease.shell_names(),
            resets_in_place: reset_unavailable_reason.is_none(),
            reset_unavailable_reason,
            result_integrity: result_integrity_gap.is_none(),
            result_integrity_gap,
            usage: self
                .usage_sampler()
                .latest_of(lease.id())
                .map(|(usage, cpu_cores, age)| SampledUsage {
                    age_ms: u64::try_from(age.as_millis()).unwrap_or(u64::MAX),
                    cpu_cores,
                    usage: usage.into(),
                }),
        }
    }
}

/// A JSON body whose errors name the field at fault. An empty body is `{}`;
/// a body needs `Content-Type: application/json` (415 otherwise).
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let headers = req.headers().clone();
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e| ApiError::invalid("body", e.body_text()))?;
        let empty = bytes.iter().all(u8::is_ascii_whitespace);
        // A web page may POST text/plain without a CORS preflight: JSON
        // must say it is JSON.
        require_json(&headers, !empty)?;
        let text: &[u8] = if empty { b"{}" } else { &bytes };
        let de = &mut serde_json::Deserializer::from_slice(text);
        serde_path_to_error::deserialize(de)
            .map(JsonBody)
            .map_err(|e| {
                let path = e.path().to_string();
                let field = if path == "." {
                    "body".to_string()
                } else {
                    path
                };
                ApiError::invalid(field, format!("invalid request body: {}", e.inner()))
            })
    }
}

/// 404 for sandbox `key` (a provider key) the provider no longer holds.
fn evicted(caller: &Principal, key: &str) -> ApiError {
    let mut e = ApiError::not_found(format!(
        "sandbox '{}' is gone: the provider evicted it (idle timeout, maximum \
         lifetime, or room for another sandbox)",
        caller.display_key(key)
    ));
    e.detail.field = Some("id".into());
    e
}

fn no_sandbox(id: &str) -> ApiError {
    let mut e = ApiError::not_found(format!("no sandbox '{id}'"));
    e.detail.field = Some("id".into());
    e
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn check_name(field: &str, s: &str) -> Result<(), ApiError> {
    if valid_name(s) {
        Ok(())
    } else {
        Err(ApiError::invalid(
            field,
            format!("{field} '{s}' must be 1 to {MAX_NAME} letters, digits, '.', '_' or '-'"),
        ))
    }
}

fn duration_ms(field: &str, ms: Option<u64>) -> Result<Option<Duration>, ApiError> {
    match ms {
        Some(0) => Err(ApiError::invalid(
            field,
            format!("{field} 0 must be at least 1 (leave it out for no limit)"),
        )),
        other => Ok(other.map(Duration::from_millis)),
    }
}

fn max_output(c: &Ceilings, v: Option<u64>) -> Result<u64, ApiError> {
    match v {
        Some(0) => Err(ApiError::invalid(
            "max_output",
            "max_output 0 must be at least 1",
        )),
        v => Ok(c.max_output("max_output", v, corral_core::command::DEFAULT_MAX_OUTPUT)?),
    }
}

/// `timeout_ms` within the ceiling; none takes the ceiling.
fn timeout_ms(c: &Ceilings, ms: Option<u64>) -> Result<Duration, ApiError> {
    let asked = duration_ms("timeout_ms", ms)?;
    Ok(c.timeout("timeout_ms", asked, None, TimeUnit::Millis)?)
}

/// The outcome of a command sent to a sandbox whose container was lost.
fn lost(f: Failure) -> corral_core::CommandResult {
    corral_core::CommandResult::failed(f, Duration::ZERO)
}

/// Merges `patch` into `base`: objects key by key, anything else replaced.
fn merge(base: &mut serde_json::Value, patch: serde_json::Value) {
    match (base, patch) {
        (serde_json::Value::Object(b), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                merge(b.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (b, p) => *b = p,
    }
}

/// A terminal size from request field `field` (`pty` or `resize`), checked
/// by [`corral_core::PtySize::validate`]; an error names `FIELD.cols` or
/// `FIELD.rows`.
fn terminal_size(field: &str, size: TerminalSize) -> Result<corral_core::PtySize, ApiError> {
    let size = corral_core::PtySize {
        cols: size.cols,
        rows: size.rows,
    };
    size.validate().map_err(|m| {
        let part = if m.starts_with("invalid pty.cols") {
            "cols"
        } else {
            "rows"
        };
        ApiError::invalid(
            format!("{field}.{part}"),
            m.replacen("pty.", &format!("{field}."), 1),
        )
    })?;
    Ok(size)
}

/// The command of an exec request, validated and within the ceilings.
fn command(req: ExecRequest, c: &Ceilings) -> Result<CommandSpec, ApiError> {
    let mut cmd = match (req.command, req.argv) {
        (Some(c), None) => CommandSpec::shell(c),
        (None, Some(argv)) if !argv.is_empty() => CommandSpec::argv(argv),
        (None, Some(_)) => return Err(ApiError::invalid("argv", "argv [] is empty")),
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "command",
                "give either command or argv, not both",
            ))
        }
        (None, None) => {
            return Err(ApiError::invalid(
                "command",
                "missing: give command (a shell line) or argv",
            ))
        }
    };
    cmd.timeout = Some(timeout_ms(c, req.timeout_ms)?);
    cmd.max_output = max_output(c, req.max_output)?;
    cmd.cwd = req.cwd;
    cmd.exclusive = req.exclusive;
    cmd.wait_for_output = req.wait_for_output;
    if let Some(size) = req.pty {
        let size = terminal_size("pty", size)?;
        cmd.pty = Some(size);
    }
    for (name, value) in req.env {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(ApiError::invalid(
                format!("env.{name}"),
                format!("environment variable name '{name}' is empty or holds '=' or NUL"),
            ));
        }
        cmd.env.push((name, value));
    }
    let stdin_base64 = req.stdin_base64.is_some();
    cmd.stdin = match (req.stdin, req.stdin_base64) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "stdin",
                "give either stdin or stdin_base64, not both",
            ))
        }
        (Some(s), None) => Some(s.into_bytes()),
        (None, Some(b)) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(b.trim())
                .map_err(|e| {
                    ApiError::invalid("stdin_base64", format!("stdin_base64 is not base64: {e}"))
                })?,
        ),
        (None, None) => None,
    };
    if let Some(stdin) = &cmd.stdin {
        let field = if stdin_base64 {
            "stdin_base64"
        } else {
            "stdin"
        };
        c.stdin(field, stdin.len() as u64)?;
    }
    Ok(cmd)
}

/// The spec of a create request (a profile or pool, an inline spec merged
/// over the defaults, or the defaults) and which request field chose an
/// image other than the operator's, if any. What the client changed in an
/// inline spec is checked against the service's policy here; the image is
/// checked by [`check_image`].
fn spec_of(
    s: &AppState,
    req: &CreateSandbox,
) -> Result<(SandboxSpec, Option<String>, Option<&'static str>), ApiError> {
    let config = &s.inner.config;
    let policy = &config.server.policy;
    let mut base = config.defaults.clone();
    if base.image.is_empty() {
        base.image = s.inner.default_image.clone();
    }
    let (mut spec, profile, image_field) = match (&req.profile, &req.spec) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "profile",
                "give either profile or spec, not both",
            ))
        }
        (Some(p), None) => {
            // Profiles and pools are the operator's: trusted as written.
            let spec = match config.provider.pools.get(p) {
                Some(pool) => pool_spec(pool),
                None => config
                    .profile(p)
                    .map_err(|e| ApiError::invalid("profile", e.to_string()))?
                    .clone(),
            };
            (spec, Some(p.clone()), "image")
        }
        (None, Some(v)) => {
            if !v.is_object() {
                return Err(ApiError::invalid("spec", "spec must be a JSON object"));
            }
            if !policy.inline_specs {
                return Err(ApiError::forbidden(
                    "spec",
                    "this service takes no inline specs (server.policy.inline_specs is false): \
                     name one of its profiles instead",
                ));
            }
            let mut merged = serde_json::to_value(&base)
                .map_err(|e| ApiError::invalid("spec", e.to_string()))?;
            merge(&mut merged, v.clone());
            let spec: SandboxSpec = serde_path_to_error::deserialize(merged).map_err(|e| {
                ApiError::invalid(
                    format!("spec.{}", e.path()),
                    format!("invalid spec: {}", e.inner()),
                )
            })?;
            policy
                .check_spec(&base, &spec)
                .map_err(|r| ApiError::refused(&r, "spec"))?;
            (spec, None, "spec.image")
        }
        (None, None) => (base.clone(), None, "image"),
    };
    if spec.image.is_empty() {
        spec.image = s.inner.default_image.clone();
    }
    if let Some(pristine) = req.pristine {
        spec.pristine = pristine;
    }
    let trusted_image = if req.spec.is_some() {
        base.image.clone()
    } else {
        spec.image.clone()
    };
    let mut image_field = Some(image_field);
    if let Some(image) = &req.image {
        if image.trim().is_empty() {
            return Err(ApiError::invalid("image", "image '' is empty"));
        }
        spec.image = image.clone();
        image_field = Some("image");
    }
    if spec.image == trusted_image {
        image_field = None;
    }
    if let Some(field) = image_field {
        policy
            .check_image(field, &spec.image)
            .map_err(|r| ApiError::refused(&r, ""))?;
    }
    if req.persistent && !policy.allow_persistent {
        return Err(ApiError::forbidden(
            "persistent",
            "persistent 'true' is not allowed: persistent sandboxes outlive the service and \
             are adopted by the next request for their key, so this service refuses them to \
             clients (server.policy.allow_persistent)",
        ));
    }
    Ok((spec, profile, image_field))
}

/// The spec of a pool's sandboxes (a pristine pool starts them pristine).
fn pool_spec(pool: &corral::pool::PoolConfig) -> SandboxSpec {
    let mut spec = pool.spec.clone();
    spec.pristine |= pool.pristine;
    spec
}

/// An image `caller` chose (in request field `field`): refused (403) when
/// the policy does not allow it; when it is a snapshot's image the caller
/// may not read (however spelled, or whatever the engine resolves it to:
/// the snapshot's owner decides, [`Principal::may_name_image`], whatever
/// the policy lists); and, without an allow-list, when it is not already
/// on the daemon, so that no client makes the daemon pull from a registry.
async fn check_image(
    s: &AppState,
    caller: &Principal,
    field: &str,
    image: &str,
) -> Result<(), ApiError> {
    let rule = s
        .inner
        .config
        .server
        .policy
        .check_image(field, image)
        .map_err(|r| ApiError::refused(&r, ""))?;
    let sharing = s.inner.tenancy.sharing();
    if !caller.may_name_image(image, sharing) {
        // The same answer whether or not the snapshot exists.
        return Err(ApiError::forbidden(
            field,
            format!(
                "{field} '{image}' is not allowed: it names a snapshot's image, and a client \
                 starts only from snapshots it may read, by forking them (POST \
                 /v1/snapshots/{{name}}/fork)"
            ),
        ));
    }
    let runtime = &s.inner.runtime;
    let engine = runtime.backend().name();
    let resolved = runtime.image_snapshot(image).await.map_err(|e| {
        let mut err = ApiError::runtime(&e, "");
        err.detail.field = Some(field.to_string());
        err
    })?;
    if let Some(q) = resolved {
        if !caller.may_snapshot(SnapshotAccess::Read, &q, sharing) {
            // Answered as if absent: an image id tells nothing more.
            return unlisted_image(field, image, engine, ImagePresence::Absent);
        }
    }
    // A template or a build's cached step is started from by the
    // `template` field (its owner's alone), never by its image, however
    // spelled: the engine resolves the reference, the labels say what it is.
    if *caller != Principal::Operator {
        let built = runtime.backend().built_image(image).await.map_err(|e| {
            let mut err = ApiError::runtime(&e, "");
            err.detail.field = Some(field.to_string());
            err
        })?;
        if built.is_some_and(|b| {
            b.labels.contains_key(corral_core::template::NAME_LABEL)
                || b.labels.contains_key(corral_core::template::CACHE_LABEL)
        }) {
            return unlisted_image(field, image, engine, ImagePresence::Absent);
        }
    }
    if rule == ImageRule::Listed {
        return Ok(());
    }
    match runtime.image_present(image).await {
        Ok(presence) => unlisted_image(field, image, engine, presence),
        Err(e) => {
            let mut err = ApiError::runtime(&e, "");
            err.detail.field = Some(field.to_string());
            Err(err)
        }
    }
}

/// Whether an image the allow-list does not name may run: only when the
/// engine (`engine`, for the message) knows it holds it. An engine that
/// cannot tell (Kubernetes: the nodes pull images themselves) might pull
/// it, which is what this rule keeps clients from doing.
fn unlisted_image(
    field: &str,
    image: &str,
    engine: &str,
    presence: ImagePresence,
) -> Result<(), ApiError> {
    let why = match presence {
        ImagePresence::Present => return Ok(()),
        ImagePresence::Absent => "it is not on the daemon".to_string(),
        ImagePresence::Unknown => format!(
            "the {engine} backend cannot tell whether the machines running sandboxes hold it \
             (they pull images themselves)"
        ),
    };
    Err(ApiError::forbidden(
        field,
        format!(
            "{field} '{image}' is not allowed: {why}, and this service runs only images already \
             there for its clients; add `- '{pattern}'` (or the image itself) under \
             server.policy.images in the config file (corral serve --config) to let clients use \
             it; it is then pulled when missing",
            pattern = allow_pattern(image),
        ),
    ))
}

/// The `server.policy.images` line that would allow `image`: its
/// repository with any tag (`python:3.12-slim` → `python:*`), or the
/// reference itself when it names a digest.
fn allow_pattern(image: &str) -> String {
    if image.contains('@') {
        return image.to_string();
    }
    let last_slash = image.rfind('/').map_or(0, |i| i + 1);
    match image[last_slash..].rfind(':') {
        Some(i) => format!("{}:*", &image[..last_slash + i]),
        None => format!("{image}:*"),
    }
}

/// Create a sandbox, or return the one bound to the session key.
#[utoipa::path(
    post, path = "/v1/sandboxes", tag = "sandboxes",
    request_body(content = CreateSandbox, description = "All fields optional; an empty body gives a sandbox of the configured defaults"),
    responses(
        (status = 201, description = "Created", body = SandboxInfo),
        (status = 200, description = "The session key already had this sandbox", body = SandboxInfo),
        (status = 400, description = "Bad request, spec or image", body = ErrorBody),
        (status = 403, description = "Refused: a field the service's policy keeps from clients (host mounts, added capabilities, weakened hardening, runtime, host environment, corral.* labels, persistent, limits removed or above the maxima, an image not allowed, a snapshot's image the caller may not read, however spelled: its owner decides, as for a fork), named in `field`; or a browser Origin or a foreign Host", body = ErrorBody),
        (status = 409, description = "The session key is taken by the operator (which shares tenant `default`'s namespace)", body = ErrorBody),
        (status = 503, description = "Daemon unavailable (`daemon_unavailable`), or no room for the sandbox now (`capacity`, with `Retry-After`: the engine is full, or the tenant's `max_sandboxes` quota is spent, named in `field`); both retryable", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait before trying again, with kind `capacity`"))),
        (status = 401, description = "No or a wrong bearer token", body = ErrorBody),
        (status = 415, description = "A JSON body not sent as application/json", body = ErrorBody),
    )
)]
async fn create_sandbox(
    State(s): State<AppState>,
    Caller(caller): Caller,
    JsonBody(req): JsonBody<CreateSandbox>,
) -> Result<(StatusCode, Json<SandboxInfo>), ApiError> {
    let (status, info) = s.create(&caller, &req).await?;
    Ok((status, Json(info)))
}

impl AppState {
    /// Creates a sandbox for `caller` (or returns the one its session key
    /// already names, with 200): the one way every front end creates
    /// sandboxes, through the client policy, the tenant's quota and the
    /// provider.
    pub(crate) async fn create(
        &self,
        caller: &Principal,
        req: &CreateSandbox,
    ) -> Result<(StatusCode, SandboxInfo), ApiError> {
        let s = self;
        let caller = caller.clone();
        s.refuse_when_closing()?;
        let client_key = match &req.session {
            Some(k) => {
                check_name("session", k)?;
                k.clone()
            }
            None => format!("sb-{}", corral::host::random_hex(16)),
        };
        // The caller's namespace: two tenants' `ep-1` are two sessions.
        let key = caller.session_key(&client_key);
        // Checked before anything else: a refused request is refused even for
        // a key that already has a sandbox.
        let (mut spec, profile, mut chosen_image) = spec_of(s, req)?;
        if let Some(name) = &req.template {
            if req.image.is_some() || req.profile.is_some() {
                return Err(ApiError::invalid(
                    "template",
                    "give a template, or an image or profile, not both",
                ));
            }
            let t = s
                .inner
                .runtime
                .template(caller.snapshot_namespace().as_deref(), name)
                .await
                .map_err(|e| ApiError::runtime(&e, "template"))?
                .ok_or_else(|| templates::no_template(name))?;
            t.apply(&mut spec);
            // The template's image is the runtime's own, found by name.
            chosen_image = None;
        }
        let existing = s.sessions().get(&key).map(|m| m.owner.clone());
        if let Some(owner) = existing {
            if !caller.may_session(&owner) {
                // Only the operator and tenant `default` share a namespace.
                return Err(snapshots::conflict(
                    "session",
                    format!("session key '{client_key}' is taken by the operator"),
                ));
            }
            if let Ok(lease) = s.lease(&caller, &client_key).await {
                return Ok((StatusCode::OK, s.info(&caller, &key, &lease)));
            }
        }
        if let Some(field) = chosen_image {
            check_image(s, &caller, field, &spec.image).await?;
        }
        let reservation = s
            .inner
            .tenancy
            .reserve(&caller, std::slice::from_ref(&key))
            .map_err(|e| ApiError::quota(&e))?;
        let provider = &s.inner.provider;
        let lease = if req.persistent {
            provider.acquire_persistent(&key, &spec).await
        } else if let Some(pool) = profile
            .as_deref()
            .filter(|_| req.template.is_none())
            .filter(|p| {
                // A pool hands out sandboxes of its own spec: a request that
                // changes it (image, pristine) gets a sandbox of its own.
                s.inner.config.provider.pools.get(*p).is_some_and(|pool| {
                    let mut own = pool_spec(pool);
                    if own.image.is_empty() {
                        own.image = s.inner.default_image.clone();
                    }
                    own == spec
                })
            })
        {
            provider.acquire(&key, pool).await
        } else {
            provider.acquire_spec(&key, &spec).await
        }
        .map_err(|e| {
            let mut err = ApiError::runtime(&e, "spec");
            if matches!(e, corral::Error::ImageNotFound { .. }) {
                err.detail.field = Some("image".into());
            }
            err
        })?;
        reservation.commit();
        s.register(
            &key,
            &lease,
            Meta {
                owner: caller.clone(),
                profile,
                persistent: req.persistent,
                lost: None,
            },
        );
        Ok((StatusCode::CREATED, s.info(&caller, &key, &lease)))
    }
}

/// List the service's sandboxes.
#[utoipa::path(
    get, path = "/v1/sandboxes", tag = "sandboxes",
    responses((status = 200, body = SandboxList), (status = 401, description = "No or a wrong bearer token", body = ErrorBody), (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody))
)]
async fn list_sandboxes(
    State(s): State<AppState>,
    Caller(caller): Caller,
) -> Result<Json<SandboxList>, ApiError> {
    // Each sandbox's usage comes from the service's sample: a stale one
    // starts a new one (the first is waited for), as a scrape does.
    let _ = s.usage_sampler().current().await;
    // Only what the caller may see: another's is not listed at all.
    let keys: Vec<(String, Principal)> = s
        .sessions()
        .iter()
        .filter(|(_, m)| caller.may_session(&m.owner))
        .map(|(k, m)| (k.clone(), m.owner.clone()))
        .collect();
    let mut sandboxes = Vec::new();
    for (key, owner) in keys {
        let id = caller.display_key(&key);
        match s.observed(&caller, &id) {
            Ok(Observed::Live(sandbox)) => sandboxes.push(s.info(&caller, &key, &sandbox)),
            Ok(Observed::Lost(f)) => sandboxes.push(SandboxInfo {
                id: id.clone(),
                session: id.clone(),
                owner: owner.id(),
                sandbox_id: String::new(),
                container_id: f.container.map(|c| c.id).unwrap_or_default(),
                image: String::new(),
                profile: None,
                persistent: false,
                alive: false,
                shells: Vec::new(),
                resets_in_place: false,
                reset_unavailable_reason: Some(format!("its container was lost: {}", f.message)),
                result_integrity: false,
                result_integrity_gap: Some(format!("its container was lost: {}", f.message)),
                usage: None,
            }),
            Err(_) => {}
        }
    }
    Ok(Json(SandboxList { sandboxes }))
}

/// One sandbox.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id (its session key)")),
    responses((status = 200, body = SandboxInfo), (status = 404, body = ErrorBody), (status = 401, description = "No or a wrong bearer token", body = ErrorBody), (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody))
)]
async fn get_sandbox(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Result<Json<SandboxInfo>, ApiError> {
    s.refuse_when_closing()?;
    match s.observed(&caller, &id)? {
        Observed::Live(sandbox) => {
            let mut info = s.info(&caller, &caller.session_key(&id), &sandbox);
            // Described with its usage: the sample's while fresh, else
            // read now (a usage read, not activity).
            if let Some((usage, cpu_cores, age)) = s.usage_sampler().describe(&sandbox).await {
                info.usage = Some(SampledUsage {
                    age_ms: u64::try_from(age.as_millis()).unwrap_or(u64::MAX),
                    cpu_cores,
                    usage: usage.into(),
                });
            }
            Ok(Json(info))
        }
        Observed::Lost(f) => Err(ApiError::failure(&f)),
    }
}

/// Release a sandbox: destroyed, unless persistent (then its container is
/// removed and its workspace kept for the next sandbox of the key).
#[utoipa::path(
    delete, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id (its session key)")),
    responses((status = 204, description = "Released"), (status = 404, body = ErrorBody), (status = 401, description = "No or a wrong bearer token", body = ErrorBody), (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody))
)]
async fn delete_sandbox(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    s.release(&caller, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

impl AppState {
    /// Releases sandbox `id` as `caller` names it (404 when it may not
    /// see it): destroyed, unless persistent.
    pub(crate) async fn release(&self, caller: &Principal, id: &str) -> Result<(), ApiError> {
        let s = self;
        let key = caller.session_key(id);
        let meta = {
            let mut sessions = s.sessions();
            match sessions.get(&key) {
                Some(m) if caller.may_session(&m.owner) => sessions.remove(&key),
                _ => None,
            }
        };
        let Some(meta) = meta else {
            return Err(no_sandbox(id));
        };
        s.inner.tenancy.forget(&key);
        if let Err(e) = s.inner.provider.release_and_wait(&key).await {
            // A lost sandbox may already be gone from the provider.
            if meta.lost.is_none() {
                return Err(ApiError::runtime(&e, ""));
            }
        }
        Ok(())
    }
}

/// Return a sandbox to its state right after start: every process killed,
/// every change to its file system undone (host mounts are the host's),
/// shell sessions closed; its id stays. A sandbox created with `pristine`
/// (see `resets_in_place` in its description) is reset in place by its
/// agent in milliseconds; any other has its container replaced by a new
/// one from the same spec (start-up commands run again), and the answer
/// says why in `fallback_reason`.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/reset", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id (its session key)")),
    responses(
        (status = 200, body = ResetBody),
        (status = 404, body = ErrorBody),
        (status = 410, description = "Its container was lost earlier (recovery `fail`): delete it and create another", body = ErrorBody),
        (status = 503, description = "Daemon unavailable (retryable)", body = ErrorBody),
        (status = 401, description = "No or a wrong bearer token", body = ErrorBody), (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody),
    )
)]
async fn reset_sandbox(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Result<Json<ResetBody>, ApiError> {
    let lease = s.lease(&caller, &id).await?;
    let outcome = lease.reset().await.map_err(|e| ApiError::runtime(&e, ""))?;
    Ok(Json(ResetBody::from(&outcome)))
}

/// Pause a sandbox until it is resumed: where its tier checkpoints (gVisor
/// without network), to disk (its processes and memory written under the
/// service's snapshot directory, its container stopped, no memory held;
/// commands are refused until it resumes; it outlives a restart of the
/// service, which serves it again, paused); elsewhere frozen, memory kept
/// (commands wait). It counts against quotas as before.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/pause", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id (its session key)")),
    responses(
        (status = 200, body = PauseBody),
        (status = 400, description = "The engine can pause no sandbox (kind `unsupported`: Kubernetes)", body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, description = "Already paused", body = ErrorBody),
        (status = 401, description = "No or a wrong bearer token", body = ErrorBody), (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody),
    )
)]
async fn pause_sandbox(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Result<Json<PauseBody>, ApiError> {
    let lease = s.lease(&caller, &id).await?;
    if lease.is_paused() {
        return Err(paused_conflict(&id, "is already paused"));
    }
    lease.pause().await.map_err(|e| ApiError::runtime(&e, ""))?;
    let paused = if lease.is_paused_to_disk() {
        "disk"
    } else {
        "memory"
    };
    Ok(Json(PauseBody {
        paused: paused.into(),
    }))
}

/// Resume a sandbox paused with `pause`: one paused to disk is restored
/// with its processes, a frozen one thawed.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/resume", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id (its session key)")),
    responses(
        (status = 204, description = "Resumed"),
        (status = 404, body = ErrorBody), (status = 409, description = "Not paused", body = ErrorBody),
        (status = 401, description = "No or a wrong bearer token", body = ErrorBody), (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody),
    )
)]
async fn resume_sandbox(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let lease = s.lease(&caller, &id).await?;
    if !lease.is_paused() {
        return Err(paused_conflict(&id, "is not paused"));
    }
    lease
        .resume()
        .await
        .map_err(|e| ApiError::runtime(&e, ""))?;
    Ok(StatusCode::NO_CONTENT)
}

fn paused_conflict(id: &str, what: &str) -> ApiError {
    let mut e = ApiError::new(
        StatusCode::CONFLICT,
        "conflict",
        format!("sandbox '{id}' {what}"),
    );
    e.detail.field = Some("id".into());
    e
}

/// Run a command and wait for its outcome. Timeouts, OOM kills and lost
/// containers are outcomes (200 with `failure`), not HTTP errors.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/exec", tag = "commands",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = ExecRequest,
    responses(
        (status = 200, body = CommandOutcome),
        (status = 400, description = "A bad field, or one above the service's ceiling (`server.limits`): named in `field`, with its value and the ceiling in `message`", body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 503, description = "Overloaded: the service's ceilings on work in flight (`server.limits.buffer_bytes`, `max_concurrent`) are reached and nothing ran (`overloaded`, retryable, with `Retry-After`); or shutting down", body = ErrorBody, headers(("Retry-After" = u64, description = "Seconds to wait before trying again, with kind `overloaded`"))),
        (status = 401, description = "No or a wrong bearer token", body = ErrorBody), (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody), (status = 415, description = "A JSON body not sent as application/json", body = ErrorBody),
    )
)]
async fn exec(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<ExecRequest>,
) -> Result<(Reservation, Json<CommandOutcome>), ApiError> {
    if req.interactive {
        return Err(ApiError::invalid(
            "interactive",
            "interactive true is only for POST /v1/sandboxes/{id}/exec/stream (input needs a running stream)",
        ));
    }
    let cmd = command(req, s.ceilings())?;
    let held = s.ceilings().exec(&Holder::of(&caller), &cmd, false)?;
    let (result, sandbox_id) = match s.leased(&caller, &id).await? {
        Leased::Live(lease) => (lease.run(&cmd).await, Some(lease.id().to_string())),
        Leased::Lost(f) => (lost(f), None),
    };
    s.inner.metrics.command("exec", &result);
    Ok((
        held,
        Json(CommandOutcome::new(&result, sandbox_id.as_deref())),
    ))
}

/// Run a command and stream its output as server-sent events: `stdout` and
/// `stderr` events carry [`OutputChunk`]s as they happen, then one `result`
/// event carries the [`CommandOutcome`] (with the same capped output, the
/// totals and the typed failure). Closing the stream kills the command.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/exec/stream", tag = "commands",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = ExecRequest,
    responses(
        (status = 200, content_type = "text/event-stream", description = "Events `stdout`/`stderr` (OutputChunk), then `result` (CommandOutcome)"),
        (status = 400, description = "A bad field, or one above the service's ceiling (`server.limits`): named in `field`, with its value and the ceiling in `message`", body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 503, description = "Overloaded: the service's ceilings on work in flight (`server.limits.buffer_bytes`, `max_concurrent`) are reached and nothing ran (`overloaded`, retryable, with `Retry-After`); or shutting down", body = ErrorBody, headers(("Retry-After" = u64, description = "Seconds to wait before trying again, with kind `overloaded`"))),
        (status = 401, description = "No or a wrong bearer token", body = ErrorBody), (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody), (status = 415, description = "A JSON body not sent as application/json", body = ErrorBody),
    )
)]
async fn exec_stream(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<ExecRequest>,
) -> Result<
    (
        Reservation,
        Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>>,
    ),
    ApiError,
> {
    let interactive = req.interactive || req.pty.is_some();
    let mut cmd = command(req, s.ceilings())?;
    if interactive && cmd.stdin.is_none() {
        // A pipe for the input to come; none would be an immediate EOF.
        cmd.stdin = Some(Vec::new());
    }
    // Held by the response body (chunks a slow reader has not taken) and
    // by the task below (the output it gathers), until both are done.
    let held = s.ceilings().exec(&Holder::of(&caller), &cmd, true)?;
    let lease = match s.leased(&caller, &id).await? {
        Leased::Live(lease) => lease,
        Leased::Lost(f) => {
            let result = lost(f);
            s.inner.metrics.command("stream", &result);
            let event = Event::default()
                .event("result")
                .json_data(CommandOutcome::new(&result, None))
                .map_err(|e| ApiError::invalid("body", e.to_string()))?;
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let _ = tx.send(Ok(event));
            return Ok((
                held,
                Sse::new(UnboundedReceiverStream::new(rx)).keep_alive(KeepAlive::default()),
            ));
        }
    };
    let task_held = held.clone();
    // Output is capped by the agent, so this channel holds at most about
    // twice max_output.
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Result<Event, Infallible>>();
    tokio::spawn(async move {
        let sandbox_id = lease.id().to_string();
        let result = match lease.exec(&cmd).await {
            Err(f) => corral_core::CommandResult::failed(f, Duration::ZERO),
            Ok(execution) => {
                // `exec` opens the stdin pipe; the bytes are ours to send,
                // as `Sandbox::run` sends them (else the command never sees
                // its stdin, nor EOF). An interactive command's stays open
                // for `exec/{handle}/input`.
                if let Some(bytes) = &cmd.stdin {
                    let sent = bytes.is_empty() || execution.write_stdin(bytes).await.is_ok();
                    if sent && !interactive {
                        let _ = execution.close_stdin().await;
                    }
                }
                let control = execution.stdin();
                let handle = interactive.then(|| {
                    let n = s.inner.next_handle.fetch_add(1, Ordering::Relaxed);
                    s.interactive().insert(
                        (sandbox_id.clone(), n),
                        Interactive {
                            stdin: execution.stdin(),
                            on_terminal: cmd.pty.is_some(),
                        },
                    );
                    if let Ok(event) = Event::default().event("started").json_data(StreamStarted {
                        handle: n.to_string(),
                    }) {
                        let _ = tx.send(Ok(event));
                    }
                    n
                });
                let output = tx.clone();
                let wait = execution.wait_with(move |stream, bytes| {
                    let name = match stream {
                        OutputStream::Stdout => "stdout",
                        OutputStream::Stderr => "stderr",
                    };
                    if let Ok(event) = Event::default()
                        .event(name)
                        .json_data(OutputChunk::new(bytes))
                    {
                        // Fails once the client is gone; the select below
                        // has stopped the command by then.
                        let _ = output.send(Ok(event));
                    }
                });
                tokio::pin!(wait);
                let result = tokio::select! {
                    result = &mut wait => result,
                    () = tx.closed() => {
                        // The client closed the stream (the response body
                        // was dropped): stop the command now, not at its
                        // next write, which a quiet command never makes.
                        if let Err(e) = control.signal(9).await {
                            tracing::warn!(sandbox = %sandbox_id, error = %e, "cannot stop an abandoned streamed command");
                        }
                        wait.await
                    }
                };
                if let Some(n) = handle {
                    s.interactive().remove(&(sandbox_id.clone(), n));
                }
                result
            }
        };
        s.inner.metrics.command("stream", &result);
        // The output is in the result now; the response body's hold covers it.
        drop(task_held);
        if let Ok(event) = Event::default()
            .event("result")
            .json_data(CommandOutcome::new(&result, Some(sandbox_id.as_str())))
        {
            let _ = tx.send(Ok(event));
        }
    });
    Ok((
        held,
        Sse::new(UnboundedReceiverStream::new(rx)).keep_alive(KeepAlive::default()),
    ))
}

/// Send input, a resize or a signal to an interactive command running on an
/// `exec/stream` (one started with `interactive` or `pty`), named by the
/// `handle` of its stream's `started` event. Answers 204 once the sandbox's
/// agent has it; 404 once the command has ended (or for another's sandbox).
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/exec/{handle}/input", tag = "commands",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("handle" = String, Path, description = "The `handle` of the stream's `started` event"),
    ),
    request_body = ExecInput,
    responses(
        (status = 204, description = "Sent"),
        (status = 400, description = "A bad field, named in `field`", body = ErrorBody),
        (status = 404, description = "No such sandbox, or no such running command in it", body = ErrorBody),
        (status = 401, description = "No or a wrong bearer token", body = ErrorBody), (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody), (status = 415, description = "A JSON body not sent as application/json", body = ErrorBody),
    )
)]
async fn exec_input(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path((id, handle)): Path<(String, String)>,
    JsonBody(req): JsonBody<ExecInput>,
) -> Result<StatusCode, ApiError> {
    let data = match (req.data, req.data_base64) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "data",
                "give either data or data_base64, not both",
            ))
        }
        (Some(t), None) => Some(t.into_bytes()),
        (None, Some(b)) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(b.trim())
                .map_err(|e| ApiError::invalid("data_base64", format!("not base64: {e}")))?,
        ),
        (None, None) => None,
    };
    if let Some(len) = data.as_ref().map(Vec::len) {
        s.ceilings().stdin("data", len as u64)?;
    }
    let size = match req.resize {
        None => None,
        Some(size) => {
            let size = terminal_size("resize", size)?;
            Some(size)
        }
    };
    let gone = || {
        let mut e = ApiError::not_found(format!(
            "no running interactive command '{handle}' in sandbox '{id}' (it ended, or its stream was closed)"
        ));
        e.detail.field = Some("handle".into());
        e
    };
    let n: u64 = handle.parse().map_err(|_| gone())?;
    // The same owner check as every command: another's sandbox is absent.
    let key = match s.leased(&caller, &id).await? {
        Leased::Live(lease) => lease.id().to_string(),
        Leased::Lost(_) => return Err(gone()),
    };
    let (stdin, on_terminal) = match s.interactive().get(&(key, n)) {
        Some(i) => (i.stdin.clone(), i.on_terminal),
        None => return Err(gone()),
    };
    if size.is_some() && !on_terminal {
        return Err(ApiError::invalid(
            "resize",
            format!("command '{handle}' does not run on a terminal (start it with pty)"),
        ));
    }
    if req.eof && on_terminal {
        return Err(ApiError::invalid(
            "eof",
            "eof true would hang the terminal up; send \"\\u0004\" (Ctrl-D) as data instead",
        ));
    }
    let sent = async {
        if let Some(size) = size {
            stdin.resize(size).await?;
        }
        if let Some(bytes) = data.filter(|d| !d.is_empty()) {
            stdin.write(&bytes).await?;
        }
        if req.eof {
            stdin.close().await?;
        }
        if let Some(signal) = req.signal {
            stdin.signal(signal).await?;
        }
        Ok::<(), String>(())
    };
    sent.await.map_err(|_| gone())?;
    Ok(StatusCode::NO_CONTENT)
}

/// Run a command in a stateful shell session (created on first use).
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/shells/{name}/exec", tag = "shells",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("name" = String, Path, description = "Session name, e.g. main"),
    ),
    request_body = ShellExecRequest,
    responses((status = 200, body = ShellOutcome), (status = 400, description = "A bad field, or one above the service's ceiling (`server.limits`): named in `field`, with its value and the ceiling in `message`", body = ErrorBody), (status = 404, body = ErrorBody), (status = 503, description = "Overloaded: the service's ceilings on work in flight (`server.limits.buffer_bytes`, `max_concurrent`) are reached and nothing ran (`overloaded`, retryable, with `Retry-After`); or shutting down", body = ErrorBody, headers(("Retry-After" = u64, description = "Seconds to wait before trying again, with kind `overloaded`"))), (status = 401, description = "No or a wrong bearer token", body = ErrorBody), (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody), (status = 415, description = "A JSON body not sent as application/json", body = ErrorBody))
)]
async fn shell_exec(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path((id, name)): Path<(String, String)>,
    JsonBody(req): JsonBody<ShellExecRequest>,
) -> Result<(Reservation, Json<ShellOutcome>), ApiError> {
    check_name("name", &name)?;
    let timeout = timeout_ms(s.ceilings(), req.timeout_ms)?;
    let cap = max_output(s.ceilings(), req.max_output)?;
    let held = s.ceilings().command(&Holder::of(&caller), cap, 0, false)?;
    let (r, sandbox_id) = match s.leased(&caller, &id).await? {
        Leased::Live(lease) => (
            lease
                .shell(&name)
                .run(&req.command, Some(timeout), cap)
                .await,
            Some(lease.id().to_string()),
        ),
        Leased::Lost(f) => (
            corral::SessionResult {
                result: lost(f),
                restarted: false,
                ended: true,
                dropped_between_bytes: 0,
                trusted: false,
            },
            None,
        ),
    };
    s.inner.metrics.command("shell", &r.result);
    let outcome = ShellOutcome {
        result: CommandOutcome::new(&r.result, sandbox_id.as_deref()),
        restarted: r.restarted,
        ended: r.ended,
        dropped_between_bytes: r.dropped_between_bytes,
        trusted: r.trusted,
    };
    Ok((held, Json(outcome)))
}

/// Open shell sessions.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/shells", tag = "shells",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, body = ShellList), (status = 404, body = ErrorBody), (status = 401, description = "No or a wrong bearer token", body = ErrorBody), (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody))
)]
async fn list_shells(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Result<Json<ShellList>, ApiError> {
    let lease = s.lease(&caller, &id).await?;
    Ok(Json(ShellList {
        shells: lease.shell_names(),
    }))
}

/// Close a shell session (its processes are killed).
#[utoipa::path(
    delete, path = "/v1/sandboxes/{id}/shells/{name}", tag = "shells",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("name" = String, Path, description = "Session name"),
    ),
    responses((status = 204, description = "Closed"), (status = 404, body = ErrorBody), (status = 401, description = "No or a wrong bearer token", body = ErrorBody), (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody))
)]
async fn close_shell(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path((id, name)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let lease = s.lease(&caller, &id).await?;
    if !lease.shell_names().contains(&name) {
        let mut e = ApiError::not_found(format!("sandbox '{id}' has no shell session '{name}'"));
        e.detail.field = Some("name".into());
        return Err(e);
    }
    lease.close_shell(&name).await;
    Ok(StatusCode::NO_CONTENT)
}

/// Where a file operation acts.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct FileQuery {
    /// Absolute path in the sandbox.
    path: String,
    /// Permission bits of a written file, octal (e.g. `644`); default: kept
    /// for a replaced file, 644 for a new one.
    mode: Option<String>,
    /// Create missing parent directories.
    #[serde(default)]
    mkdirs: bool,
    /// Largest file or archive read, in bytes (default 64 MiB, at most
    /// the service's `server.limits.max_read_bytes`).
    max_bytes: Option<u64>,
}

fn file_query(q: QueryResult) -> Result<FileQuery, ApiError> {
    q.map(|Query(q)| q).map_err(|e| {
        let text = e.body_text();
        let field = ["path", "mode", "mkdirs", "max_bytes"]
            .into_iter()
            .find(|f| text.contains(&format!("`{f}`")))
            .unwrap_or("query");
        ApiError::invalid(field, text)
    })
}

type QueryResult = Result<Query<FileQuery>, axum::extract::rejection::QueryRejection>;

/// A file operation's query, options and sandbox, each checked.
/// A write passes the `written` bytes of its body; a read reserves its
/// `max_bytes`.
async fn file_call(
    s: &AppState,
    caller: &Principal,
    id: &str,
    q: QueryResult,
    written: Option<usize>,
) -> Result<(FileQuery, FileOptions, Lease, Reservation), ApiError> {
    let q = file_query(q)?;
    let opts = q.options(s)?;
    let payload = written.map_or(opts.max_bytes, |n| n as u64);
    let held = s.ceilings().file(&Holder::of(caller), payload)?;
    let lease = s.lease(caller, id).await?;
    Ok((q, opts, lease, held))
}

impl FileQuery {
    fn options(&self, s: &AppState) -> Result<FileOptions, ApiError> {
        let mode = match &self.mode {
            None => None,
            Some(m) => {
                let digits = m.trim().trim_start_matches("0o");
                Some(u32::from_str_radix(digits, 8).map_err(|_| {
                    ApiError::invalid("mode", format!("mode '{m}' is not octal permission bits"))
                })?)
            }
        };
        let max_bytes = match self.max_bytes {
            Some(0) => {
                return Err(ApiError::invalid(
                    "max_bytes",
                    "max_bytes 0 must be at least 1",
                ))
            }
            asked => s.ceilings().read_bytes(
                "max_bytes",
                asked,
                DEFAULT_READ_CAP.max(s.inner.config.server.max_body_bytes),
            )?,
        };
        Ok(FileOptions {
            mode,
            mkdirs: self.mkdirs,
            max_bytes,
            ..FileOptions::default()
        })
    }
}

/// Write a file (atomically; binary-safe).
#[utoipa::path(
    put, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), FileQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 204, description = "Written"), (status = 400, description = "A bad field, or one above the service's ceiling (`server.limits`): named in `field`, with its value and the ceiling in `message`", body = ErrorBody), (status = 404, body = ErrorBody), (status = 413, body = ErrorBody), (status = 503, description = "Overloaded: the service's ceilings on work in flight (`server.limits.buffer_bytes`, `max_concurrent`) are reached and nothing ran (`overloaded`, retryable, with `Retry-After`); or shutting down", body = ErrorBody, headers(("Retry-After" = u64, description = "Seconds to wait before trying again, with kind `overloaded`"))), (status = 401, description = "No or a wrong bearer token", body = ErrorBody), (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody))
)]
async fn write_file(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    q: QueryResult,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let (q, opts, lease, _held) = file_call(&s, &caller, &id, q, Some(body.len())).await?;
    lease
        .write_file(&q.path, &body, &opts)
        .await
        .map_err(|e| ApiError::file(&e))?;
    Ok(StatusCode::NO_CONTENT)
}

/// Read a file.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), FileQuery),
    responses(
        (status = 200, content_type = "application/octet-stream", body = Vec<u8>),
        (status = 400, description = "A bad field, or one above the service's ceiling (`server.limits`): named in `field`, with its value and the ceiling in `message`", body = ErrorBody), (status = 404, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 503, description = "Overloaded: the service's ceilings on work in flight (`server.limits.buffer_bytes`, `max_concurrent`) are reached and nothing ran (`overloaded`, retryable, with `Retry-After`); or shutting down", body = ErrorBody, headers(("Retry-After" = u64, description = "Seconds to wait before trying again, with kind `overloaded`"))),
        (status = 401, description = "No or a wrong bearer token", body = ErrorBody), (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody),
    )
)]
async fn read_file(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    q: QueryResult,
) -> Result<Response, ApiError> {
    let (q, opts, lease, held) = file_call(&s, &caller, &id, q, None).await?;
    let bytes = lease
        .read_file(&q.path, &opts)
        .await
        .map_err(|e| ApiError::file(&e))?;
    Ok((
        held,
        [(header::CONTENT_TYPE, "application/octet-stream")],
        bytes,
    )
        .into_response())
}

/// List a directory: entries sorted by name, symlinks not followed.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/files/list", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), FileQuery),
    responses((status = 200, body = DirListing), (status = 400, description = "A bad field, or one above the service's ceiling (`server.limits`): named in `field`, with its value and the ceiling in `message`", body = ErrorBody), (status = 404, body = ErrorBody), (status = 503, description = "Overloaded: the service's ceilings on work in flight (`server.limits.buffer_bytes`, `max_concurrent`) are reached and nothing ran (`overloaded`, retryable, with `Retry-After`); or shutting down", body = ErrorBody, headers(("Retry-After" = u64, description = "Seconds to wait before trying again, with kind `overloaded`"))), (status = 401, description = "No or a wrong bearer token", body = ErrorBody), (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody))
)]
async fn list_files(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    q: QueryResult,
) -> Result<(Reservation, Json<DirListing>), ApiError> {
    let (q, opts, lease, held) = file_call(&s, &caller, &id, q, None).await?;
    let entries = lease
        .list_dir(&q.path, &opts)
        .await
        .map_err(|e| ApiError::file(&e))?;
    let listing = DirListing {
        path: q.path,
        entries: entries.iter().map(DirEntryBody::from).collect(),
    };
    Ok((held, Json(listing)))
}

/// Extract a tar archive under a directory (created if missing). Entries
/// that would land outside it are refused and nothing is extracted.
#[utoipa::path(
    put, path = "/v1/sandboxes/{id}/archive", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), FileQuery),
    request_body(content = Vec<u8>, content_type = "application/x-tar"),
    responses((status = 204, description = "Extracted"), (status = 400, description = "A bad field, or one above the service's ceiling (`server.limits`): named in `field`, with its value and the ceiling in `message`", body = ErrorBody), (status = 413, body = ErrorBody), (status = 503, description = "Overloaded: the service's ceilings on work in flight (`server.limits.buffer_bytes`, `max_concurrent`) are reached and nothing ran (`overloaded`, retryable, with `Retry-After`); or shutting down", body = ErrorBody, headers(("Retry-After" = u64, description = "Seconds to wait before trying again, with kind `overloaded`"))), (status = 401, description = "No or a wrong bearer token", body = ErrorBody), (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody))
)]
async fn upload_archive(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    q: QueryResult,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let (q, opts, lease, _held) = file_call(&s, &caller, &id, q, Some(body.len())).await?;
    lease
        .upload_tar(&q.path, &body, &opts)
        .await
        .map_err(|e| ApiError::file(&e))?;
    Ok(StatusCode::NO_CONTENT)
}

/// A tar archive of a file or directory.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/archive", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), FileQuery),
    responses(
        (status = 200, content_type = "application/x-tar", body = Vec<u8>),
        (status = 400, description = "A bad field, or one above the service's ceiling (`server.limits`): named in `field`, with its value and the ceiling in `message`", body = ErrorBody), (status = 404, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 503, description = "Overloaded: the service's ceilings on work in flight (`server.limits.buffer_bytes`, `max_concurrent`) are reached and nothing ran (`overloaded`, retryable, with `Retry-After`); or shutting down", body = ErrorBody, headers(("Retry-After" = u64, description = "Seconds to wait before trying again, with kind `overloaded`"))),
        (status = 401, description = "No or a wrong bearer token", body = ErrorBody), (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody),
    )
)]
async fn download_archive(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    q: QueryResult,
) -> Result<Response, ApiError> {
    let (q, opts, lease, held) = file_call(&s, &caller, &id, q, None).await?;
    let bytes = lease
        .download_tar(&q.path, &opts)
        .await
        .map_err(|e| ApiError::file(&e))?;
    Ok((held, [(header::CONTENT_TYPE, "application/x-tar")], bytes).into_response())
}

/// Is the service up, and does the daemon answer?
#[utoipa::path(
    get, path = "/v1/health", tag = "service",
    responses((status = 200, body = Health), (status = 503, body = Health))
)]
async fn health(State(s): State<AppState>) -> (StatusCode, Json<Health>) {
    let ping = tokio::time::timeout(Duration::from_secs(5), s.inner.runtime.ping()).await;
    let error = match ping {
        Ok(Ok(_)) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some("no answer within 5 s".to_string()),
    };
    let ok = error.is_none() && !s.inner.closing.load(Ordering::Acquire);
    (
        if ok {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        },
        Json(Health {
            status: if ok { "ok" } else { "degraded" }.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            daemon: DaemonHealth {
                endpoint: s.inner.runtime.endpoint().to_string(),
                reachable: error.is_none(),
                error,
            },
        }),
    )
}

/// Who the request acts as (its token's principal) and its quotas.
#[utoipa::path(
    get, path = "/v1/whoami", tag = "service",
    responses((status = 200, body = WhoAmI), (status = 401, description = "No or a wrong bearer token", body = ErrorBody), (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody))
)]
async fn whoami(State(s): State<AppState>, Caller(caller): Caller) -> Json<WhoAmI> {
    let quota = s
        .inner
        .tenancy
        .quota(&caller)
        .map(|(_, q)| q)
        .unwrap_or_default();
    Json(WhoAmI {
        principal: caller.id(),
        tenant: caller.tenant().map(str::to_string),
        max_sandboxes: quota.max_sandboxes,
        max_snapshots: quota.max_snapshots,
        max_snapshot_bytes: quota.max_snapshot_bytes,
    })
}

/// Prometheus metrics.
#[utoipa::path(
    get, path = "/metrics", tag = "service",
    responses((status = 200, content_type = "text/plain", body = String), (status = 401, description = "No or a wrong bearer token", body = ErrorBody), (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody))
)]
async fn metrics(State(s): State<AppState>, Caller(caller): Caller) -> Response {
    let usage = s
        .inner
        .usage
        .current()
        .await
        .map(|sample| s.inner.usage.view(sample, caller));
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.inner.metrics.render(usage),
    )
        .into_response()
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "corral",
        description = "Hardened container sandboxes for AI agents and RL rollouts: sandboxes by \
session key, commands with typed outcomes, shell sessions, files. Errors are JSON \
`{\"error\": {kind, message, field, retryable}}`. Every route but /v1/health needs \
`Authorization: Bearer TOKEN` (a local service without a configured token generates one and \
writes it to `server-IP-PORT.json` in its runtime directory; on its Unix socket the socket's \
owner needs none). The token decides who the request acts as: the operator \
(`server.admin_token`, or the Unix socket's owner) sees everything; a tenant (`server.token` is \
tenant `default`, `server.tenants` name more) sees only its own sandboxes, session keys and \
snapshots (plus the operator's `server.shared_snapshots`, read-only): anything else is answered \
404, as if absent, and a spent quota is a retryable 503 `capacity` with `Retry-After` \
(`GET /v1/whoami` says who you are). Requests with a browser `Origin` not in `server.allowed_origins`, or a `Host` \
that is not the service's, are refused (403); JSON bodies must be sent as `application/json` \
(415). What a client may put in a sandbox spec is limited by the service's policy: a refused \
field is a 403 naming it. The operator's ceilings (`server.limits`) bound what one request may ask \
for (`max_output`, `timeout_ms`, stdin, `max_bytes`: above one is a 400 naming the field, its value \
and the ceiling) and what all requests in flight hold together: past that budget, or past the \
caller's share of it (`server.limits.share_percent` of the bytes and slots for each tenant, and \
for each address no token names), a request is refused before anything runs with 503 \
`overloaded` (retryable, `Retry-After`). Credentials are checked before any of a request's body \
is read (a 401 is answered unread); a body is reserved as its bytes arrive and must arrive \
within `server.limits.body_timeout_ms`, else the request is answered 408 `request_timeout`. \
The E2B-compatible API (for the `e2b` SDK: its control plane `/sandboxes`, `/v2/sandboxes` and \
the in-sandbox `envd` protocol, Connect-RPC `process.Process` and `filesystem.Filesystem`, \
`/files`, `/health`) is not part of this document: it is served on its own listener \
(`server.e2b_listen`, `corral serve --e2b-listen`), its contract is E2B's (the `e2b` SDK, and \
the `.proto` files under `spec/envd` of e2b-dev/E2B), and README's \"Using the e2b SDK\" says \
what differs.",
    ),
    components(schemas(OutputChunk, ErrorDetail, FailureBody, ContainerStateBody)),
    tags(
        (name = "sandboxes", description = "Sandboxes by session key"),
        (name = "commands", description = "One-off commands with typed outcomes"),
        (name = "code", description = "Code contexts: stateful Jupyter kernels with rich results"),
        (name = "shells", description = "Stateful shell sessions"),
        (name = "files", description = "Files and archives"),
        (name = "snapshots", description = "Snapshots of sandboxes and forks from them"),
        (name = "templates", description = "Environments built from a Dockerfile or steps, in sandboxes, cached"),
        (name = "images", description = "Images sandboxes may use, and pulls of missing ones"),
        (name = "ports", description = "Links to servers listening inside sandboxes"),
        (name = "service", description = "Health and metrics"),
    )
)]
struct ApiDoc;

fn api_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(create_sandbox, list_sandboxes))
        .routes(routes!(get_sandbox, delete_sandbox))
        .routes(routes!(reset_sandbox))
        .routes(routes!(pause_sandbox))
        .routes(routes!(resume_sandbox))
        .routes(routes!(exec))
        .routes(routes!(exec_stream))
        .routes(routes!(exec_input))
        .routes(routes!(code::run_code))
        .routes(routes!(code::create_context, code::list_contexts))
        .routes(routes!(code::delete_context))
        .routes(routes!(shell_exec))
        .routes(routes!(list_shells))
        .routes(routes!(close_shell))
        .routes(routes!(write_file, read_file))
        .routes(routes!(list_files))
        .routes(routes!(upload_archive, download_archive))
        .routes(routes!(snapshots::take_snapshot))
        .routes(routes!(snapshots::list_snapshots))
        .routes(routes!(snapshots::get_snapshot, snapshots::delete_snapshot))
        .routes(routes!(snapshots::fork))
        .routes(routes!(
            templates::build_template,
            templates::list_templates
        ))
        .routes(routes!(templates::get_template, templates::delete_template))
        .routes(routes!(ports::port_link))
        .routes(routes!(usage::sandbox_usage))
        .routes(routes!(usage::all_usage))
        .routes(routes!(events::events))
        .routes(routes!(egress::egress_counts))
        .routes(routes!(images::list_images))
        .routes(routes!(images::pull_image))
        .routes(routes!(health))
        .routes(routes!(whoami))
        .routes(routes!(metrics))
}

/// The OpenAPI document of the API.
pub fn openapi() -> utoipa::openapi::OpenApi {
    api_router().split_for_parts().1
}

/// The OpenAPI document as YAML, as committed in `docs/openapi.yaml`.
pub fn openapi_yaml() -> String {
    let value = serde_json::to_value(openapi()).unwrap_or_default();
    yaml_serde::to_string(&value).unwrap_or_default()
}

/// The API's routes over `state`, the OpenAPI document at `/openapi.json`
/// and `/openapi.yaml` included; no auth or body limit (see
/// [`crate::serve`]).
pub fn router(state: AppState) -> axum::Router {
    let (router, doc) = api_router().split_for_parts();
    let json = serde_json::to_string_pretty(&doc).unwrap_or_default();
    let yaml = openapi_yaml();
    router
        .route(
            "/openapi.json",
            axum::routing::get(move || async move {
                ([(header::CONTENT_TYPE, "application/json")], json)
            }),
        )
        .route(
            "/openapi.yaml",
            axum::routing::get(move || async move {
                ([(header::CONTENT_TYPE, "application/yaml")], yaml)
            }),
        )
        .route("/dashboard", axum::routing::get(crate::dashboard::page))
        .fallback(|| async { ApiError::not_found("no such route") })
        .with_state(state)
}

/// The port-link listener's routes over `state`: the links, routed by
/// their host names (`PORT-SANDBOXID.DOMAIN`, [`ports::proxy`]), and
/// nothing else, neither the API nor the dashboard nor MCP; no guard or
/// body limit (see [`crate::serve`]).
pub fn port_router(state: AppState) -> axum::Router {
    axum::Router::new().fallback(ports::proxy).with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unlisted_image_runs_only_when_the_engine_knows_it_holds_it() {
        assert!(unlisted_image("image", "alpine:3", "Docker", ImagePresence::Present).is_ok());
        let absent = unlisted_image("image", "alpine:3", "Docker", ImagePresence::Absent)
            .expect_err("refused");
        assert_eq!(absent.status, StatusCode::FORBIDDEN);
        assert_eq!(absent.detail.field.as_deref(), Some("image"));
        assert!(absent.detail.message.contains("not on the daemon"));
        // The message names the line that would allow it.
        assert!(
            absent
                .detail
                .message
                .contains("add `- 'alpine:*'` (or the image itself) under server.policy.images"),
            "{}",
            absent.detail.message
        );
        assert_eq!(allow_pattern("python:3.12-slim"), "python:*");
        assert_eq!(allow_pattern("reg:5000/a/b"), "reg:5000/a/b:*");
        assert_eq!(allow_pattern("ghcr.io/x/y:1"), "ghcr.io/x/y:*");
        assert_eq!(allow_pattern("x@sha256:ab"), "x@sha256:ab");
        let unknown = unlisted_image(
            "spec.image",
            "alpine:3",
            "Kubernetes",
            ImagePresence::Unknown,
        )
        .expect_err("refused: the nodes might pull it");
        assert_eq!(unknown.status, StatusCode::FORBIDDEN);
        assert_eq!(unknown.detail.field.as_deref(), Some("spec.image"));
        let text = &unknown.detail.message;
        assert!(
            text.contains("spec.image 'alpine:3'")
                && text.contains("Kubernetes backend cannot tell")
                && text.contains("server.policy.images"),
            "{text}"
        );
    }

    #[test]
    fn exec_requests_are_checked_field_by_field() {
        let c = Ceilings::new(&Default::default(), 64 << 20);
        let bad = |req: ExecRequest| command(req, &c).expect_err("rejected").detail;
        let e = bad(ExecRequest::default());
        assert_eq!(e.field.as_deref(), Some("command"));
        let e = bad(ExecRequest {
            argv: Some(vec![]),
            ..ExecRequest::default()
        });
        assert_eq!(e.field.as_deref(), Some("argv"));
        let e = bad(ExecRequest {
            command: Some("true".into()),
            timeout_ms: Some(0),
            ..ExecRequest::default()
        });
        assert_eq!(e.field.as_deref(), Some("timeout_ms"));
        let e = bad(ExecRequest {
            command: Some("true".into()),
            stdin_base64: Some("***".into()),
            ..ExecRequest::default()
        });
        assert_eq!(e.field.as_deref(), Some("stdin_base64"));
        let e = bad(ExecRequest {
            command: Some("true".into()),
            env: [("A=B".to_string(), "x".to_string())].into(),
            ..ExecRequest::default()
        });
        assert_eq!(e.field.as_deref(), Some("env.A=B"));
        let ok = command(
            ExecRequest {
                argv: Some(vec!["cat".into()]),
                stdin_base64: Some("aGk=".into()),
                timeout_ms: Some(1500),
                ..ExecRequest::default()
            },
            &c,
        )
        .expect("valid");
        assert_eq!(ok.stdin.as_deref(), Some(&b"hi"[..]));
        assert_eq!(ok.timeout, Some(Duration::from_millis(1500)));
        assert!(
            !ok.wait_for_output,
            "the default is the main process's exit"
        );
        let body = r#"{"command": "true", "wait_for_output": true}"#;
        let req: ExecRequest = serde_json::from_str(body).expect("parses");
        assert!(command(req, &c).expect("valid").wait_for_output);
        let plain = command(
            ExecRequest {
                command: Some("true".into()),
                ..ExecRequest::default()
            },
            &c,
        )
        .expect("valid");
        assert_eq!(
            plain.timeout,
            Some(Duration::from_millis(c.limits().max_timeout_ms)),
            "no timeout takes the ceiling"
        );
        assert_eq!(plain.max_output, corral_core::command::DEFAULT_MAX_OUTPUT);
        let e = bad(ExecRequest {
            command: Some("true".into()),
            max_output: Some(c.limits().max_output + 1),
            ..ExecRequest::default()
        });
        assert_eq!(e.field.as_deref(), Some("max_output"));
        assert!(
            e.message.contains("server.limits.max_output"),
            "{}",
            e.message
        );
        let e = bad(ExecRequest {
            command: Some("cat".into()),
            stdin: Some("x".repeat(c.limits().max_stdin_bytes as usize + 1)),
            ..ExecRequest::default()
        });
        assert_eq!(e.field.as_deref(), Some("stdin"));
    }

    #[test]
    fn names() {
        assert!(valid_name("episode-7.a_b"));
        assert!(!valid_name(""));
        assert!(!valid_name("a/b"));
        assert!(!valid_name(&"x".repeat(MAX_NAME + 1)));
    }

    #[test]
    fn the_committed_openapi_document_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.yaml");
        let now = openapi_yaml();
        if std::env::var_os("CORRAL_UPDATE_OPENAPI").is_some() {
            std::fs::write(path, &now).expect("write docs/openapi.yaml");
        }
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == now,
            "docs/openapi.yaml differs from the API; regenerate it with \
             `CORRAL_UPDATE_OPENAPI=1 cargo test -p corral-server openapi` and commit it"
        );
    }
}
