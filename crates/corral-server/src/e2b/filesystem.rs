//! envd's `filesystem.Filesystem` service and its plain HTTP routes
//! (`GET`/`POST /files`, `GET /health`) over the sandbox's file API:
//! reads, writes and listings go through corral's agent
//! ([`corral::Sandbox::read_file`], `write_file`, `list_dir`: atomic,
//! binary-safe, bounded by `server.limits`); `MakeDir`, `Move` and `Remove`
//! run `mkdir -p`, `mv` and `rm -rf` in the sandbox (with the path as an
//! argument, never through a shell). `Stat` is the entry in its parent's
//! listing, a symlink followed. An upload may be gzip (`Content-Encoding`);
//! a signed URL (`signature`, `signature_expiration`) opens its transfer
//! without the access token (`E2b::envd_signed`). Watching (`WatchDir`,
//! and `CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher` that the sync
//! SDK polls) compares listings of the directory every [`WATCH_EVERY`],
//! and once more when the sync SDK asks (corral has no file system events):
//! an entry that appears is `CREATE` (a new file with content also
//! `WRITE`), one that goes `REMOVE`, a file's changed size or modification
//! time `WRITE`, changed permissions `CHMOD`; a change undone within one
//! interval is not seen.
//!
//! A relative path is taken from the sandbox's working directory, where
//! its commands run (its spec's `workdir`, else the image's `WorkingDir`):
//! E2B's is the user's home.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequest, Multipart, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;
use corral::{DirEntry, EntryKind, FileOptions, Lease};
use corral_core::CommandSpec;
use serde::Deserialize;
use serde_json::{json, Value};

use super::connect::{self, Code, RpcError};
use super::control::error;
use super::{requested_user, E2b, Envd};
use crate::ceilings::Holder;
use crate::error::ApiError;

/// Time limit of `mkdir`, `mv` and `rm` in the sandbox.
const FS_COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// Deepest `ListDir` walk (and recursive watch).
const MAX_DEPTH: u32 = 16;

/// How often a watched directory is listed.
const WATCH_EVERY: Duration = Duration::from_millis(200);

/// Most watchers (of `CreateWatcher`) a sandbox keeps at once.
const MAX_WATCHERS: usize = 16;

/// Most events a watcher keeps between two `GetWatcherEvents`.
const MAX_PENDING_EVENTS: usize = 10_000;

pub(super) fn routes() -> axum::Router<E2b> {
    axum::Router::new()
        .route("/filesystem.Filesystem/Stat", post(stat))
        .route("/filesystem.Filesystem/MakeDir", post(make_dir))
        .route("/filesystem.Filesystem/Move", post(move_entry))
        .route("/filesystem.Filesystem/ListDir", post(list_dir))
        .route("/filesystem.Filesystem/Remove", post(remove))
        .route("/filesystem.Filesystem/WatchDir", post(watch_dir))
        .route("/filesystem.Filesystem/CreateWatcher", post(create_watcher))
        .route(
            "/filesystem.Filesystem/GetWatcherEvents",
            post(get_watcher_events),
        )
        .route("/filesystem.Filesystem/RemoveWatcher", post(remove_watcher))
        .route("/files", get(read_file).post(write_files))
        .route("/health", get(health))
}

/// `path` made absolute against the sandbox's working directory.
fn absolute(lease: &Lease, field: &str, path: &str) -> Result<String, RpcError> {
    if path.is_empty() {
        return Err(RpcError::invalid(field, "is empty"));
    }
    if path.contains('\0') {
        return Err(RpcError::invalid(
            field,
            format!("'{}' contains a NUL byte", path.escape_debug()),
        ));
    }
    if path.starts_with('/') {
        return Ok(path.to_string());
    }
    let base = lease.workdir();
    Ok(format!("{}/{}", base.trim_end_matches('/'), path))
}

fn split(path: &str) -> (&str, &str) {
    let trimmed = path.trim_end_matches('/');
    match trimmed.rfind('/') {
        Some(0) => ("/", &trimmed[1..]),
        Some(i) => (&trimmed[..i], &trimmed[i + 1..]),
        None => ("/", trimmed),
    }
}

fn file_error(e: &corral::FileError) -> RpcError {
    RpcError::from(ApiError::file(e))
}

/// `rwxr-xr-x`-style permissions with the type letter in front.
fn permissions(kind: EntryKind, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        EntryKind::Dir => 'd',
        EntryKind::Symlink => 'l',
        EntryKind::File => '-',
        EntryKind::Other => '?',
    });
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// envd's `EntryInfo` of `entry` in directory `dir`.
fn entry_info(dir: &str, entry: &DirEntry) -> Value {
    let path = if dir == "/" {
        format!("/{}", entry.name)
    } else {
        format!("{}/{}", dir.trim_end_matches('/'), entry.name)
    };
    let file_type = match entry.kind {
        EntryKind::Dir => "FILE_TYPE_DIRECTORY",
        EntryKind::File => "FILE_TYPE_FILE",
        // A link's own type: the listing does not follow it.
        EntryKind::Symlink => "FILE_TYPE_SYMLINK",
        EntryKind::Other => "FILE_TYPE_UNSPECIFIED",
    };
    let mut v = json!({
        "name": entry.name,
        "type": file_type,
        "path": path,
        "size": entry.size.to_string(),
        "mode": entry.mode,
        "permissions": permissions(entry.kind, entry.mode),
        // Names from the sandbox's own /etc/passwd and /etc/group, else
        // the number, as envd answers.
        "owner": entry.owner.clone().unwrap_or_else(|| entry.uid.to_string()),
        "group": entry.group.clone().unwrap_or_else(|| entry.gid.to_string()),
        "modifiedTime": timestamp(entry.modified),
        "isSymlink": entry.kind == EntryKind::Symlink,
    });
    if let Some(t) = &entry.target {
        v["symlinkTarget"] = json!(t);
    }
    v
}

/// `t` as a protobuf `Timestamp` in JSON: RFC 3339 in UTC with nanoseconds.
fn timestamp(t: std::time::SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

fn list_options(e2b: &E2b) -> FileOptions {
    FileOptions {
        max_bytes: e2b
            .app
            .ceilings()
            .read_bytes("max_bytes", None, 64 << 20)
            .unwrap_or(64 << 20),
        ..FileOptions::default()
    }
}

/// The `EntryInfo` of `path`: its entry in its parent's listing.
async fn stat_path(e2b: &E2b, lease: &Lease, path: &str) -> Result<Value, RpcError> {
    let (dir, name) = split(path);
    if name.is_empty() {
        return Ok(json!({
            "name": "/", "type": "FILE_TYPE_DIRECTORY", "path": "/", "size": "0",
            "mode": 0o755, "permissions": "drwxr-xr-x", "owner": "", "group": "",
        }));
    }
    let entries = lease
        .list_dir(dir, &list_options(e2b))
        .await
        .map_err(|e| file_error(&e))?;
    entries
        .iter()
        .find(|e| e.name == name)
        .map(|e| entry_info(dir, e))
        .ok_or_else(|| {
            RpcError::new(
                Code::NotFound,
                format!("path '{path}' does not exist in sandbox {}", lease.id()),
            )
        })
}

/// Runs `argv` in the sandbox; its stderr is the error.
async fn run(lease: &Lease, argv: &[&str]) -> Result<(), RpcError> {
    let cmd = CommandSpec::argv(argv.iter().copied())
        .timeout(FS_COMMAND_TIMEOUT)
        .max_output(64 * 1024);
    let r = lease.run(&cmd).await;
    if let Some(f) = &r.failure {
        return Err(RpcError::new(
            Code::Internal,
            format!("{}: {}", argv.join(" "), f.message),
        ));
    }
    if r.exit_code != Some(0) {
        return Err(RpcError::new(
            Code::Internal,
            format!(
                "{} failed ({:?}): {}",
                argv[0],
                r.exit_code,
                String::from_utf8_lossy(&r.stderr).trim()
            ),
        ));
    }
    Ok(())
}

#[derive(Deserialize)]
struct PathRequest {
    #[serde(default)]
    path: String,
}

#[derive(Deserialize)]
struct ListDirRequest {
    #[serde(default)]
    path: String,
    depth: Option<u32>,
}

#[derive(Deserialize)]
struct MoveRequest {
    #[serde(default)]
    source: String,
    #[serde(default)]
    destination: String,
}

async fn stat(State(e2b): State<E2b>, headers: HeaderMap, body: Bytes) -> Response {
    connect::unary(
        async {
            let req: PathRequest = connect::unary_request(&headers, &body)?;
            let Envd { lease, .. } = e2b.envd(&headers).await?;
            requested_user(&headers, &lease)?;
            let path = absolute(&lease, "path", &req.path)?;
            let entry = stat_path(&e2b, &lease, &path).await?;
            Ok(json!({"entry": follow(&e2b, &lease, entry).await?}))
        }
        .await,
    )
}

/// Most symlinks `Stat` follows in a row (Linux's own bound).
const MAX_LINKS: usize = 40;

/// `entry` as envd's `Stat` answers a symlink: the type, size and mode of
/// what it leads to, and that target as an absolute path; a link leading
/// nowhere is answered as itself.
async fn follow(e2b: &E2b, lease: &Lease, entry: Value) -> Result<Value, RpcError> {
    if entry["type"] != "FILE_TYPE_SYMLINK" {
        // Not a link: no target to name.
        return Ok(entry);
    }
    let mut at = entry.clone();
    for _ in 0..MAX_LINKS {
        if at["type"] != "FILE_TYPE_SYMLINK" {
            let mut out = entry;
            for field in [
                "type",
                "size",
                "mode",
                "permissions",
                "owner",
                "group",
                "modifiedTime",
            ] {
                out[field] = at[field].clone();
            }
            out["symlinkTarget"] = at["path"].clone();
            // What is described is the target, which is no link (the SDK
            // shows SYMLINK for an entry marked as one).
            out["isSymlink"] = json!(false);
            return Ok(out);
        }
        let (Some(link), Some(target)) = (at["path"].as_str(), at["symlinkTarget"].as_str()) else {
            return Ok(entry);
        };
        let (dir, _) = split(link);
        let next = normalize(&if target.starts_with('/') {
            target.to_string()
        } else {
            format!("{}/{target}", dir.trim_end_matches('/'))
        });
        at = match stat_path(e2b, lease, &next).await {
            Ok(v) => v,
            Err(e) if e.code == Code::NotFound => return Ok(entry),
            Err(e) => return Err(e),
        };
    }
    Err(RpcError::invalid(
        "path",
        format!("more than {MAX_LINKS} symbolic links in a row"),
    ))
}

/// An absolute path with `.`, `..` and repeated slashes resolved by name.
fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    format!("/{}", parts.join("/"))
}

async fn make_dir(State(e2b): State<E2b>, headers: HeaderMap, body: Bytes) -> Response {
    connect::unary(
        async {
            let req: PathRequest = connect::unary_request(&headers, &body)?;
            let Envd { lease, .. } = e2b.envd(&headers).await?;
            requested_user(&headers, &lease)?;
            let path = absolute(&lease, "path", &req.path)?;
            match stat_path(&e2b, &lease, &path).await {
                Ok(_) => {
                    return Err(RpcError::new(
                        Code::AlreadyExists,
                        format!("path '{path}' already exists"),
                    ))
                }
                Err(e) if e.code == Code::NotFound => {}
                Err(e) => return Err(e),
            }
            run(&lease, &["mkdir", "-p", "--", &path]).await?;
            Ok(json!({"entry": stat_path(&e2b, &lease, &path).await?}))
        }
        .await,
    )
}

async fn move_entry(State(e2b): State<E2b>, headers: HeaderMap, body: Bytes) -> Response {
    connect::unary(
        async {
            let req: MoveRequest = connect::unary_request(&headers, &body)?;
            let Envd { lease, .. } = e2b.envd(&headers).await?;
            requested_user(&headers, &lease)?;
            let source = absolute(&lease, "source", &req.source)?;
            let destination = absolute(&lease, "destination", &req.destination)?;
            stat_path(&e2b, &lease, &source).await?;
            run(&lease, &["mv", "--", &source, &destination]).await?;
            Ok(json!({"entry": stat_path(&e2b, &lease, &destination).await?}))
        }
        .await,
    )
}

async fn remove(State(e2b): State<E2b>, headers: HeaderMap, body: Bytes) -> Response {
    connect::unary(
        async {
            let req: PathRequest = connect::unary_request(&headers, &body)?;
            let Envd { lease, .. } = e2b.envd(&headers).await?;
            requested_user(&headers, &lease)?;
            let path = absolute(&lease, "path", &req.path)?;
            if path.trim_end_matches('/').is_empty() {
                return Err(RpcError::invalid("path", "'/' cannot be removed"));
            }
            // envd removes what is there: a missing path is a no-op.
            let entry = match stat_path(&e2b, &lease, &path).await {
                Ok(entry) => entry,
                Err(e) if e.code == Code::NotFound => return Ok(json!({})),
                Err(e) => return Err(e),
            };
            run(&lease, &["rm", "-rf", "--", &path]).await?;
            Ok(json!({"entry": entry}))
        }
        .await,
    )
}

async fn list_dir(State(e2b): State<E2b>, headers: HeaderMap, body: Bytes) -> Response {
    connect::unary(
        async {
            let req: ListDirRequest = connect::unary_request(&headers, &body)?;
            let depth = match req.depth.unwrap_or(1) {
                0 => 1,
                d if d > MAX_DEPTH => {
                    return Err(RpcError::invalid(
                        "depth",
                        format!("{d} is above the maximum of {MAX_DEPTH}"),
                    ))
                }
                d => d,
            };
            let Envd { lease, .. } = e2b.envd(&headers).await?;
            requested_user(&headers, &lease)?;
            let path = absolute(&lease, "path", &req.path)?;
            let opts = list_options(&e2b);
            let mut out = Vec::new();
            let mut dirs = vec![(path.trim_end_matches('/').to_string(), 1u32)];
            if dirs[0].0.is_empty() {
                dirs[0].0 = "/".into();
            }
            while let Some((dir, level)) = dirs.pop() {
                let entries = lease
                    .list_dir(&dir, &opts)
                    .await
                    .map_err(|e| file_error(&e))?;
                for entry in &entries {
                    let info = entry_info(&dir, entry);
                    if entry.kind == EntryKind::Dir && level < depth {
                        if let Some(p) = info["path"].as_str() {
                            dirs.push((p.to_string(), level + 1));
                        }
                    }
                    out.push(info);
                }
            }
            // envd walks the tree in path order: each directory right
            // before its own entries, siblings by name.
            out.sort_by(|a, b| path_order(a).cmp(&path_order(b)));
            Ok(json!({ "entries": out }))
        }
        .await,
    )
}

/// The components of an entry's path, which order a walk as envd's.
fn path_order(entry: &Value) -> Vec<&str> {
    entry["path"].as_str().unwrap_or("").split('/').collect()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatchRequest {
    #[serde(default)]
    path: String,
    #[serde(default)]
    recursive: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatcherRequest {
    #[serde(default, alias = "watcher_id")]
    watcher_id: String,
}

/// What a listing shows of one entry, to tell changes.
struct Shown {
    kind: EntryKind,
    size: u64,
    mode: u32,
    modified: std::time::SystemTime,
}

/// The entries of a watched directory, by path relative to it.
type Seen = std::collections::BTreeMap<String, Shown>;

/// The entries under `dir` (down to `depth` levels), by path relative to it.
async fn snapshot(e2b: &E2b, lease: &Lease, dir: &str, depth: u32) -> Result<Seen, RpcError> {
    let opts = list_options(e2b);
    let mut seen = Seen::new();
    let mut dirs = vec![(dir.trim_end_matches('/').to_string(), String::new(), 1u32)];
    if dirs[0].0.is_empty() {
        dirs[0].0 = "/".into();
    }
    while let Some((abs, rel, level)) = dirs.pop() {
        let entries = match lease.list_dir(&abs, &opts).await {
            Ok(e) => e,
            // A subdirectory removed between two listings.
            Err(corral::FileError::NotFound { .. }) if !rel.is_empty() => continue,
            Err(e) => return Err(file_error(&e)),
        };
        for e in entries {
            let name = if rel.is_empty() {
                e.name.clone()
            } else {
                format!("{rel}/{}", e.name)
            };
            if e.kind == EntryKind::Dir && level < depth {
                let child = if abs == "/" {
                    format!("/{}", e.name)
                } else {
                    format!("{abs}/{}", e.name)
                };
                dirs.push((child, name.clone(), level + 1));
            }
            let shown = Shown {
                kind: e.kind,
                size: e.size,
                mode: e.mode,
                modified: e.modified,
            };
            seen.insert(name, shown);
        }
    }
    Ok(seen)
}

/// envd's events between two listings: a new entry is `CREATE` (and a
/// new file with content also `WRITE`, as a file system reports a file
/// created and written); a changed type, or a file's changed size or
/// modification time, is `WRITE`; changed permissions alone `CHMOD`; a gone
/// entry `REMOVE`.
fn changes(before: &Seen, after: &Seen) -> Vec<Value> {
    let mut out = Vec::new();
    let event = |name: &str, kind: &str| json!({"name": name, "type": kind});
    for (name, now) in after {
        match before.get(name) {
            None => {
                out.push(event(name, "EVENT_TYPE_CREATE"));
                if now.kind == EntryKind::File && now.size > 0 {
                    out.push(event(name, "EVENT_TYPE_WRITE"));
                }
            }
            Some(was) => {
                // A directory's own size and time change with its entries,
                // which have events of their own.
                let rewritten = now.kind != EntryKind::Dir
                    && (was.size != now.size || was.modified != now.modified);
                if was.kind != now.kind || rewritten {
                    out.push(event(name, "EVENT_TYPE_WRITE"));
                } else if was.mode != now.mode {
                    out.push(event(name, "EVENT_TYPE_CHMOD"));
                }
            }
        }
    }
    for name in before.keys().filter(|n| !after.contains_key(*n)) {
        out.push(json!({"name": name, "type": "EVENT_TYPE_REMOVE"}));
    }
    out
}

/// The directory a watch request names, checked to be one.
async fn watched(e2b: &E2b, lease: &Lease, req: &WatchRequest) -> Result<(String, u32), RpcError> {
    let path = absolute(lease, "path", &req.path)?;
    let info = stat_path(e2b, lease, &path).await?;
    if info["type"] != "FILE_TYPE_DIRECTORY" {
        return Err(RpcError::invalid(
            "path",
            format!("'{path}' is not a directory"),
        ));
    }
    Ok((path, if req.recursive { MAX_DEPTH } else { 1 }))
}

async fn watch_dir(State(e2b): State<E2b>, headers: HeaderMap, body: Bytes) -> Response {
    let r = async {
        let req: WatchRequest = connect::stream_request(&headers, &body)?;
        let Envd { lease, .. } = e2b.envd(&headers).await?;
        requested_user(&headers, &lease)?;
        let (dir, depth) = watched(&e2b, &lease, &req).await?;
        let first = snapshot(&e2b, &lease, &dir, depth).await?;
        Ok::<_, RpcError>((lease, dir, depth, first))
    }
    .await;
    let (tx, response) = connect::server_stream();
    let (lease, dir, depth, mut before) = match r {
        Ok(v) => v,
        Err(e) => {
            let _ = tx.try_send(connect::Item::End(Some(e)));
            return response;
        }
    };
    let _ = tx.try_send(connect::Item::Message(json!({"start": {}})));
    tokio::spawn(async move {
        let mut quiet = Duration::ZERO;
        loop {
            tokio::select! {
                () = tokio::time::sleep(WATCH_EVERY) => {}
                () = tx.closed() => return,
            }
            let after = match snapshot(&e2b, &lease, &dir, depth).await {
                Ok(a) => a,
                Err(e) => {
                    let _ = tx.send(connect::Item::End(Some(e))).await;
                    return;
                }
            };
            let events = changes(&before, &after);
            before = after;
            quiet += WATCH_EVERY;
            if events.is_empty() && quiet >= Duration::from_secs(30) {
                quiet = Duration::ZERO;
                if tx
                    .send(connect::Item::Message(json!({"keepalive": {}})))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            for ev in events {
                quiet = Duration::ZERO;
                if tx
                    .send(connect::Item::Message(json!({"filesystem": ev})))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
    });
    response
}

/// A watcher of `CreateWatcher`: its events wait for `GetWatcherEvents`,
/// which also compares the directory once more before it answers (so a
/// change made just before the call is in its answer, as inotify's would
/// be).
pub(super) struct Watcher {
    poller: std::sync::Arc<Poller>,
    events: std::sync::Mutex<Vec<Value>>,
    failed: std::sync::Mutex<Option<RpcError>>,
    task: tokio::task::AbortHandle,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One watched directory and its last listing.
struct Poller {
    lease: Lease,
    dir: String,
    depth: u32,
    before: tokio::sync::Mutex<Seen>,
}

impl Poller {
    /// Lists the directory again and queues what changed into `kept` (at
    /// most [`MAX_PENDING_EVENTS`] wait), in order: one comparison at a
    /// time.
    async fn poll(&self, e2b: &E2b, kept: &std::sync::Mutex<Vec<Value>>) -> Result<(), RpcError> {
        let mut before = self.before.lock().await;
        let after = snapshot(e2b, &self.lease, &self.dir, self.depth).await?;
        let mut events = changes(&before, &after);
        *before = after;
        let mut kept = super::lock(kept);
        events.truncate(MAX_PENDING_EVENTS.saturating_sub(kept.len()));
        kept.extend(events);
        Ok(())
    }
}

async fn create_watcher(State(e2b): State<E2b>, headers: HeaderMap, body: Bytes) -> Response {
    connect::unary(
        async {
            let req: WatchRequest = connect::unary_request(&headers, &body)?;
            let Envd { entry, lease } = e2b.envd(&headers).await?;
            requested_user(&headers, &lease)?;
            let (dir, depth) = watched(&e2b, &lease, &req).await?;
            let before = snapshot(&e2b, &lease, &dir, depth).await?;
            if super::lock(&entry.watchers).len() >= MAX_WATCHERS {
                return Err(RpcError::new(
                    Code::ResourceExhausted,
                    format!("sandbox already has {MAX_WATCHERS} watchers: remove one first"),
                ));
            }
            let poller = std::sync::Arc::new(Poller {
                lease,
                dir,
                depth,
                before: tokio::sync::Mutex::new(before),
            });
            let id = corral::host::random_hex(16);
            let weak_entry = std::sync::Arc::downgrade(&entry);
            let wid = id.clone();
            let e2b2 = e2b.clone();
            let polled = poller.clone();
            let task = tokio::spawn(async move {
                loop {
                    tokio::time::sleep(WATCH_EVERY).await;
                    let Some(entry) = weak_entry.upgrade() else {
                        return;
                    };
                    let Some(w) = super::lock(&entry.watchers).get(&wid).cloned() else {
                        return;
                    };
                    if let Err(e) = polled.poll(&e2b2, &w.events).await {
                        *super::lock(&w.failed) = Some(e);
                        return;
                    }
                }
            });
            let watcher = std::sync::Arc::new(Watcher {
                poller,
                events: Default::default(),
                failed: Default::default(),
                task: task.abort_handle(),
            });
            super::lock(&entry.watchers).insert(id.clone(), watcher);
            Ok(json!({ "watcherId": id }))
        }
        .await,
    )
}

fn find_watcher(
    entry: &super::Entry,
    req: &WatcherRequest,
) -> Result<std::sync::Arc<Watcher>, RpcError> {
    super::lock(&entry.watchers)
        .get(&req.watcher_id)
        .cloned()
        .ok_or_else(|| {
            RpcError::new(
                Code::NotFound,
                format!("watcher '{}' not found", req.watcher_id),
            )
        })
}

async fn get_watcher_events(State(e2b): State<E2b>, headers: HeaderMap, body: Bytes) -> Response {
    connect::unary(
        async {
            let req: WatcherRequest = connect::unary_request(&headers, &body)?;
            let Envd { entry, .. } = e2b.envd(&headers).await?;
            let w = find_watcher(&entry, &req)?;
            if super::lock(&w.failed).is_none() {
                if let Err(e) = w.poller.poll(&e2b, &w.events).await {
                    *super::lock(&w.failed) = Some(e);
                }
            }
            let events: Vec<Value> = std::mem::take(&mut *super::lock(&w.events));
            if events.is_empty() {
                if let Some(e) = super::lock(&w.failed).clone() {
                    return Err(e);
                }
            }
            Ok(json!({ "events": events }))
        }
        .await,
    )
}

async fn remove_watcher(State(e2b): State<E2b>, headers: HeaderMap, body: Bytes) -> Response {
    connect::unary(
        async {
            let req: WatcherRequest = connect::unary_request(&headers, &body)?;
            let Envd { entry, .. } = e2b.envd(&headers).await?;
            find_watcher(&entry, &req)?;
            super::lock(&entry.watchers).remove(&req.watcher_id);
            Ok(json!({}))
        }
        .await,
    )
}

/// An envd HTTP error: the SDK reads `message` and maps the status.
fn http_error(e: RpcError) -> Response {
    let status = match e.code {
        Code::InvalidArgument => StatusCode::BAD_REQUEST,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::ResourceExhausted => StatusCode::PAYLOAD_TOO_LARGE,
        Code::Unavailable => StatusCode::BAD_GATEWAY,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, e.message).into_response()
}

#[derive(Deserialize)]
struct FilesQuery {
    path: Option<String>,
    username: Option<String>,
    signature: Option<String>,
    signature_expiration: Option<i64>,
}

fn user_header(mut headers: HeaderMap, username: Option<&str>) -> HeaderMap {
    use base64::Engine;
    if let Some(u) = username {
        let v = base64::engine::general_purpose::STANDARD.encode(format!("{u}:"));
        if let Ok(v) = format!("Basic {v}").parse() {
            headers.insert(header::AUTHORIZATION, v);
        }
    }
    headers
}

fn files_query(
    q: Result<Query<FilesQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<FilesQuery, RpcError> {
    let Query(q) = q.map_err(|e| RpcError::invalid("query", e.body_text()))?;
    if q.signature.is_none() && q.signature_expiration.is_some() {
        return Err(RpcError::invalid(
            "signature_expiration",
            "is given without signature",
        ));
    }
    // The signed string is `PATH:OPERATION:USER:TOKEN`: with no ':' in the
    // user (none in a Unix user name) it splits one way only, so a URL
    // signed for one path, operation and user opens nothing else.
    if let Some(u) = q.username.as_deref().filter(|u| u.contains(':')) {
        return Err(RpcError::invalid(
            "username",
            format!(
                "'{}' contains ':', which no user name does",
                u.escape_debug()
            ),
        ));
    }
    if q.signature.is_some() && q.path.as_deref().unwrap_or("").is_empty() {
        return Err(RpcError::invalid(
            "path",
            "is required with a signature: a signed URL opens the one path it was signed for",
        ));
    }
    Ok(q)
}

/// The sandbox of a file transfer: opened by its access token, or by a
/// signed URL's `signature` for `operation` (`read` or `write`).
async fn files_envd(
    e2b: &E2b,
    headers: &HeaderMap,
    q: &FilesQuery,
    operation: &str,
) -> Result<Envd, RpcError> {
    match &q.signature {
        Some(signature) => {
            let signed = super::Signed {
                signature,
                expiration: q.signature_expiration,
                path: q.path.as_deref().unwrap_or(""),
                operation,
                user: q.username.as_deref().unwrap_or(""),
            };
            e2b.envd_signed(headers, &signed).await
        }
        None => e2b.envd(headers).await,
    }
}

async fn read_file(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    q: Result<Query<FilesQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let r = async {
        let q = files_query(q)?;
        let Envd { entry, lease } = files_envd(&e2b, &headers, &q, "read").await?;
        requested_user(&user_header(headers.clone(), q.username.as_deref()), &lease)?;
        let path = absolute(&lease, "path", q.path.as_deref().unwrap_or(""))?;
        let opts = list_options(&e2b);
        let held = e2b
            .app
            .ceilings()
            .file(&Holder::of(&entry.owner), opts.max_bytes)
            .map_err(|e| RpcError::from(ApiError::from(e)))?;
        let bytes = lease
            .read_file(&path, &opts)
            .await
            .map_err(|e| file_error(&e))?;
        Ok::<_, RpcError>((held, bytes))
    }
    .await;
    match r {
        // The reservation goes with the answer until a slow reader has
        // taken it all (`ceilings::hold`).
        Ok((held, bytes)) => (
            held,
            [(header::CONTENT_TYPE, "application/octet-stream")],
            bytes,
        )
            .into_response(),
        Err(e) => http_error(e),
    }
}

async fn write_files(
    State(e2b): State<E2b>,
    q: Result<Query<FilesQuery>, axum::extract::rejection::QueryRejection>,
    request: Request,
) -> Response {
    let headers = request.headers().clone();
    let r = async {
        let q = files_query(q)?;
        let Envd { entry, lease } = files_envd(&e2b, &headers, &q, "write").await?;
        requested_user(&user_header(headers.clone(), q.username.as_deref()), &lease)?;
        let ct = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let request = decoded(request, list_options(&e2b).max_bytes).await?;
        let mut files: Vec<(String, Bytes)> = Vec::new();
        if ct.starts_with("multipart/form-data") {
            let mut form = Multipart::from_request(request, &())
                .await
                .map_err(|e| RpcError::invalid("body", e.body_text()))?;
            while let Some(field) = form
                .next_field()
                .await
                .map_err(|e| RpcError::invalid("body", e.body_text()))?
            {
                let name = field.file_name().map(str::to_string);
                let data = field
                    .bytes()
                    .await
                    .map_err(|e| RpcError::invalid("body", e.body_text()))?;
                files.push((name.unwrap_or_default(), data));
            }
            // With `path` (what the SDK sends for one file, and what a
            // signed URL signs), the body is that one file: a second part
            // would otherwise go where its own name says.
            if let Some(p) = &q.path {
                if files.len() != 1 {
                    return Err(RpcError::invalid(
                        "body",
                        format!(
                            "has {} parts, but query parameter path '{}' names one file: send \
                             one part, or leave path out and name each part's file{}",
                            files.len(),
                            p.escape_debug(),
                            if q.signature.is_some() {
                                " (a signed upload URL writes its signed path only)"
                            } else {
                                ""
                            }
                        ),
                    ));
                }
                files[0].0 = p.clone();
            }
        } else if ct.is_empty() || ct.starts_with("application/octet-stream") {
            let Some(p) = &q.path else {
                return Err(RpcError::invalid(
                    "path",
                    "is required for an octet-stream upload",
                ));
            };
            let data = Bytes::from_request(request, &())
                .await
                .map_err(|e| RpcError::invalid("body", e.body_text()))?;
            files.push((p.clone(), data));
        } else {
            return Err(RpcError::invalid(
                "header Content-Type",
                format!("'{ct}' is neither multipart/form-data nor application/octet-stream"),
            ));
        }
        let mut out = Vec::new();
        for (name, data) in files {
            let path = absolute(&lease, "path", &name)?;
            let opts = FileOptions {
                mkdirs: true,
                ..list_options(&e2b)
            };
            let _held = e2b
                .app
                .ceilings()
                .file(&Holder::of(&entry.owner), data.len() as u64)
                .map_err(|e| RpcError::from(ApiError::from(e)))?;
            lease
                .write_file(&path, &data, &opts)
                .await
                .map_err(|e| file_error(&e))?;
            let (_, base) = split(&path);
            out.push(json!({"name": base, "type": "file", "path": path}));
        }
        Ok::<_, RpcError>(out)
    }
    .await;
    match r {
        Ok(out) => Json(out).into_response(),
        Err(e) => http_error(e),
    }
}

/// `request` with its body decoded as its `Content-Encoding` says
/// (`gzip`, or none), and at most `max` bytes once decoded.
async fn decoded(request: Request, max: u64) -> Result<Request, RpcError> {
    use std::io::Read;
    let encoding = match request.headers().get(header::CONTENT_ENCODING) {
        None => return Ok(request),
        Some(v) => v.to_str().unwrap_or("").trim().to_ascii_lowercase(),
    };
    if encoding.is_empty() || encoding == "identity" {
        return Ok(request);
    }
    if encoding != "gzip" {
        return Err(RpcError::unimplemented(
            &format!("header Content-Encoding '{encoding}'"),
            "uploads are gzip or uncompressed",
        ));
    }
    let (mut parts, body) = request.into_parts();
    let compressed = axum::body::to_bytes(body, usize::try_from(max).unwrap_or(usize::MAX))
        .await
        .map_err(|e| RpcError::invalid("body", e))?;
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(&compressed[..])
        .take(max.saturating_add(1))
        .read_to_end(&mut plain)
        .map_err(|e| RpcError::invalid("body", format!("not gzip: {e}")))?;
    if plain.len() as u64 > max {
        return Err(RpcError::new(
            Code::ResourceExhausted,
            format!("body: above the {max}-byte limit once decompressed"),
        ));
    }
    parts.headers.remove(header::CONTENT_ENCODING);
    parts.headers.remove(header::CONTENT_LENGTH);
    Ok(Request::from_parts(parts, axum::body::Body::from(plain)))
}

/// `GET /health`: 204 when the sandbox the headers name is alive.
async fn health(State(e2b): State<E2b>, headers: HeaderMap) -> Response {
    // A probe, not activity: the sandbox is looked at, not leased.
    match e2b.envd_observed(&headers) {
        Ok(sandbox) if sandbox.looks_alive() => StatusCode::NO_CONTENT.into_response(),
        Ok(_) => error(StatusCode::BAD_GATEWAY, "the sandbox is not running").into_response(),
        Err(e) => http_error(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_into_parent_and_name() {
        assert_eq!(split("/a/b"), ("/a", "b"));
        assert_eq!(split("/a/b/"), ("/a", "b"));
        assert_eq!(split("/a"), ("/", "a"));
        assert_eq!(split("/"), ("/", ""));
    }

    #[test]
    fn listings_compare_into_envd_events() {
        use std::time::{Duration, UNIX_EPOCH};
        let at = |s: u64| UNIX_EPOCH + Duration::from_secs(s);
        let shown = |kind, size, mode, t| Shown {
            kind,
            size,
            mode,
            modified: at(t),
        };
        let mut before = Seen::new();
        for name in ["kept", "grown", "gone", "chmod", "touched"] {
            before.insert(name.into(), shown(EntryKind::File, 1, 0o644, 1));
        }
        before.insert("dir".into(), shown(EntryKind::Dir, 4096, 0o755, 1));
        let mut after = Seen::new();
        for name in ["kept", "touched", "chmod", "grown"] {
            after.insert(name.into(), shown(EntryKind::File, 1, 0o644, 1));
        }
        after.insert("grown".into(), shown(EntryKind::File, 2, 0o644, 1));
        after.insert("touched".into(), shown(EntryKind::File, 1, 0o644, 2));
        after.insert("chmod".into(), shown(EntryKind::File, 1, 0o600, 1));
        // A directory whose entries changed: its own events say so.
        after.insert("dir".into(), shown(EntryKind::Dir, 8192, 0o755, 2));
        after.insert("new".into(), shown(EntryKind::Dir, 0, 0o755, 2));
        after.insert("new.txt".into(), shown(EntryKind::File, 3, 0o644, 2));
        after.insert("empty.txt".into(), shown(EntryKind::File, 0, 0o644, 2));
        let got: Vec<(String, String)> = changes(&before, &after)
            .iter()
            .map(|e| {
                (
                    e["name"].as_str().unwrap_or("").into(),
                    e["type"].as_str().unwrap_or("").into(),
                )
            })
            .collect();
        let want = [
            ("chmod", "EVENT_TYPE_CHMOD"),
            ("empty.txt", "EVENT_TYPE_CREATE"),
            ("grown", "EVENT_TYPE_WRITE"),
            ("new", "EVENT_TYPE_CREATE"),
            ("new.txt", "EVENT_TYPE_CREATE"),
            ("new.txt", "EVENT_TYPE_WRITE"),
            ("touched", "EVENT_TYPE_WRITE"),
            ("gone", "EVENT_TYPE_REMOVE"),
        ];
        assert_eq!(got, want.map(|(a, b)| (a.to_string(), b.to_string())));
    }

    #[test]
    fn deep_listings_are_in_path_order() {
        let paths = ["/w/sub.txt", "/w/a", "/w/sub", "/w/sub/c", "/w/a/z"];
        let mut entries: Vec<Value> = paths.iter().map(|p| json!({ "path": p })).collect();
        entries.sort_by(|a, b| path_order(a).cmp(&path_order(b)));
        let got: Vec<&str> = entries.iter().filter_map(|e| e["path"].as_str()).collect();
        assert_eq!(got, ["/w/a", "/w/a/z", "/w/sub", "/w/sub/c", "/w/sub.txt"]);
    }

    #[test]
    fn link_targets_resolve_by_name() {
        assert_eq!(normalize("/a/b/../c/./d"), "/a/c/d");
        assert_eq!(normalize("/../x//y/"), "/x/y");
    }

    #[test]
    fn permissions_read_like_ls() {
        assert_eq!(permissions(EntryKind::File, 0o644), "-rw-r--r--");
        assert_eq!(permissions(EntryKind::Dir, 0o755), "drwxr-xr-x");
    }
}
