//! corral's MCP server: tools that run commands, move files and keep shell
//! sessions in a sandbox, for any MCP client (an IDE agent, a chat app, an
//! RL harness), over stdio ([`serve_stdio`], `corral mcp`) or streamable
//! HTTP ([`http_service`], mounted at `/mcp` by `corral serve`).
//!
//! Each MCP session gets its own sandbox, bound to a provider key
//! `mcp-<random>`: started on the first tool call (a session that only lists
//! tools costs no container), kept for the session's later calls, and
//! released when the session ends (`session.rs`). The tools are thin
//! translations onto [`corral::Sandbox`]: `run_command`
//! ([`Sandbox::run`](corral::Sandbox::run) of `/bin/sh -c`),
//! `read_file`, `write_file`, `list_files`, `shell_run` and `shell_close`
//! (stateful shells), `reset` ([`Sandbox::reset`](corral::Sandbox::reset):
//! back to the state right after start), `egress` (what a sandbox with an
//! egress policy let through and refused), `snapshot` and `restore` (the
//! session's sandbox replaced by a fork of a snapshot whose spec gives
//! nothing the session's own does not). Arguments are checked in `args.rs` (a bad one is an
//! invalid-params error naming the field and the value); results are
//! rendered in `render.rs`: text for the model, with `isError` set on a
//! failure or a non-zero exit, and the REST API's JSON as structured
//! content.
//!
//! A session is a principal of its own (`corral_core::principal`): it acts
//! for the tenant whose token opened it (on stdio, for the operator), on
//! its own sandbox and the snapshots it took (its namespace), plus the
//! operator's snapshots `server.mcp_snapshots` shares read-only. Its
//! sandbox counts against its tenant's quota. Over HTTP the session is
//! bound to the principal of its first request: a request naming its
//! `Mcp-Session-Id` with another principal's token is answered 404, as if
//! the session did not exist.

mod args;
mod render;
mod session;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use corral::{FileError, FileOptions, Lease, Provider};
use corral_core::principal::{Principal, SnapshotAccess, SnapshotLookup};
use corral_core::{CommandSpec, SandboxSpec};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{CallToolResult, Implementation, JsonObject, ServerCapabilities, ServerInfo};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{
    SessionId, SessionManager, StreamableHttpServerConfig, StreamableHttpService,
};
use rmcp::{tool, tool_handler, tool_router, ErrorData, ServerHandler, ServiceExt};
use tokio_util::sync::CancellationToken;

use args::schema;
use session::{LeaseError, Session};

use crate::ceilings::{Busy, Ceilings, TimeUnit};
use crate::guard::Caller;
use crate::tenancy::Tenancy;

/// Bytes of each output stream a tool result keeps (head and tail).
const MAX_OUTPUT: u64 = 64 * 1024;

/// Largest file `read_file` returns.
const READ_CAP: u64 = 256 * 1024;

/// Largest file `write_file` accepts.
const WRITE_CAP: u64 = 16 << 20;

/// Largest listing `list_files` fetches (a few hundred thousand names).
const LIST_CAP: u64 = 16 << 20;

/// Time limit of a file operation.
const FILE_TIMEOUT: Duration = Duration::from_secs(60);

/// Shell session used when `shell_run` names none.
const DEFAULT_SHELL: &str = "main";

/// What every MCP session's sandbox is made from.
#[derive(Clone)]
pub struct McpContext {
    /// Hands out the sessions' sandboxes.
    pub provider: Provider,
    /// The spec of each session's sandbox (its image must be set).
    pub spec: SandboxSpec,
    /// Who opens the sessions when a request does not say (stdio: the
    /// operator; the endpoint used without the service's guard). `None`:
    /// each session acts for the principal the guard found on its first
    /// request, and a session without one is refused.
    pub principal: Option<Principal>,
    /// Owners, quotas and shared snapshots (the service shares its own with
    /// the REST API).
    pub tenancy: Tenancy,
    /// `server.limits`: tool calls take their slot and bytes from the same
    /// budget as the HTTP API's requests, and their time limits and caps
    /// stay within the same ceilings.
    pub ceilings: Ceilings,
    /// The service's port links (`port_url`); `None` where there is no
    /// HTTP listener to reach them through (stdio).
    pub ports: Option<crate::port_links::PortLinks>,
}

impl McpContext {
    /// Sessions of `principal` with `spec`, no quotas and nothing shared.
    pub fn new(
        provider: Provider,
        spec: SandboxSpec,
        principal: Option<Principal>,
        ceilings: Ceilings,
    ) -> McpContext {
        let tenancy = Tenancy::new(&Default::default(), provider.clone());
        McpContext {
            provider,
            spec,
            principal,
            tenancy,
            ceilings,
            ports: None,
        }
    }
}

/// How the streamable HTTP endpoint treats requests and sessions.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// `Host` header values accepted (`host` or `host:port`), a defence
    /// against DNS rebinding; empty accepts any host (for a service behind
    /// a bearer token on a public address). Default: `localhost`,
    /// `127.0.0.1`, `::1`, on any port.
    pub allowed_hosts: Vec<String>,
    /// A session without a request for this long is closed and its sandbox
    /// released. Default 35 minutes: above the longest command a tool may
    /// run (30 minutes), so a long call does not idle its session out.
    pub session_idle: Duration,
    /// Largest request body accepted; above it the answer is 413. Default
    /// 32 MiB: room for `write_file`'s 16 MiB of content, JSON-escaped.
    pub max_body_bytes: usize,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            allowed_hosts: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
            session_idle: args::MAX_TIMEOUT + Duration::from_secs(300),
            max_body_bytes: 32 << 20,
        }
    }
}

/// Serves one MCP session over stdin and stdout until the client hangs up
/// (closes stdin), then releases the session's sandbox. Logs must go to
/// stderr: stdout carries the protocol.
pub async fn serve_stdio(ctx: McpContext) -> anyhow::Result<()> {
    let handler = Handler::new(ctx, CancellationToken::new());
    let session = handler.session.clone();
    let served = async {
        let running = handler.serve(rmcp::transport::stdio()).await?;
        tracing::info!(session = session.key(), "MCP session started on stdio");
        let reason = running.waiting().await?;
        tracing::info!(session = session.key(), ?reason, "MCP stdio session ended");
        anyhow::Ok(())
    }
    .await;
    session.release().await;
    served
}

/// The MCP endpoint over streamable HTTP with sessions (`Mcp-Session-Id`),
/// one handler and one sandbox per MCP session, loopback `Host` names only
/// (see [`http_service_with`] for other hosts). Cancelling `cancel` closes
/// every session, which releases their sandboxes (after any tool call in
/// flight), and ends SSE streams; later tool calls start no sandbox.
/// Call it inside the tokio runtime that serves it: it spawns the task that
/// watches `cancel`.
///
/// The router answers at its root; mount it with
/// `app.nest("/mcp", corral_server::mcp::http_service(ctx, cancel))`, and
/// clients connect to `http://HOST:PORT/mcp`. Middleware layered on `app`
/// after the nest (the bearer token check) applies to it too; axum's
/// `DefaultBodyLimit` does not (rmcp reads request bodies itself): the
/// endpoint enforces [`HttpOptions::max_body_bytes`].
pub fn http_service(ctx: McpContext, cancel: CancellationToken) -> axum::Router {
    http_service_with(ctx, cancel, HttpOptions::default())
}

/// [`http_service`] with explicit [`HttpOptions`].
pub fn http_service_with(
    ctx: McpContext,
    cancel: CancellationToken,
    options: HttpOptions,
) -> axum::Router {
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive = Some(options.session_idle);
    let sessions = Arc::new(sessions);
    // rmcp's token ends SSE streams only; sessions are closed here, which
    // drops their handlers and so releases their sandboxes.
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn(close_on_cancel(Arc::downgrade(&sessions), cancel.clone()));
        }
        Err(_) => tracing::warn!(
            "MCP service built outside a tokio runtime: cancelling it will not close its sessions"
        ),
    }
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(options.allowed_hosts)
        .with_cancellation_token(cancel.clone());
    let service = StreamableHttpService::new(
        move || Ok(Handler::new(ctx.clone(), cancel.clone())),
        sessions,
        config,
    );
    axum::Router::new()
        .route_service("/", service)
        .layer(axum::middleware::from_fn_with_state(
            SessionOwners::default(),
            bind_sessions,
        ))
        .layer(axum::middleware::from_fn_with_state(
            options.max_body_bytes,
            limit_body,
        ))
}

/// Which principal opened each HTTP MCP session, by `Mcp-Session-Id`.
#[derive(Clone, Default)]
struct SessionOwners(Arc<Mutex<HashMap<String, Principal>>>);

impl SessionOwners {
    fn book(&self) -> std::sync::MutexGuard<'_, HashMap<String, Principal>> {
        // Plain map updates: a panic cannot leave one half-done.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

const SESSION_HEADER: &str = "mcp-session-id";

/// Binds a session to the principal whose request opened it and answers
/// any other principal's request for it 404, as if it did not exist: a
/// session id is a handle on a sandbox and its snapshots, not a credential.
async fn bind_sessions(
    axum::extract::State(owners): axum::extract::State<SessionOwners>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let caller = req.extensions().get::<Caller>().map(|c| c.0.clone());
    let sid = req
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let deleting = req.method() == axum::http::Method::DELETE;
    if let Some(sid) = &sid {
        let owner = owners.book().get(sid).cloned();
        if owner.is_some() && owner != caller {
            return (
                axum::http::StatusCode::NOT_FOUND,
                "no such MCP session (Mcp-Session-Id)",
            )
                .into_response();
        }
    }
    let response = next.run(req).await;
    match (&sid, &caller) {
        (None, Some(caller)) => {
            if let Some(new) = response
                .headers()
                .get(SESSION_HEADER)
                .and_then(|v| v.to_str().ok())
            {
                owners.book().insert(new.to_string(), caller.clone());
            }
        }
        (Some(sid), _) if deleting && response.status().is_success() => {
            owners.book().remove(sid);
        }
        _ => {}
    }
    response
}

/// Refuses a request body above `max` bytes with 413 before rmcp, which
/// reads bodies without a limit, sees it.
async fn limit_body(
    axum::extract::State(max): axum::extract::State<usize>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let (parts, body) = req.into_parts();
    match axum::body::to_bytes(body, max).await {
        Ok(bytes) => {
            next.run(axum::extract::Request::from_parts(
                parts,
                axum::body::Body::from(bytes),
            ))
            .await
        }
        Err(e) => (
            axum::http::StatusCode::PAYLOAD_TOO_LARGE,
            format!("MCP request body refused (the limit is {max} bytes): {e}"),
        )
            .into_response(),
    }
}

/// Closes every session of the service once `cancel` fires.
async fn close_on_cancel(sessions: Weak<LocalSessionManager>, cancel: CancellationToken) {
    cancel.cancelled().await;
    let Some(sessions) = sessions.upgrade() else {
        return;
    };
    let ids: Vec<SessionId> = sessions.sessions.read().await.keys().cloned().collect();
    tracing::info!(sessions = ids.len(), "closing MCP sessions");
    for id in ids {
        if let Err(e) = sessions.close_session(&id).await {
            tracing::warn!(session = %id, error = %e, "closing an MCP session failed");
        }
    }
}

/// The tools of one MCP session.
struct Handler {
    session: Arc<Session>,
    ceilings: Ceilings,
    ports: Option<crate::port_links::PortLinks>,
    info: ServerInfo,
    tool_router: ToolRouter<Handler>,
}

impl Handler {
    fn new(ctx: McpContext, closing: CancellationToken) -> Handler {
        let info = ServerInfo::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("corral", env!("CARGO_PKG_VERSION")))
            .with_instructions(instructions(&ctx.spec));
        let fallback = ctx.principal.clone();
        let ceilings = ctx.ceilings.clone();
        let ports = ctx.ports.clone();
        let session = Arc::new(Session::new(ctx, closing));
        if let Some(p) = fallback {
            session.bind(&p);
        }
        Handler {
            ceilings,
            ports,
            session,
            info,
            tool_router: Self::tool_router(),
        }
    }

    /// Whose share of the service's budget the session's calls draw from:
    /// its tenant's (the operator's for a session without one).
    fn holder(&self) -> crate::ceilings::Holder {
        self.session.principal().map_or(
            crate::ceilings::Holder::Operator,
            crate::ceilings::Holder::of,
        )
    }

    /// The session's sandbox, or the tool result explaining why there is none.
    async fn lease(&self) -> Result<(Lease, Vec<String>), CallToolResult> {
        match self.session.lease().await {
            Ok((lease, note)) => Ok((lease, note.into_iter().collect())),
            Err(LeaseError::Ended) => Err(render::error(
                "this MCP session has ended and its sandbox was released; start a new session",
            )),
            Err(LeaseError::Failed(f)) => Err(render::error(render::failure_line(
                "cannot start the sandbox",
                &f,
            ))),
        }
    }

    /// `timeout_secs` of `tool`: in the tool's range, and within the
    /// service's ceiling (which also bounds the default).
    fn timeout(&self, tool: &str, secs: Option<f64>) -> Result<Duration, ErrorData> {
        let t = args::timeout(tool, secs)?;
        self.ceilings
            .timeout("timeout_secs", secs.map(|_| t), Some(t), TimeUnit::Secs)
            .map_err(|e| {
                args::invalid(
                    tool,
                    "timeout_secs",
                    &serde_json::json!(secs),
                    &e.to_string(),
                )
            })
    }

    /// A tool's fixed output cap, within the service's ceiling.
    fn output_cap(&self) -> u64 {
        MAX_OUTPUT.min(self.ceilings.limits().max_output)
    }

    /// A tool's fixed read cap (`cap`), within the service's ceiling.
    fn read_cap(&self, cap: u64) -> u64 {
        cap.min(self.ceilings.limits().max_read_bytes)
    }

    /// `path` made absolute against the sandbox's working directory.
    async fn absolute(&self, lease: &Lease, path: &str) -> String {
        if path.starts_with('/') {
            return path.to_string();
        }
        args::absolute(&self.session.cwd(lease).await, path)
    }
}

/// A file error as a tool result: the message names the sandbox and path.
fn file_error(e: &FileError, notes: &[String], hint: Option<&str>) -> CallToolResult {
    let mut text = String::new();
    for n in notes {
        text.push_str(n);
        text.push('\n');
    }
    match e {
        FileError::Sandbox(f) => text.push_str(&render::failure_line("failure", f)),
        other => text.push_str(&other.to_string()),
    }
    if let Some(h) = hint {
        text.push('\n');
        text.push_str(h);
    }
    render::error(text)
}

/// A tool call refused because the service's budget is full: an error
/// result the model can read, with the HTTP API's error body (kind
/// `overloaded`, retryable) as structured content.
fn overloaded(busy: Busy) -> CallToolResult {
    let text = format!(
        "overloaded (retryable, retry in {} s): {busy}",
        crate::ceilings::OVERLOADED_RETRY_AFTER_SECS
    );
    let body = crate::wire::ErrorBody {
        error: crate::error::ApiError::from(busy).detail,
    };
    let mut r = render::error(text);
    r.structured_content = serde_json::to_value(body).ok();
    r
}

/// Prepends notes to a successful text result.
fn with_notes(notes: &[String], text: String) -> CallToolResult {
    if notes.is_empty() {
        return render::ok(text);
    }
    render::ok(format!("{}\n{text}", notes.join("\n")))
}

/// What the model is told about the server.
fn instructions(spec: &SandboxSpec) -> String {
    let mut limits = Vec::new();
    if let Some(m) = spec.limits.memory {
        limits.push(format!("{} MiB of memory", m >> 20));
    }
    if let Some(c) = spec.limits.cpus {
        limits.push(format!("{c} CPUs"));
    }
    let limits = if limits.is_empty() {
        String::new()
    } else {
        format!(", limited to {}", limits.join(" and "))
    };
    let network = match spec.network.as_str() {
        "none" => "no network access",
        _ => "network access",
    };
    format!(
        "corral gives this session its own Linux sandbox: a hardened, disposable container \
         (image {image}{limits}, {network}), isolated from the host and from other sessions. \
         It is created on your first tool call and destroyed when the session ends, so \
         nothing in it persists beyond the session. Use run_code to run Python in a kernel \
         whose variables carry over between calls (plots come back as images), run_command for one-off commands (each \
         runs in a fresh /bin/sh -c: cd and exports do not carry over), shell_run for a \
         persistent shell whose working directory and variables carry over between calls \
         (several named sessions may exist; shell_close ends one), and read_file, write_file \
         and list_files for files; reset returns the sandbox to its state right after start \
         (every process killed, every file change undone); snapshot saves the sandbox's files \
         under a name and restore goes back to them in a fresh sandbox. Relative paths are taken from the \
         sandbox's working directory. Results give the exit code and output; a command that timed out, ran out \
         of memory or lost its container says so with a failure kind.",
        image = spec.image,
    )
}

#[tool_router]
impl Handler {
    /// Run a shell command in the sandbox with /bin/sh -c and wait for it.
    /// Each call starts a fresh shell: cd and exported variables do not
    /// carry over (use shell_run for that). Returns the exit code, stdout
    /// and stderr (each capped at 64 KiB, first and last parts kept), and
    /// the failure kind when the command timed out, was OOM-killed or lost
    /// its container. A non-zero exit is reported as an error result.
    #[tool(input_schema = schema::<args::RunCommand>())]
    async fn run_command(&self, params: JsonObject) -> Result<CallToolResult, ErrorData> {
        const TOOL: &str = "run_command";
        let a: args::RunCommand = args::parse(TOOL, params)?;
        args::command(TOOL, &a.command)?;
        let timeout = self.timeout(TOOL, a.timeout_secs)?;
        if let Some(cwd) = &a.cwd {
            args::path(TOOL, "cwd", cwd)?;
        }
        let cap = self.output_cap();
        let _held = match self.ceilings.command(&self.holder(), cap, 0, false) {
            Ok(h) => h,
            Err(busy) => return Ok(overloaded(busy)),
        };
        let (lease, notes) = match self.lease().await {
            Ok(l) => l,
            Err(r) => return Ok(r),
        };
        let mut cmd = CommandSpec::shell(a.command)
            .timeout(timeout)
            .max_output(cap);
        cmd.cwd = a.cwd;
        cmd.wait_for_output = a.wait_for_output;
        let r = lease.run(&cmd).await;
        Ok(render::command(&r, lease.id(), &notes, cap))
    }

    /// Run Python code in the sandbox's Jupyter kernel (the image needs
    /// ipykernel) and wait for it. State carries over between calls
    /// (variables, imports, functions). Returns what it printed, the value
    /// of its last expression, displayed plots as images, and the
    /// exception with its traceback when it raised (an error result); a
    /// timeout interrupts the code and says so.
    #[tool(input_schema = schema::<args::RunCode>())]
    async fn run_code(&self, params: JsonObject) -> Result<CallToolResult, ErrorData> {
        const TOOL: &str = "run_code";
        let a: args::RunCode = args::parse(TOOL, params)?;
        let timeout = self.timeout(TOOL, a.timeout_secs)?;
        let cap = self.output_cap();
        // Its stdout, stderr and results (each up to `cap`) gathered here,
        // then rendered: the streamed worst case, as the REST route counts.
        let _held = match self
            .ceilings
            .command(&self.holder(), cap, a.code.len() as u64, true)
        {
            Ok(h) => h,
            Err(busy) => return Ok(overloaded(busy)),
        };
        let (lease, notes) = match self.lease().await {
            Ok(l) => l,
            Err(r) => return Ok(r),
        };
        let mut run = corral::RunCode::new(a.code);
        run.timeout = Some(timeout);
        run.max_output = cap;
        run.exclusive = a.exclusive;
        run.max_contexts = self.ceilings.limits().max_code_contexts as usize;
        let mut events = Vec::new();
        let sb = lease.sandbox();
        let outcome = sb.run_code(None, &run, |e| events.push(e)).await;
        Ok(render::code(&events, &outcome, &notes))
    }

    /// Read a file from the sandbox. Text comes back as it is; a binary
    /// file comes back base64-encoded after a note. Files above 256 KiB
    /// are refused: read parts of them with run_command (head, tail, sed).
    #[tool(
        input_schema = schema::<args::ReadFile>(),
        annotations(read_only_hint = true)
    )]
    async fn read_file(&self, params: JsonObject) -> Result<CallToolResult, ErrorData> {
        const TOOL: &str = "read_file";
        let a: args::ReadFile = args::parse(TOOL, params)?;
        args::path(TOOL, "path", &a.path)?;
        let cap = self.read_cap(READ_CAP);
        let _held = match self.ceilings.file(&self.holder(), cap) {
            Ok(h) => h,
            Err(busy) => return Ok(overloaded(busy)),
        };
        let (lease, notes) = match self.lease().await {
            Ok(l) => l,
            Err(r) => return Ok(r),
        };
        let path = self.absolute(&lease, &a.path).await;
        let opts = FileOptions {
            max_bytes: cap,
            timeout: FILE_TIMEOUT,
            ..FileOptions::default()
        };
        match lease.read_file(&path, &opts).await {
            Ok(bytes) if notes.is_empty() => Ok(render::file_content(&path, bytes)),
            Ok(bytes) => {
                let mut r = render::file_content(&path, bytes);
                r.content.insert(0, rmcp::model::ContentBlock::text(notes.join("\n")));
                Ok(r)
            }
            Err(e @ FileError::TooLarge { .. }) => Ok(file_error(
                &e,
                &notes,
                Some("read parts of it with run_command, e.g. head -c 100000 FILE or sed -n '1,200p' FILE"),
            )),
            Err(e) => Ok(file_error(&e, &notes, None)),
        }
    }

    /// Write text to a file in the sandbox, replacing it atomically (a new
    /// file gets mode 0644, a replaced one keeps its mode). mkdirs creates
    /// missing parent directories.
    #[tool(input_schema = schema::<args::WriteFile>())]
    async fn write_file(&self, params: JsonObject) -> Result<CallToolResult, ErrorData> {
        const TOOL: &str = "write_file";
        let a: args::WriteFile = args::parse(TOOL, params)?;
        args::path(TOOL, "path", &a.path)?;
        if a.content.len() as u64 > WRITE_CAP {
            return Err(args::invalid(
                TOOL,
                "content",
                &serde_json::json!(format!("({} bytes)", a.content.len())),
                &format!("at most {WRITE_CAP} bytes"),
            ));
        }
        let _held = match self.ceilings.file(&self.holder(), a.content.len() as u64) {
            Ok(h) => h,
            Err(busy) => return Ok(overloaded(busy)),
        };
        let (lease, notes) = match self.lease().await {
            Ok(l) => l,
            Err(r) => return Ok(r),
        };
        let path = self.absolute(&lease, &a.path).await;
        let opts = FileOptions {
            max_bytes: WRITE_CAP,
            mkdirs: a.mkdirs.unwrap_or(false),
            timeout: FILE_TIMEOUT,
            ..FileOptions::default()
        };
        match lease.write_file(&path, a.content.as_bytes(), &opts).await {
            Ok(()) => Ok(with_notes(
                &notes,
                format!("wrote {} bytes to {path}", a.content.len()),
            )),
            Err(e @ FileError::NotFound { .. }) if !opts.mkdirs => Ok(file_error(
                &e,
                &notes,
                Some("pass mkdirs: true to create missing parent directories"),
            )),
            Err(e) => Ok(file_error(&e, &notes, None)),
        }
    }

    /// List a directory in the sandbox: one line per entry with its type,
    /// permissions, size and name (directories end in '/', symlinks show
    /// their target), sorted by name.
    #[tool(
        input_schema = schema::<args::ListFiles>(),
        annotations(read_only_hint = true)
    )]
    async fn list_files(&self, params: JsonObject) -> Result<CallToolResult, ErrorData> {
        const TOOL: &str = "list_files";
        let a: args::ListFiles = args::parse(TOOL, params)?;
        args::path(TOOL, "path", &a.path)?;
        let cap = self.read_cap(LIST_CAP);
        let _held = match self.ceilings.file(&self.holder(), cap) {
            Ok(h) => h,
            Err(busy) => return Ok(overloaded(busy)),
        };
        let (lease, notes) = match self.lease().await {
            Ok(l) => l,
            Err(r) => return Ok(r),
        };
        let path = self.absolute(&lease, &a.path).await;
        let opts = FileOptions {
            max_bytes: cap,
            timeout: FILE_TIMEOUT,
            ..FileOptions::default()
        };
        match lease.list_dir(&path, &opts).await {
            Ok(entries) => Ok(with_notes(&notes, render::listing(&path, &entries))),
            Err(e) => Ok(file_error(&e, &notes, None)),
        }
    }

    /// A URL that reaches a server listening on a port inside the sandbox
    /// (a web app under test, a notebook, a dev server) through corral's
    /// service: HTTP and WebSocket, no other token needed, valid while
    /// this sandbox lives. Start the server first (in the background),
    /// listening on 0.0.0.0 or 127.0.0.1.
    #[tool(
        input_schema = schema::<args::PortUrl>(),
        annotations(read_only_hint = true)
    )]
    async fn port_url(&self, params: JsonObject) -> Result<CallToolResult, ErrorData> {
        const TOOL: &str = "port_url";
        let a: args::PortUrl = args::parse(TOOL, params)?;
        let port = args::port(TOOL, a.port)?;
        let Some(links) = &self.ports else {
            return Ok(render::error(
                "port links are served by corral serve's HTTP listener; this MCP server \
                 (stdio) has none",
            ));
        };
        let (lease, notes) = match self.lease().await {
            Ok(l) => l,
            Err(r) => return Ok(r),
        };
        if !crate::port_links::id_fits_a_host_name(lease.id()) {
            return Ok(render::error(format!(
                "sandbox id '{}' cannot stand in a host name, which a port link is",
                lease.id()
            )));
        }
        let token = links.key.link_token(lease.key(), lease.id(), port);
        let link = links.origin.link(lease.id(), port, &token, None);
        Ok(with_notes(
            &notes,
            format!(
                "{}\n(reaches port {port} inside the sandbox; nothing needs to listen yet, a request \
                 then answers 502. The link is an origin of its own: a browser on this machine \
                 opens it as is; a program that cannot resolve its host name connects to {} \
                 and sends 'Host: {}')",
                link.url, link.connect, link.host
            ),
        ))
    }

    /// What this sandbox's egress policy let through and refused: DNS
    /// names resolved and refused, connections relayed and refused, and
    /// the last refusals (e.g. "dns evil.test"). Only for a sandbox whose
    /// network is an egress allow-list (`network: {egress: ...}`).
    #[tool(
        input_schema = schema::<args::Egress>(),
        annotations(read_only_hint = true)
    )]
    async fn egress(&self, params: JsonObject) -> Result<CallToolResult, ErrorData> {
        const TOOL: &str = "egress";
        let args::Egress {} = args::parse(TOOL, params)?;
        let (lease, notes) = match self.lease().await {
            Ok(l) => l,
            Err(r) => return Ok(r),
        };
        match lease.sandbox().egress_counts().await {
            Ok(Some(counts)) => Ok(render::egress(counts, &notes)),
            Ok(None) => Ok(render::error(
                "this sandbox has no egress policy (its network is not network: {egress: ...}), \
                 so nothing counts what it reaches",
            )),
            Err(e) => Ok(render::error(render::failure_line(
                "egress counts failed",
                &e.failure(),
            ))),
        }
    }

    /// Run a command in a persistent shell session (default "main"): the
    /// working directory, exported variables and functions carry over
    /// between calls, like a terminal. Each call returns that command's
    /// exit code and output. On timeout the command is interrupted like
    /// Ctrl-C; if it will not stop, the shell is restarted and the result
    /// says so.
    #[tool(input_schema = schema::<args::ShellRun>())]
    async fn shell_run(&self, params: JsonObject) -> Result<CallToolResult, ErrorData> {
        const TOOL: &str = "shell_run";
        let a: args::ShellRun = args::parse(TOOL, params)?;
        args::command(TOOL, &a.command)?;
        let name = a.session.unwrap_or_else(|| DEFAULT_SHELL.to_string());
        args::session(TOOL, &name)?;
        let timeout = self.timeout(TOOL, a.timeout_secs)?;
        let cap = self.output_cap();
        let _held = match self.ceilings.command(&self.holder(), cap, 0, false) {
            Ok(h) => h,
            Err(busy) => return Ok(overloaded(busy)),
        };
        let (lease, notes) = match self.lease().await {
            Ok(l) => l,
            Err(r) => return Ok(r),
        };
        let s = lease.shell(&name).run(&a.command, Some(timeout), cap).await;
        let ran_before = self.session.shell_used(lease.id(), &name);
        Ok(render::shell(
            &s,
            &name,
            s.restarted && ran_before,
            lease.id(),
            notes,
            cap,
        ))
    }

    /// Save the sandbox's current file system as a named snapshot, to come
    /// back to later with restore (before a risky step, say). Files are
    /// kept; running processes too with live true (where the sandbox can
    /// be checkpointed), else they are not, and taking it may end them.
    /// Shell sessions are never kept.
    #[tool(input_schema = schema::<args::Snapshot>())]
    async fn snapshot(&self, params: JsonObject) -> Result<CallToolResult, ErrorData> {
        const TOOL: &str = "snapshot";
        let a: args::Snapshot = args::parse(TOOL, params)?;
        args::snapshot_name(TOOL, &a.name)?;
        let (lease, notes) = match self.lease().await {
            Ok(l) => l,
            Err(r) => return Ok(r),
        };
        let Some(principal) = self.session.principal() else {
            return Ok(render::error(UNBOUND));
        };
        let opts = corral::SnapshotOptions {
            durable: a.durable.unwrap_or(false),
            // Its own namespace: another's snapshot of this name is not
            // touched.
            namespace: principal.snapshot_namespace(),
            kind: a
                .live
                .unwrap_or(false)
                .then_some(corral::snapshot::SnapshotKind::Live),
        };
        match lease.snapshot(&a.name, opts).await {
            Ok(info) => Ok(with_notes(
                &notes,
                format!(
                    "saved snapshot '{}' of sandbox {}{}; restore it with restore {{\"name\": \"{}\"}}",
                    info.name,
                    lease.id(),
                    if info.durable { " (durable)" } else { "" },
                    info.name
                ),
            )),
            Err(e) => Ok(render::error(format!(
                "snapshot '{}' failed: {e}",
                a.name
            ))),
        }
    }

    /// Replace the sandbox with a fresh one started from a snapshot: its
    /// files are as they were when the snapshot was taken (and, from a
    /// live snapshot, its running processes). Everything since is gone,
    /// shell sessions included.
    #[tool(input_schema = schema::<args::Restore>())]
    async fn restore(&self, params: JsonObject) -> Result<CallToolResult, ErrorData> {
        const TOOL: &str = "restore";
        let a: args::Restore = args::parse(TOOL, params)?;
        args::snapshot_name(TOOL, &a.name)?;
        let Some(principal) = self.session.principal() else {
            return Ok(render::error(UNBOUND));
        };
        let runtime = self.session.provider().runtime().clone();
        let all = match runtime.snapshots().await {
            Ok(all) => all,
            Err(e) => return Ok(render::error(format!("cannot restore '{}': {e}", a.name))),
        };
        // Its own snapshot of that name, else one the operator shares with
        // MCP sessions; anything else is as if absent.
        let sharing = self.session.tenancy().sharing();
        let found = principal.find_snapshot(&a.name, &all, SnapshotAccess::Read, sharing);
        let Ok(SnapshotLookup::Found { info, .. }) = found else {
            return Ok(render::error(format!(
                "cannot restore '{}': no such snapshot (a session restores the snapshots it \
                 took and those the operator shares with MCP sessions)",
                a.name
            )));
        };
        // Its variables' values come from the session's own spec.
        let spec = info.fork_spec_with(&self.session.base_spec().env);
        // The session's spec is the operator's and a client chooses none:
        // a snapshot restores only if its spec gives nothing more.
        if let Err(r) = corral_core::client_policy::ClientPolicy::no_raise()
            .check_fork(&self.session.base_spec(), &spec)
        {
            return Ok(render::error(format!(
                "cannot restore '{}': it was taken of a sandbox with settings this session's \
                 sandbox does not have: {r}",
                a.name
            )));
        }
        let base = match runtime.fork_base(info).await {
            Ok(b) => b,
            Err(e) => return Ok(render::error(format!("cannot restore '{}': {e}", a.name))),
        };
        let recipe = session::Recipe {
            spec,
            base,
            restore: runtime.fork_restore(info),
        };
        let live = recipe.restore.is_some();
        match self.session.replace(recipe).await {
            Ok(lease) => Ok(render::ok(format!(
                "restored snapshot '{}': this session's sandbox is now {}, {}",
                a.name,
                lease.id(),
                if live {
                    "restored with the processes the live snapshot kept running; shell \
                     sessions from before are gone"
                } else {
                    "started from it; processes and shell sessions from before are gone"
                }
            ))),
            Err(LeaseError::Ended) => Ok(render::error(
                "this MCP session has ended and its sandbox was released; start a new session",
            )),
            Err(LeaseError::Failed(f)) => Ok(render::error(render::failure_line(
                &format!(
                    "cannot start a sandbox from snapshot '{}' (the next call starts a fresh one)",
                    a.name
                ),
                &f,
            ))),
        }
    }

    /// End a shell session and everything it still runs; the next
    /// shell_run with that name starts a fresh shell.
    #[tool(input_schema = schema::<args::ShellClose>())]
    async fn shell_close(&self, params: JsonObject) -> Result<CallToolResult, ErrorData> {
        const TOOL: &str = "shell_close";
        let a: args::ShellClose = args::parse(TOOL, params)?;
        args::session(TOOL, &a.session)?;
        let none_open = format!("no shell session '{}' is open", a.session);
        // No sandbox yet: no shell either, and none worth starting for this.
        if !self.session.used() {
            return Ok(render::ok(none_open));
        }
        let (lease, notes) = match self.lease().await {
            Ok(l) => l,
            Err(r) => return Ok(r),
        };
        self.session.shell_closed(&a.session);
        if !lease.shell_names().contains(&a.session) {
            return Ok(with_notes(&notes, none_open));
        }
        lease.close_shell(&a.session).await;
        Ok(with_notes(
            &notes,
            format!("closed shell session '{}'", a.session),
        ))
    }

    /// Return the sandbox to its pristine state, exactly as it was right
    /// after it started: every process (background jobs and shell sessions
    /// included) is killed and every file change is undone, in /tmp too.
    /// Use it to start a task over on a clean machine. Takes milliseconds
    /// when the sandbox was started for it (pristine); otherwise its
    /// container is replaced by a fresh one, which takes longer, and the
    /// result says why.
    #[tool(
        input_schema = schema::<args::Reset>(),
        annotations(destructive_hint = true, idempotent_hint = true)
    )]
    async fn reset(&self, params: JsonObject) -> Result<CallToolResult, ErrorData> {
        const TOOL: &str = "reset";
        let args::Reset {} = args::parse(TOOL, params)?;
        // No sandbox yet: nothing to undo, and none worth starting for this.
        if !self.session.used() {
            return Ok(render::ok(
                "the sandbox has not been started yet, so it is already pristine",
            ));
        }
        let (lease, notes) = match self.lease().await {
            Ok(l) => l,
            Err(r) => return Ok(r),
        };
        match lease.reset().await {
            Ok(outcome) => {
                self.session.reset_done(lease.id());
                Ok(render::reset(&outcome, &notes))
            }
            Err(e) => {
                let mut text = notes.join("\n");
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(&render::failure_line("reset failed", &e.failure()));
                Ok(render::error(text))
            }
        }
    }
}

/// What a tool says when its session has no principal (the HTTP endpoint
/// used without the service's guard and no fallback principal).
const UNBOUND: &str = "this MCP session is not authenticated: it may not act on snapshots";

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Handler {
    fn get_info(&self) -> ServerInfo {
        self.info.clone()
    }

    /// Binds the session to the principal the service's guard found on
    /// the request that opened it (over HTTP), then answers as rmcp does.
    async fn initialize(
        &self,
        request: rmcp::model::InitializeRequestParams,
        context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::InitializeResult, ErrorData> {
        let caller = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Caller>())
            .map(|c| c.0.clone());
        if let Some(caller) = caller {
            self.session.bind(&caller);
        }
        context.peer.set_peer_info(request.clone());
        let mut info = self.get_info();
        // rmcp's own negotiation: the client's version when known.
        if rmcp::model::ProtocolVersion::KNOWN_VERSIONS.contains(&request.protocol_version) {
            info.protocol_version = request.protocol_version;
        }
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_describe_the_sandbox() {
        let mut spec = SandboxSpec::new("corral-test/busybox");
        spec.limits.memory = Some(512 << 20);
        let text = instructions(&spec);
        assert!(text.contains("image corral-test/busybox"), "{text}");
        assert!(text.contains("512 MiB of memory"), "{text}");
        for tool in [
            "reset",
            "run_command",
            "shell_run",
            "shell_close",
            "read_file",
            "write_file",
            "list_files",
        ] {
            assert!(text.contains(tool), "{tool}: {text}");
        }
    }

    #[test]
    fn every_tool_is_listed_with_a_description_and_schema() {
        let router = Handler::tool_router();
        let mut names: Vec<String> = router
            .list_all()
            .iter()
            .map(|t| {
                assert!(
                    t.description.as_deref().is_some_and(|d| d.len() > 40),
                    "{t:?}"
                );
                assert_eq!(
                    t.input_schema.get("type"),
                    Some(&serde_json::json!("object"))
                );
                t.name.to_string()
            })
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "egress",
                "list_files",
                "port_url",
                "read_file",
                "reset",
                "restore",
                "run_code",
                "run_command",
                "shell_close",
                "shell_run",
                "snapshot",
                "write_file"
            ]
        );
    }
}
