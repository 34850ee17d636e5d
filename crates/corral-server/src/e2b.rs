//! The E2B-compatible front end: the `e2b` SDK (and every framework built
//! on it) runs on corral by setting `E2B_API_URL` and `E2B_SANDBOX_URL` to
//! this listener (`server.e2b_listen`) and `E2B_API_KEY` to a corral token.
//!
//! One listener serves both halves of E2B's protocol, whose paths do not
//! overlap: the control plane (`control.rs`: REST, `X-API-KEY`) and the
//! in-sandbox daemon `envd` (`process.rs`, `filesystem.rs`: Connect-RPC
//! with the JSON codec, framed by `connect.rs`; `/files` and `/health`),
//! which the SDK sends to one address naming the sandbox in the
//! `E2b-Sandbox-Id` header. It is a listener of its own, not a path prefix
//! of the main one, because the SDK builds `/files` URLs with an absolute
//! path (a prefix in `E2B_SANDBOX_URL` is dropped), and E2B's
//! authentication headers are not the main listener's bearer token.
//!
//! This is a second front end over the same runtime, never a second
//! runtime: a sandbox is created by [`AppState::create`] (client policy,
//! tenant quota, provider session key) for the principal whose token is
//! the API key ([`ServerConfig::principal_of_token`], as the bearer guard
//! does), and every later call reaches it through [`AppState::lease`] as
//! that principal, so another tenant's key finds nothing. Each sandbox
//! gets a fresh `envdAccessToken`, a secret that opens that sandbox's envd
//! calls only, and a distinct `trafficAccessToken` that opens its private
//! ports and the code interpreter's context calls, never a command or a
//! file (`Opener`). Commands run through [`corral::Sandbox::exec`],
//! files through the sandbox's file API.
//!
//! E2B's own semantics live here only: a sandbox's `timeout` is its
//! lifetime (a timer releases it, or with `autoPause` pauses it), a command's `timeout` kills it, a
//! non-zero exit is an `end` event the SDK turns into
//! `CommandExitException`; `pause` freezes the sandbox with its memory
//! ([`corral::Sandbox::pause`]: Docker's cgroup freezer; a typed 501 where
//! the engine cannot) and stops its timer until `resume` or `connect`.

mod code;
mod connect;
mod control;
mod filesystem;
mod process;
mod snapshots;
mod templates;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use corral::Lease;
use corral_core::config::{AuthMode, ServerConfig};
use corral_core::principal::{Principal, DEFAULT_TENANT};

use crate::api::{AppState, Observed};
use crate::error::ApiError;
use crate::guard::{has_body, Admitted};
use connect::{Code, RpcError};
use control::E2bError;

/// The `envd` version the service reports: the SDK picks its wire format by
/// it (0.5.7: stdin on demand, `CloseStdin`, octet-stream uploads). Below
/// 0.6.2, which gates `files.write(metadata=...)` (user extended
/// attributes, not kept here); owner, group and times of entries are read
/// from any version's answers.
pub const ENVD_VERSION: &str = "0.5.7";

/// A new E2B sandbox id: `i` and 40 hex digits (160 random bits). The id
/// alone opens the ports of a sandbox with public traffic (E2B's default),
/// so it is a secret as strong as E2B's; 41 characters keep
/// `PORT-ID.DOMAIN` inside a 63-byte DNS label.
fn new_sandbox_id() -> String {
    format!("i{}", corral::host::random_hex(40))
}

/// envd's port, as the SDK names it in `E2b-Sandbox-Port`.
const ENVD_PORT: &str = "49983";

/// The state of the E2B front end; cheap to clone.
#[derive(Clone)]
pub struct E2b {
    app: AppState,
    sandboxes: Arc<Mutex<HashMap<String, Arc<Entry>>>>,
    /// Snapshots taken under forks, with their owners, until the engine
    /// lets them go (`snapshots.rs`).
    fork_bases: Arc<Mutex<Vec<(Principal, String)>>>,
    /// E2B's template names, tags and builds (`templates.rs`).
    templates: Arc<templates::Registry>,
}

/// One sandbox created through this front end.
struct Entry {
    /// Its E2B id, which is also its session key under `owner`.
    id: String,
    owner: Principal,
    template: String,
    /// The envd access token (`envdAccessToken`): opens this sandbox's
    /// envd calls (commands, files) and the code interpreter's.
    token: String,
    /// The traffic access token (`trafficAccessToken`), a secret of its
    /// own: opens the sandbox's ports through the relay when it was
    /// created with `allowPublicTraffic: false`, and the code
    /// interpreter's context calls (which E2B's SDK sends with this token
    /// alone); never a command or a file.
    traffic: String,
    metadata: BTreeMap<String, String>,
    /// The address the SDK reached this listener at (`Host` of the create
    /// call): E2B's sandbox `domain`, under which `get_host(port)` names
    /// `PORT-ID.DOMAIN`.
    domain: Option<String>,
    /// `envVars` of the create request, given to every command.
    envs: BTreeMap<String, String>,
    started_at: SystemTime,
    /// When its lifetime (`timeout`) ends, and the timer that releases it.
    end: Mutex<(SystemTime, Option<tokio::task::AbortHandle>)>,
    /// Processes started through `process.Process`, by pid.
    procs: process::Table,
    /// Watchers of `CreateWatcher`, by id.
    watchers: Mutex<HashMap<String, Arc<filesystem::Watcher>>>,
    /// Whether its ports are reached through `get_host` without the
    /// traffic access token (E2B's `allowPublicTraffic`, default true).
    public: bool,
    /// `autoPause`: paused, not released, when its timeout passes.
    auto_pause: bool,
    /// Frozen by `pause` (its lifetime timer stopped) until resumed.
    paused: std::sync::atomic::AtomicBool,
}

impl Entry {
    fn is_paused(&self) -> bool {
        self.paused.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// The note ([`corral::Sandbox::set_note`]) that carries a sandbox's E2B
/// identity into its record when it is paused to disk.
const E2B_NOTE: &str = "e2b";

/// What of an [`Entry`] outlives the service with a sandbox paused to
/// disk: its identity, tokens and what its creator asked for.
#[derive(serde::Serialize, serde::Deserialize)]
struct Noted {
    template: String,
    token: String,
    traffic: String,
    metadata: BTreeMap<String, String>,
    domain: Option<String>,
    envs: BTreeMap<String, String>,
    /// Unix seconds.
    started_at: u64,
    public: bool,
    auto_pause: bool,
}

impl Noted {
    fn of(e: &Entry) -> Noted {
        Noted {
            template: e.template.clone(),
            token: e.token.clone(),
            traffic: e.traffic.clone(),
            metadata: e.metadata.clone(),
            domain: e.domain.clone(),
            envs: e.envs.clone(),
            started_at: e
                .started_at
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            public: e.public,
            auto_pause: e.auto_pause,
        }
    }
}

impl E2b {
    /// The front end over `app` (the service's one state).
    pub fn new(app: AppState) -> E2b {
        E2b {
            app,
            sandboxes: Arc::new(Mutex::new(HashMap::new())),
            fork_bases: Arc::new(Mutex::new(Vec::new())),
            templates: Arc::default(),
        }
    }

    /// Serves again, paused, the E2B sandboxes among those an earlier
    /// service paused to disk (`recovered`, from
    /// [`AppState::recover_paused`]): same id, tokens and metadata, so the
    /// SDK's `connect` resumes them; the lifetime starts again at resume.
    pub fn recover(&self, recovered: &[(String, BTreeMap<String, String>)]) {
        for (key, notes) in recovered {
            let Some(noted) = notes.get(E2B_NOTE) else {
                continue;
            };
            let noted: Noted = match serde_json::from_str(noted) {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(session = %key, error = %e, "cannot read the E2B note of a sandbox paused to disk; it is served on the main API only");
                    continue;
                }
            };
            let Some(owner) = notes
                .get(crate::api::OWNER_NOTE)
                .and_then(|o| Principal::from_id(o))
            else {
                continue;
            };
            let id = owner.display_key(key);
            let entry = Arc::new(Entry {
                id: id.clone(),
                owner,
                template: noted.template,
                token: noted.token,
                traffic: noted.traffic,
                metadata: noted.metadata,
                domain: noted.domain,
                envs: noted.envs,
                started_at: SystemTime::UNIX_EPOCH
                    + std::time::Duration::from_secs(noted.started_at),
                end: Mutex::new((SystemTime::now(), None)),
                procs: Default::default(),
                watchers: Default::default(),
                public: noted.public,
                auto_pause: noted.auto_pause,
                paused: std::sync::atomic::AtomicBool::new(true),
            });
            tracing::info!(sandbox = %id, "serving an e2b sandbox an earlier service paused to disk");
            self.registry().insert(id, entry);
        }
    }

    /// Notes `entry` on its sandbox, for [`E2b::recover`].
    fn note(&self, entry: &Entry) {
        let key = entry.owner.session_key(&entry.id);
        let Some(sandbox) = self.app.provider().peek(&key) else {
            return;
        };
        match serde_json::to_string(&Noted::of(entry)) {
            Ok(text) => sandbox.set_note(E2B_NOTE, text),
            Err(e) => tracing::warn!(sandbox = %entry.id, error = %e, "cannot note an e2b sandbox"),
        }
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Entry>>> {
        // Plain map updates: a panic cannot leave one half-done.
        self.sandboxes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn entry(&self, id: &str) -> Option<Arc<Entry>> {
        self.registry().get(id).cloned()
    }

    /// The sandbox whose access token is `token` (compared in constant
    /// time with each).
    fn by_token(&self, token: &str) -> Option<String> {
        self.by_secret(token, |e| &e.token)
    }

    /// The sandbox whose traffic access token is `token`.
    fn by_traffic_token(&self, token: &str) -> Option<String> {
        self.by_secret(token, |e| &e.traffic)
    }

    /// The sandbox whose secret `pick` is `token`, compared in constant
    /// time with each.
    fn by_secret(&self, token: &str, pick: fn(&Entry) -> &String) -> Option<String> {
        if token.is_empty() {
            return None;
        }
        let mut found = None;
        for e in self.registry().values() {
            if same_bytes(token.as_bytes(), pick(e).as_bytes()) {
                found = Some(e.id.clone());
            }
        }
        found
    }

    /// Stops the lifetime timer of `entry` (while it is paused).
    fn disarm_timer(&self, entry: &Entry) {
        if let Some(timer) = lock(&entry.end).1.take() {
            timer.abort();
        }
    }

    /// Forgets `id` and stops its lifetime timer.
    fn forget(&self, id: &str) -> Option<Arc<Entry>> {
        let entry = self.registry().remove(id)?;
        if let Some(timer) = lock(&entry.end).1.take() {
            timer.abort();
        }
        Some(entry)
    }

    /// Moves `entry`'s end to `life` from now unless it is later already
    /// (E2B's `connect` and keep-alive refreshes never shorten it).
    fn extend_timer(&self, entry: &Arc<Entry>, life: std::time::Duration) {
        let wanted = SystemTime::now() + life;
        if wanted > lock(&entry.end).0 {
            self.arm_timer(entry, wanted);
        }
    }

    /// Releases `id` when `end` comes, unless its timeout changes first.
    fn arm_timer(&self, entry: &Arc<Entry>, end: SystemTime) {
        let this = self.clone();
        let id = entry.id.clone();
        let owner = entry.owner.clone();
        let wait = end.duration_since(SystemTime::now()).unwrap_or_default();
        let auto_pause = entry.auto_pause;
        let task = tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            if auto_pause && this.pause_at_timeout(&id, &owner).await {
                return;
            }
            if this.registry().remove(&id).is_some() {
                tracing::info!(sandbox = %id, "e2b sandbox reached the end of its timeout; releasing it");
                if let Err(e) = this.app.release(&owner, &id).await {
                    tracing::warn!(sandbox = %id, error = %e.detail.message, "cannot release an expired e2b sandbox");
                }
                this.sweep_fork_bases().await;
            }
        });
        let mut slot = lock(&entry.end);
        if let Some(old) = slot.1.replace(task.abort_handle()) {
            old.abort();
        }
        slot.0 = end;
    }
}

impl E2b {
    /// `autoPause`: freezes `id` when its timeout passes, as `pause` does
    /// (its memory kept, until `connect` or `resume`); false when it cannot
    /// (gone, or an engine without pause), and it is then released as any
    /// other.
    async fn pause_at_timeout(&self, id: &str, owner: &Principal) -> bool {
        let Some(entry) = self.entry(id) else {
            return false;
        };
        let lease = match self.app.lease(owner, id).await {
            Ok(l) => l,
            Err(_) => return false,
        };
        match lease.pause().await {
            Ok(()) => {
                entry
                    .paused
                    .store(true, std::sync::atomic::Ordering::Release);
                // This timer is over; `connect` or `resume` arms the next.
                lock(&entry.end).1 = None;
                tracing::info!(sandbox = %id, "e2b sandbox reached the end of its timeout; paused (autoPause)");
                true
            }
            Err(e) => {
                tracing::warn!(sandbox = %id, error = %e, "cannot pause an e2b sandbox at its timeout (autoPause); releasing it");
                false
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The principal an `X-API-KEY` stands for: the same tokens, and the same
/// answer, as the bearer guard of the main listener.
fn principal_of_key(server: &ServerConfig, headers: &HeaderMap) -> Result<Principal, E2bError> {
    if server.auth == AuthMode::None {
        return Ok(Principal::Tenant(DEFAULT_TENANT.to_string()));
    }
    let given = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .unwrap_or("");
    if given.is_empty() {
        return Err(control::error(
            StatusCode::UNAUTHORIZED,
            "header X-API-KEY is missing: set E2B_API_KEY to one of the service's tokens",
        ));
    }
    server.principal_of_token(given).ok_or_else(|| {
        control::error(
            StatusCode::UNAUTHORIZED,
            "header X-API-KEY: not one of the service's tokens",
        )
    })
}

impl E2b {
    /// The door's check of E2B's credentials ([`crate::guard`]), before any
    /// of a request's body is read: a relay to a sandbox's port streams on
    /// (its traffic token is checked by [`sandbox_port`]); an API key
    /// names its tenant (a wrong one is refused here); a sandbox's access
    /// token, or a signed URL's signature, names the sandbox's owner. A
    /// request with a body and none of them is refused 401; one without a
    /// body goes on to its route, which answers it as E2B would.
    pub(crate) fn admit(&self, req: &axum::extract::Request) -> Result<Admitted, Box<Response>> {
        let headers = req.headers();
        if other_port(headers).is_some() {
            return Ok(Admitted {
                principal: None,
                relayed: true,
            });
        }
        let server = &self.app.config().server;
        let principal = if server.auth == AuthMode::None {
            Some(Principal::Tenant(DEFAULT_TENANT.to_string()))
        } else if headers.contains_key("x-api-key") {
            match principal_of_key(server, headers) {
                Ok(p) => Some(p),
                Err(e) if has_body(req) => return Err(Box::new(e.into_response())),
                Err(_) => None,
            }
        } else {
            self.token_owner(req)
        };
        if principal.is_none() && has_body(req) {
            let message = "this request carries no credential of this service: X-API-KEY (set \
                           E2B_API_KEY to one of the service's tokens), or a sandbox's \
                           X-Access-Token or signed URL";
            let path = req.uri().path();
            return Err(Box::new(
                if path.starts_with("/process.") || path.starts_with("/filesystem.") {
                    RpcError::new(Code::Unauthenticated, message).into_response()
                } else {
                    control::error(StatusCode::UNAUTHORIZED, message).into_response()
                },
            ));
        }
        Ok(Admitted {
            principal,
            relayed: false,
        })
    }

    /// The owner of the sandbox whose access token (or traffic token, the
    /// code interpreter's) `req` carries, or whose token signed its URL.
    fn token_owner(&self, req: &axum::extract::Request) -> Option<Principal> {
        let headers = req.headers();
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        // Each header against its own kind of secret: the routes decide
        // what each opens.
        let by_envd = header("x-access-token").and_then(|t| self.by_token(t));
        let id = by_envd
            .or_else(|| header("e2b-traffic-access-token").and_then(|t| self.by_traffic_token(t)));
        if let Some(id) = id {
            return self.entry(&id).map(|e| e.owner.clone());
        }
        let query = req.uri().query()?;
        if let Some(owner) = templates::upload_owner(self, req.uri().path(), query) {
            return Some(owner);
        }
        let q: HashMap<String, String> = serde_urlencoded::from_str(query).ok()?;
        let signature = q.get("signature")?;
        let expiration = match q.get("signature_expiration") {
            Some(at) => Some(at.parse::<i64>().ok()?),
            None => None,
        };
        let operation = if req.method() == axum::http::Method::GET {
            "read"
        } else {
            "write"
        };
        let signed = Signed {
            signature,
            expiration,
            path: q.get("path").map_or("", String::as_str),
            operation,
            user: q.get("username").map_or("", String::as_str),
        };
        let entries: Vec<Arc<Entry>> = self.registry().values().cloned().collect();
        entries
            .into_iter()
            .find(|e| {
                same_bytes(
                    signed.expected(&e.token).as_bytes(),
                    signed.signature.as_bytes(),
                )
            })
            .map(|e| e.owner.clone())
    }
}

/// A browser page may not drive this listener: any `Origin` not in
/// `server.allowed_origins` is refused, as on the main listener.
fn check_origin(server: &ServerConfig, headers: &HeaderMap) -> Result<(), E2bError> {
    let Some(origin) = headers.get("origin") else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or("").trim_end_matches('/');
    let allowed = server
        .allowed_origins
        .iter()
        .any(|o| o.trim_end_matches('/').eq_ignore_ascii_case(origin));
    if allowed {
        Ok(())
    } else {
        Err(control::error(
            StatusCode::FORBIDDEN,
            format!("header Origin '{origin}' is not in server.allowed_origins"),
        ))
    }
}

/// The sandbox an envd call is for, checked against its access token, and
/// its lease taken as its owner.
struct Envd {
    entry: Arc<Entry>,
    lease: Lease,
}

impl E2b {
    async fn envd(&self, headers: &HeaderMap) -> Result<Envd, RpcError> {
        self.envd_on(headers, ENVD_PORT).await
    }

    /// [`E2b::envd`] for the in-sandbox server on `served` (envd's port, or
    /// the code interpreter's: `code.rs`).
    async fn envd_on(&self, headers: &HeaderMap, served: &str) -> Result<Envd, RpcError> {
        let (entry, gone) = self.envd_entry(headers, served, Opener::Envd)?;
        self.envd_lease(entry, gone).await
    }

    /// The code interpreter's context calls (create, list, restart,
    /// remove: no code runs), which E2B's SDK sends with the traffic
    /// access token only: opened by it or by the envd token.
    async fn code_contexts(&self, headers: &HeaderMap) -> Result<Envd, RpcError> {
        let (entry, gone) = self.envd_entry(headers, code::JUPYTER_PORT, Opener::EnvdOrTraffic)?;
        self.envd_lease(entry, gone).await
    }

    /// [`E2b::envd`] for a signed file URL (`signature`, as the SDK's
    /// `download_url`/`upload_url` make it): no access token is sent; the
    /// signature is keyed by it. E2B's v1 signature is `v1_` and the
    /// unpadded base64 of SHA-256 over `PATH:OPERATION:USER:TOKEN`, with
    /// `:EXPIRATION` (Unix seconds) when the URL expires. A URL through
    /// `E2B_SANDBOX_URL` names no sandbox, so the signature does: every
    /// sandbox's token is tried (one hash each), or only the named one's.
    async fn envd_signed(
        &self,
        headers: &HeaderMap,
        signed: &Signed<'_>,
    ) -> Result<Envd, RpcError> {
        check_origin(&self.app.config().server, headers)
            .map_err(|_| RpcError::new(Code::PermissionDenied, "header Origin is not allowed"))?;
        let named = sandbox_id(headers).ok();
        let candidates: Vec<Arc<Entry>> = match &named {
            Some(id) => self.entry(id).into_iter().collect(),
            None => self.registry().values().cloned().collect(),
        };
        let entry = candidates
            .into_iter()
            .find(|e| {
                same_bytes(
                    signed.expected(&e.token).as_bytes(),
                    signed.signature.as_bytes(),
                )
            })
            .ok_or_else(|| {
                RpcError::new(
                    Code::Unauthenticated,
                    "signature does not open this path for this operation and user",
                )
            })?;
        if let Some(at) = signed.expiration {
            let now = SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            if at < 0 || (at as u64) < now {
                return Err(RpcError::new(
                    Code::Unauthenticated,
                    "signature is already expired",
                ));
            }
        }
        not_paused(&entry)?;
        let gone = envd_gone(&entry.id);
        self.envd_lease(entry, gone).await
    }

    /// The lease of an envd call's sandbox; `gone` when it ended.
    async fn envd_lease(&self, entry: Arc<Entry>, gone: RpcError) -> Result<Envd, RpcError> {
        let lease = match self.app.lease(&entry.owner, &entry.id).await {
            Ok(l) => l,
            Err(e) if e.status == StatusCode::NOT_FOUND => {
                self.forget(&entry.id);
                return Err(gone);
            }
            Err(e) => return Err(RpcError::from(e)),
        };
        Ok(Envd { entry, lease })
    }

    /// The sandbox an envd call names, checked as [`E2b::envd`] does, looked
    /// at without using it ([`AppState::observed`]): a probe (`/health`,
    /// the SDK's `is_running`) is not activity for the idle timeout.
    fn envd_observed(&self, headers: &HeaderMap) -> Result<corral::Sandbox, RpcError> {
        let (entry, gone) = self.envd_entry(headers, ENVD_PORT, Opener::Envd)?;
        match self.app.observed(&entry.owner, &entry.id) {
            Ok(Observed::Live(sandbox)) => Ok(sandbox),
            Ok(Observed::Lost(f)) => Err(RpcError::from(ApiError::failure(&f))),
            Err(e) if e.status == StatusCode::NOT_FOUND => {
                self.forget(&entry.id);
                Err(gone)
            }
            Err(e) => Err(RpcError::from(e)),
        }
    }

    /// The entry an envd call for the server on `served` names, its access
    /// token checked (`opener`: which tokens open it), with the error that
    /// reports it gone.
    fn envd_entry(
        &self,
        headers: &HeaderMap,
        served: &str,
        opener: Opener,
    ) -> Result<(Arc<Entry>, RpcError), RpcError> {
        check_origin(&self.app.config().server, headers)
            .map_err(|_| RpcError::new(Code::PermissionDenied, "header Origin is not allowed"))?;
        if let Some(port) = headers.get("e2b-sandbox-port") {
            let port = port.to_str().unwrap_or("");
            if port.trim() != served {
                return Err(RpcError::unimplemented(
                    &format!("header E2b-Sandbox-Port '{port}'"),
                    &format!(
                        "this call is served on port {served}; envd is port 49983, the code \
                         interpreter 49999"
                    ),
                ));
            }
        }
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
        };
        let given = header("x-access-token");
        // The access token alone names its sandbox: SDKs that connect to
        // an existing sandbox without sending `E2b-Sandbox-Id` (2.7 to
        // 2.9) are routed by it.
        let id = match sandbox_id(headers) {
            Ok(id) => id,
            Err(e) => match self.by_token(given) {
                Some(id) => id,
                None => return Err(e),
            },
        };
        // As E2B's proxy answers: an unknown (or ended) sandbox "was not
        // found" (the SDK then reports it not running); a known one with
        // another token is refused. Ids are random: telling that one
        // exists opens nothing.
        let entry = self.entry(&id).ok_or_else(|| envd_gone(&id))?;
        not_paused(&entry)?;
        let by_envd = !given.is_empty() && same_bytes(given.as_bytes(), entry.token.as_bytes());
        let traffic = header("e2b-traffic-access-token");
        let by_traffic = opener == Opener::EnvdOrTraffic
            && !traffic.is_empty()
            && same_bytes(traffic.as_bytes(), entry.traffic.as_bytes());
        if !(by_envd || by_traffic) {
            let which = match opener {
                Opener::Envd => "header X-Access-Token (the envdAccessToken)",
                Opener::EnvdOrTraffic => {
                    "header X-Access-Token or E2b-Traffic-Access-Token (the trafficAccessToken)"
                }
            };
            return Err(RpcError::new(
                Code::Unauthenticated,
                format!("{which} does not open sandbox '{id}'"),
            ));
        }
        Ok((entry, envd_gone(&id)))
    }
}

/// Which of a sandbox's tokens open a call.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Opener {
    /// The envd access token only: commands, files, code.
    Envd,
    /// Either token: the code interpreter's context calls.
    EnvdOrTraffic,
}

/// envd's answer for a sandbox that ended or never was, as E2B's proxy
/// answers (the SDK then reports it not running).
fn envd_gone(id: &str) -> RpcError {
    RpcError::new(
        Code::Unavailable,
        format!("sandbox '{id}' was not found (killed, or its timeout passed)"),
    )
}

/// Refuses an envd call on a paused sandbox.
fn not_paused(entry: &Entry) -> Result<(), RpcError> {
    if entry.is_paused() {
        return Err(RpcError::new(
            Code::Unavailable,
            format!(
                "sandbox '{}' is paused: connect to it (Sandbox.connect) to resume it",
                entry.id
            ),
        ));
    }
    Ok(())
}

/// The sandbox an envd call names: `E2b-Sandbox-Id` (what the SDK sends
/// with `E2B_SANDBOX_URL`), else a `Host` of the form `PORT-ID.DOMAIN`
/// (E2B's own addressing, for a proxy in front of this listener).
fn sandbox_id(headers: &HeaderMap) -> Result<String, RpcError> {
    if let Some(v) = headers.get("e2b-sandbox-id") {
        return match v.to_str() {
            Ok(id) if !id.trim().is_empty() => Ok(id.trim().to_string()),
            _ => Err(RpcError::invalid(
                "header E2b-Sandbox-Id",
                "is empty or not text",
            )),
        };
    }
    let host = headers
        .get("host")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let label = host.split('.').next().unwrap_or("");
    if host.contains('.') {
        if let Some((port, id)) = label.split_once('-') {
            if port.parse::<u16>().is_ok() && !id.is_empty() {
                return Ok(id.to_string());
            }
        }
    }
    Err(RpcError::invalid(
        "header E2b-Sandbox-Id",
        "is missing: set E2B_SANDBOX_URL to this listener so the SDK names the sandbox",
    ))
}

/// The user a call asks for (`Authorization: Basic base64(user:)`); `None`
/// for the sandbox's own. corral does not switch users inside a sandbox:
/// E2B's default user name `user`, and the sandbox's own user, are
/// accepted; any other is refused by name.
fn requested_user(headers: &HeaderMap, lease: &Lease) -> Result<(), RpcError> {
    let Some(v) = headers.get("authorization") else {
        return Ok(());
    };
    let text = v.to_str().unwrap_or("");
    let Some(b64) = text.strip_prefix("Basic ") else {
        return Err(RpcError::invalid(
            "header Authorization",
            "expected Basic credentials naming a user",
        ));
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|e| RpcError::invalid("header Authorization", e))?;
    let decoded = String::from_utf8_lossy(&decoded);
    let user = decoded.split(':').next().unwrap_or("");
    let own = lease.spec().security.user.clone();
    let own_name = own.as_deref().unwrap_or("root");
    let is_root = |u: &str| matches!(u, "root" | "0" | "0:0");
    let same = user.is_empty()
        || user == "user"
        || user == own_name
        || (own.is_none() && is_root(user))
        || own.as_deref().is_some_and(|o| is_root(o) && is_root(user));
    if same {
        Ok(())
    } else {
        Err(RpcError::invalid(
            "user",
            format!(
                "'{user}' is not available: this sandbox runs everything as '{own_name}' (its spec's \
                 user), and corral does not switch users inside a sandbox"
            ),
        ))
    }
}

/// What a signed file URL carries ([`E2b::envd_signed`]).
struct Signed<'a> {
    signature: &'a str,
    expiration: Option<i64>,
    /// The `path` query parameter as sent (before it is made absolute).
    path: &'a str,
    /// `read` (a download) or `write` (an upload).
    operation: &'a str,
    /// The `username` query parameter; empty for the default user.
    user: &'a str,
}

impl Signed<'_> {
    /// The signature this URL would carry for a sandbox whose access
    /// token is `token`.
    fn expected(&self, token: &str) -> String {
        use sha2::Digest;
        let mut raw = format!("{}:{}:{}:{token}", self.path, self.operation, self.user);
        if let Some(at) = self.expiration {
            raw.push_str(&format!(":{at}"));
        }
        let digest = sha2::Sha256::digest(raw.as_bytes());
        format!(
            "v1_{}",
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
        )
    }
}

/// Constant-time comparison of two secrets.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The E2B listener's routes over `e2b` (without the door: see
/// [`crate::door`] and [`crate::guard::Guard::e2b`]).
pub fn router(e2b: E2b) -> axum::Router {
    control::routes()
        .merge(process::routes())
        .merge(filesystem::routes())
        .merge(code::routes())
        .fallback(not_served)
        .with_state(e2b.clone())
        .layer(axum::middleware::from_fn_with_state(e2b, sandbox_port))
}

/// The sandbox and port a request is for when it is neither envd's nor the
/// code interpreter's: `Host: PORT-ID.DOMAIN` (what `get_host(port)`
/// names), or `E2b-Sandbox-Port` with `E2b-Sandbox-Id`.
fn other_port(headers: &HeaderMap) -> Option<Result<(String, u16), Response>> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let (id, port) = match (header("e2b-sandbox-port"), header("e2b-sandbox-id")) {
        (Some(port), id) => (id.map(str::to_string), port.to_string()),
        (None, _) => {
            let host = header("host")?;
            let (label, _) = host.split_once('.')?;
            let (port, id) = label.split_once('-')?;
            if id.is_empty() {
                return None;
            }
            (Some(id.to_string()), port.to_string())
        }
    };
    if port == ENVD_PORT || port == code::JUPYTER_PORT {
        return None;
    }
    let Some(port) = port.parse::<u16>().ok().filter(|p| *p > 0) else {
        return Some(Err(control::error(
            StatusCode::BAD_REQUEST,
            format!("port '{port}' (of E2b-Sandbox-Port or Host) is not a port (1 to 65535)"),
        )
        .into_response()));
    };
    match id {
        Some(id) if !id.is_empty() => Some(Ok((id, port))),
        _ => Some(Err(control::error(
            StatusCode::BAD_REQUEST,
            "header E2b-Sandbox-Id is missing: it names the sandbox whose port E2b-Sandbox-Port is",
        )
        .into_response())),
    }
}

/// Whether a request for `host` goes to a port of a sandbox through the
/// relay (`Host: PORT-ID.DOMAIN`, PORT neither envd's nor the code
/// interpreter's, and no E2B header naming another): a page that port
/// serves may then post to its own origin, which reaches only that port
/// (the listener's browser check, `guard.rs`).
pub(crate) fn relayed_to_its_port(host: &str, headers: &HeaderMap) -> bool {
    if headers.contains_key("e2b-sandbox-port") || headers.contains_key("e2b-sandbox-id") {
        return false;
    }
    let Some((label, _)) = host.split_once('.') else {
        return false;
    };
    let Some((port, id)) = label.split_once('-') else {
        return false;
    };
    let served = |p: u16, named: &str| named.parse::<u16>() == Ok(p);
    !id.is_empty()
        && port
            .parse::<u16>()
            .is_ok_and(|p| p > 0 && !served(p, ENVD_PORT) && !served(p, code::JUPYTER_PORT))
}

/// Headers of E2B's own that name or open a sandbox: never sent on to a
/// server inside it.
const E2B_HEADERS: [&str; 4] = [
    "e2b-traffic-access-token",
    "x-access-token",
    "e2b-sandbox-id",
    "e2b-sandbox-port",
];

/// A request for a port other than envd's and the code interpreter's (an
/// HTTP server the sandbox runs, reached through the SDK's
/// `get_host(port)`): relayed unbuffered to that port by the port-link
/// proxy's relay (WebSocket upgrades included). A sandbox created with
/// `allowPublicTraffic: false` needs its traffic access token
/// (`E2b-Traffic-Access-Token`); E2B's default is public, the sandbox id
/// (160 random bits) naming it. Everything else goes on to the routes.
async fn sandbox_port(
    axum::extract::State(e2b): axum::extract::State<E2b>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let (id, port) = match other_port(req.headers()) {
        None => return next.run(req).await,
        Some(Err(r)) => return r,
        Some(Ok(target)) => target,
    };
    let gone = || {
        control::error(
            StatusCode::BAD_GATEWAY,
            format!("sandbox '{id}' was not found (killed, or its timeout passed)"),
        )
        .into_response()
    };
    let Some(entry) = e2b.entry(&id) else {
        return gone();
    };
    if !entry.public {
        let given = req
            .headers()
            .get("e2b-traffic-access-token")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        // The traffic token only: the envd token opens commands and files,
        // the traffic token is what a viewer of a private port is given.
        if given.is_empty() || !same_bytes(given.as_bytes(), entry.traffic.as_bytes()) {
            return control::error(
                StatusCode::FORBIDDEN,
                format!(
                    "header E2b-Traffic-Access-Token does not open the ports of sandbox '{id}' \
                     (created with allowPublicTraffic false)"
                ),
            )
            .into_response();
        }
    }
    if entry.is_paused() {
        return control::error(
            StatusCode::CONFLICT,
            format!("sandbox '{id}' is paused: connect to it (Sandbox.connect) to resume it"),
        )
        .into_response();
    }
    let lease = match e2b.app.lease(&entry.owner, &entry.id).await {
        Ok(l) => l,
        Err(e) if e.status == StatusCode::NOT_FOUND => {
            e2b.forget(&entry.id);
            return gone();
        }
        Err(e) => return e.into_response(),
    };
    for name in E2B_HEADERS {
        req.headers_mut().remove(name);
    }
    let path_and_query = req
        .uri()
        .path_and_query()
        .map_or_else(|| "/".to_string(), |p| p.as_str().to_string());
    let wait = std::time::Duration::from_millis(e2b.app.ceilings().limits().backend_timeout_ms);
    crate::api::ports::relay(
        &lease.sandbox(),
        port,
        path_and_query,
        None,
        req,
        wait,
        e2b.app.port_cookies(),
    )
    .await
}

/// Anything else: named, so an SDK of another version says what it asked.
async fn not_served(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    control::error(
        StatusCode::NOT_FOUND,
        format!(
            "{method} {} is not part of the E2B API corral serves (see README, \"Using the e2b SDK\")",
            uri.path()
        ),
    )
    .into_response()
}
