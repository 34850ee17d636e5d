//! E2B's template API (what `e2b`'s `Template.build()`, `from_dockerfile`
//! and Harbor's `e2b` environment call), over corral's template builds
//! ([`corral::Runtime::build_template`]): a front end, never a second
//! builder. A build is requested (`POST /v3/templates`: a build id, tags
//! assigned at once), the files of each `COPY` are uploaded by hash to a
//! link of their own (the SDK sends no key there: the link's one-time
//! token is its credential), the build is triggered with E2B's steps
//! (`POST /v2/templates/{id}/builds/{build}`), which are translated into a
//! corral recipe and built in the caller's namespace, in sandboxes of its
//! own spec, and its status and log are polled. A sandbox starts from
//! `name`, `name:tag` or `name:BUILD` once that build is ready.
//!
//! E2B's semantics kept: steps run as `user` (made if missing, as E2B's
//! base step does) in its home unless a `USER` or `WORKDIR` says
//! otherwise, a step's own user wins, `USER` makes a missing user, `COPY`
//! is owned by the current user unless it names one, `ENV` values expand
//! `$VAR` of the image and earlier steps. Differences: steps run under
//! `/bin/sh -c` (E2B: `bash -l -c`); the registry of E2B names, tags and
//! builds lives in the service's memory (a restart forgets the names; the
//! templates themselves, corral's, stay); any `force` rebuilds every step.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Json;
use corral::template::{Op, Recipe, Step};
use corral::{BuildEvent, BuildRequest};
use corral_core::principal::Principal;
use corral_core::Error;
use serde::Deserialize;
use serde_json::{json, Value};

use super::control::{api_error, body, caller, error, rfc3339, E2bError};
use super::E2b;

/// Most bytes of uploaded `COPY` files the service keeps in memory.
const MAX_BLOBS: usize = 1 << 30;
/// Largest one upload (decompressed).
const MAX_BLOB: usize = 512 << 20;

pub(super) fn routes() -> axum::Router<E2b> {
    axum::Router::new()
        .route("/v3/templates", post(request_build))
        .route("/templates/{id}/files/{hash}", get(files))
        .route("/templates/{id}/files/{hash}/upload", put(upload))
        .route("/v2/templates/{id}/builds/{build}", post(trigger))
        .route("/templates/{id}/builds/{build}/status", get(status))
        .route("/templates/aliases/{alias}", get(alias))
        .route("/templates/{id}/tags", get(tags))
        .route("/templates/tags", post(assign_tags).delete(remove_tags))
}

/// The E2B names, tags and builds of the service.
#[derive(Default)]
pub(super) struct Registry {
    state: Mutex<Books>,
}

#[derive(Default)]
struct Books {
    /// Templates by owner and name.
    templates: HashMap<(String, String), Named>,
    builds: HashMap<String, Arc<Build>>,
    /// Uploaded files by owner and hash: a tar archive each.
    blobs: HashMap<(String, String), Arc<Vec<u8>>>,
    blob_bytes: usize,
    /// One-time upload links: token, owner, template, hash.
    uploads: Vec<(String, Principal, String, String)>,
}

struct Named {
    /// Tag: build id and when it was assigned.
    tags: BTreeMap<String, (String, SystemTime)>,
}

struct Build {
    id: String,
    template: String,
    owner: Principal,
    progress: Mutex<Progress>,
}

#[derive(Default)]
struct Progress {
    /// `waiting`, `building`, `ready` or `error`.
    status: &'static str,
    logs: Vec<Value>,
    reason: Option<Value>,
    /// The corral template, once ready.
    corral: Option<String>,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, Books> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn build(&self, owner: &Principal, template: &str, id: &str) -> Option<Arc<Build>> {
        let st = self.lock();
        st.builds
            .get(id)
            .filter(|b| b.owner == *owner && b.template == template)
            .cloned()
    }

    fn owns(&self, owner: &Principal, template: &str) -> bool {
        self.lock()
            .templates
            .contains_key(&(owner.id(), template.to_string()))
    }

    /// The corral template `template_id` (`name`, `name:tag` or
    /// `name:BUILD`) of `owner` starts from: `None` when `name` is not an
    /// E2B template of its; a 404 when that build is not ready.
    pub(super) fn resolve(
        &self,
        owner: &Principal,
        template_id: &str,
    ) -> Option<Result<String, E2bError>> {
        let (name, tag) = template_id
            .split_once(':')
            .unwrap_or((template_id, "default"));
        let st = self.lock();
        let named = st.templates.get(&(owner.id(), name.to_string()))?;
        let build_id = if is_uuid(tag) {
            Some(tag.to_string())
        } else {
            named.tags.get(tag).map(|(b, _)| b.clone())
        };
        let missing = || {
            error(
                StatusCode::NOT_FOUND,
                format!("tag '{tag}' does not exist for template '{name}'"),
            )
        };
        let Some(build) = build_id.and_then(|b| st.builds.get(&b).cloned()) else {
            return Some(Err(missing()));
        };
        let p = build.progress.lock().unwrap_or_else(|p| p.into_inner());
        Some(match (&p.corral, build.template == name) {
            (Some(c), true) if p.status == "ready" => Ok(c.clone()),
            _ => Err(missing()),
        })
    }

    /// Forgets E2B template `name` of `owner`; the corral templates of its
    /// builds, to delete.
    pub(super) fn forget(&self, owner: &Principal, name: &str) -> Option<Vec<String>> {
        let mut st = self.lock();
        st.templates.remove(&(owner.id(), name.to_string()))?;
        let mut corral = Vec::new();
        st.builds.retain(|_, b| {
            if b.owner == *owner && b.template == name {
                let p = b.progress.lock().unwrap_or_else(|p| p.into_inner());
                corral.extend(p.corral.clone());
                false
            } else {
                true
            }
        });
        Some(corral)
    }
}

/// A random UUID (version 4), as E2B's build ids are.
fn new_uuid() -> String {
    let h = corral::host::random_hex(32).into_bytes();
    let s = |a: usize, b: usize| String::from_utf8_lossy(&h[a..b]).into_owned();
    format!(
        "{}-{}-4{}-{}{}-{}",
        s(0, 8),
        s(8, 12),
        s(13, 16),
        ["8", "9", "a", "b"][(h[16] % 4) as usize],
        s(17, 20),
        s(20, 32)
    )
}

fn is_uuid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.iter().map(|p| p.len()).collect::<Vec<_>>() == [8, 4, 4, 4, 12]
        && parts
            .iter()
            .all(|p| p.chars().all(|c| c.is_ascii_hexdigit()))
}

fn valid(what: &str, s: &str, extra: &str) -> Result<String, E2bError> {
    let v = s.trim().to_lowercase();
    if v.is_empty()
        || v.len() > 100
        || !v.chars().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || "-_".contains(c) || extra.contains(c)
        })
    {
        return Err(error(
            StatusCode::BAD_REQUEST,
            format!("{what} '{s}' must be lower-case letters, digits, '-' or '_'{extra}"),
        ));
    }
    Ok(v)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestBuild {
    name: Option<String>,
    alias: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
    #[allow(dead_code)]
    cpu_count: Option<u64>,
    #[allow(dead_code)]
    #[serde(rename = "memoryMB")]
    memory_mb: Option<u64>,
    #[allow(dead_code)]
    min_free_disk_mb: Option<u64>,
    #[allow(dead_code)]
    team_id: Option<String>,
}

/// `POST /v3/templates`: a new build of a template (made if new), its tags
/// pointing at it from now on.
async fn request_build(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    bytes: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let owner = caller(&e2b, &headers)?;
    let req: RequestBuild = body(&bytes)?;
    let full = req
        .name
        .or(req.alias)
        .ok_or_else(|| error(StatusCode::BAD_REQUEST, "name is required"))?;
    let (name, tag) = match full.split_once(':') {
        Some((n, t)) => (n, Some(t)),
        None => (full.as_str(), None),
    };
    let name = valid("name", name, "")?;
    let mut all_tags = Vec::new();
    for t in tag.into_iter().chain(req.tags.iter().map(String::as_str)) {
        let t = valid("tag", t, ".")?;
        if is_uuid(&t) {
            return Err(error(
                StatusCode::BAD_REQUEST,
                format!("tag '{t}' may not be a UUID"),
            ));
        }
        if !all_tags.contains(&t) {
            all_tags.push(t);
        }
    }
    if all_tags.is_empty() {
        all_tags.push("default".into());
    }
    let id = new_uuid();
    let now = SystemTime::now();
    let build = Arc::new(Build {
        id: id.clone(),
        template: name.clone(),
        owner: owner.clone(),
        progress: Mutex::new(Progress {
            status: "waiting",
            ..Progress::default()
        }),
    });
    {
        let mut st = e2b.templates.lock();
        let named = st
            .templates
            .entry((owner.id(), name.clone()))
            .or_insert_with(|| Named {
                tags: BTreeMap::new(),
            });
        for t in &all_tags {
            named.tags.insert(t.clone(), (id.clone(), now));
        }
        st.builds.insert(id.clone(), build);
    }
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({
            "templateID": name,
            "buildID": id,
            "public": false,
            "names": [full],
            "tags": all_tags,
            "aliases": [name],
        })),
    )
        .into_response())
}

fn no_template(id: &str) -> E2bError {
    error(StatusCode::NOT_FOUND, format!("template '{id}' not found"))
}

/// `GET /templates/{id}/files/{hash}`: whether the files of a `COPY` are
/// here already, and a one-time link to upload them to.
async fn files(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    Path((id, hash)): Path<(String, String)>,
) -> Result<Response, E2bError> {
    let owner = caller(&e2b, &headers)?;
    if !e2b.templates.owns(&owner, &id) {
        return Err(no_template(&id));
    }
    if hash.len() != 64 || !hash.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(error(
            StatusCode::BAD_REQUEST,
            format!("hash '{hash}' is not a SHA-256"),
        ));
    }
    let host = headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .ok_or_else(|| {
            error(
                StatusCode::BAD_REQUEST,
                "no Host header to link the upload to",
            )
        })?;
    let token = corral::host::random_hex(32);
    let present = {
        let mut st = e2b.templates.lock();
        st.uploads
            .retain(|(_, o, t, h)| !(o == &owner && t == &id && h == &hash));
        st.uploads
            .push((token.clone(), owner.clone(), id.clone(), hash.clone()));
        if st.uploads.len() > 10_000 {
            st.uploads.remove(0);
        }
        st.blobs.contains_key(&(owner.id(), hash.clone()))
    };
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "present": present,
            "url": format!("http://{host}/templates/{id}/files/{hash}/upload?token={token}"),
        })),
    )
        .into_response())
}

/// The owner of upload link `token` for `id`/`hash`, for the listener's
/// guard (the SDK sends no key with the upload).
pub(super) fn upload_owner(e2b: &E2b, path: &str, query: &str) -> Option<Principal> {
    let rest = path.strip_prefix("/templates/")?.strip_suffix("/upload")?;
    let (id, hash) = rest.split_once("/files/")?;
    let q: HashMap<String, String> = serde_urlencoded::from_str(query).ok()?;
    let token = q.get("token")?;
    let st = e2b.templates.lock();
    st.uploads
        .iter()
        .find(|(t, _, i, h)| {
            super::same_bytes(t.as_bytes(), token.as_bytes()) && i == id && h == hash
        })
        .map(|(_, o, _, _)| o.clone())
}

#[derive(Deserialize)]
struct UploadQuery {
    token: String,
}

/// The upload of a `COPY`'s files: a tar archive (gzip or not) of paths
/// relative to the build context, authorised by its link's token alone.
async fn upload(
    State(e2b): State<E2b>,
    Path((id, hash)): Path<(String, String)>,
    Query(q): Query<UploadQuery>,
    bytes: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let owner =
        {
            let mut st = e2b.templates.lock();
            let at = st.uploads.iter().position(|(t, _, i, h)| {
                super::same_bytes(t.as_bytes(), q.token.as_bytes()) && *i == id && *h == hash
            });
            match at {
                Some(at) => st.uploads.remove(at).1,
                None => return Err(error(
                    StatusCode::UNAUTHORIZED,
                    "this upload link is not (or no longer) valid: ask for the file's link again",
                )),
            }
        };
    let data = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&bytes[..])
            .take(MAX_BLOB as u64 + 1)
            .read_to_end(&mut out)
            .map_err(|e| error(StatusCode::BAD_REQUEST, format!("not a gzip archive: {e}")))?;
        out
    } else {
        bytes.to_vec()
    };
    if data.len() > MAX_BLOB {
        return Err(error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the files of one COPY are at most {MAX_BLOB} bytes"),
        ));
    }
    let mut st = e2b.templates.lock();
    if st.blob_bytes + data.len() > MAX_BLOBS {
        // The oldest uploads go first; a build that still needs one is
        // told to upload it again.
        let keys: Vec<_> = st.blobs.keys().cloned().collect();
        for k in keys {
            if st.blob_bytes + data.len() <= MAX_BLOBS {
                break;
            }
            if let Some(b) = st.blobs.remove(&k) {
                st.blob_bytes -= b.len();
            }
        }
    }
    st.blob_bytes += data.len();
    if let Some(old) = st.blobs.insert((owner.id(), hash), Arc::new(data)) {
        st.blob_bytes -= old.len();
    }
    Ok(StatusCode::OK.into_response())
}

/// E2B's `TemplateBuildStartV2`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Trigger {
    from_image: Option<String>,
    from_template: Option<String>,
    from_image_registry: Option<Value>,
    #[serde(default)]
    force: bool,
    #[serde(default)]
    steps: Vec<E2bStep>,
    start_cmd: Option<String>,
    ready_cmd: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct E2bStep {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    force: bool,
    files_hash: Option<String>,
    #[allow(dead_code)]
    force_upload: Option<bool>,
}

/// The user E2B's builds run as unless told otherwise, made if missing.
const E2B_USER: &str = "user";

/// Makes `user` if the image has none of the name (E2B's `USER` does).
fn ensure_user(user: &str) -> Op {
    let q = corral::template::shell_quote(user);
    Op::Run {
        argv: vec![
            "/bin/sh".into(),
            "-c".into(),
            format!(
                "id -u {q} >/dev/null 2>&1 || useradd --create-home --shell /bin/bash {q} 2>/dev/null \
                 || adduser -D {q}"
            ),
        ],
        env: Vec::new(),
        user: Some("0".into()),
    }
}

/// E2B's steps as a corral recipe, with each step's label in E2B's log
/// (`base` for the ones E2B's own base step makes) and the build context
/// (the uploaded files of every `COPY`, merged).
fn translate(
    e2b: &E2b,
    owner: &Principal,
    t: &Trigger,
) -> Result<(Recipe, Vec<String>, Vec<u8>), String> {
    if t.from_image_registry.is_some() {
        return Err("fromImageRegistry: registry credentials are not taken here; the image must be on the daemon or pullable by it".into());
    }
    let from = match (&t.from_image, &t.from_template) {
        (Some(_), Some(_)) => return Err("give fromImage or fromTemplate, not both".into()),
        (Some(i), None) => i.clone(),
        (None, Some(name)) => {
            let resolved = e2b
                .templates
                .resolve(owner, name)
                .ok_or_else(|| format!("fromTemplate: no template '{name}'"))?
                .map_err(|e| format!("fromTemplate: {}", e.message()))?;
            format!("template:{resolved}")
        }
        (None, None) => "e2bdev/base".into(),
    };
    let mut steps = Vec::new();
    let mut labels = Vec::new();
    let mut push = |op: Op, label: String, steps: &mut Vec<Step>| {
        steps.push(Step { op, line: None });
        labels.push(label);
    };
    if t.from_template.is_none() {
        push(ensure_user(E2B_USER), "base".into(), &mut steps);
        push(
            Op::User {
                user: E2B_USER.into(),
            },
            "base".into(),
            &mut steps,
        );
        push(
            Op::Workdir {
                path: format!("/home/{E2B_USER}"),
            },
            "base".into(),
            &mut steps,
        );
    }
    let mut user = E2B_USER.to_string();
    let mut context = tar::Builder::new(Vec::new());
    for (i, s) in t.steps.iter().enumerate() {
        let label = (i + 1).to_string();
        let arg = |n: usize| s.args.get(n).cloned().unwrap_or_default();
        match s.kind.to_ascii_uppercase().as_str() {
            "RUN" => {
                let run_as = s.args.get(1).filter(|u| !u.is_empty()).cloned();
                push(
                    Op::Run {
                        argv: vec!["/bin/sh".into(), "-c".into(), arg(0)],
                        env: Vec::new(),
                        user: run_as,
                    },
                    label,
                    &mut steps,
                );
            }
            "COPY" | "ADD" => {
                let hash = s
                    .files_hash
                    .clone()
                    .ok_or_else(|| format!("steps[{i}]: a COPY without filesHash"))?;
                let blob = e2b
                    .templates
                    .lock()
                    .blobs
                    .get(&(owner.id(), hash.clone()))
                    .cloned()
                    .ok_or_else(|| {
                        format!("steps[{i}]: the files of hash {hash} were not uploaded")
                    })?;
                append_all(&mut context, &blob).map_err(|e| format!("steps[{i}]: {e}"))?;
                let owner_of = match arg(2) {
                    o if o.is_empty() => user.clone(),
                    o if o.contains(':') => o,
                    o => format!("{o}:{o}"),
                };
                let chmod = Some(arg(3)).filter(|m| !m.is_empty());
                push(
                    Op::Copy {
                        src: vec![arg(0)],
                        inline: Vec::new(),
                        dest: arg(1),
                        chown: Some(owner_of),
                        chmod,
                    },
                    label,
                    &mut steps,
                );
            }
            "ENV" | "ARG" => {
                for pair in s.args.chunks(2) {
                    push(
                        Op::Env {
                            name: pair[0].clone(),
                            value: pair.get(1).cloned().unwrap_or_default(),
                        },
                        label.clone(),
                        &mut steps,
                    );
                }
            }
            "WORKDIR" => push(Op::Workdir { path: arg(0) }, label, &mut steps),
            "USER" => {
                user = arg(0);
                push(ensure_user(&user), label.clone(), &mut steps);
                push(Op::User { user: user.clone() }, label, &mut steps);
            }
            other => {
                return Err(format!(
                    "steps[{i}].type '{other}' is not a step E2B builds"
                ))
            }
        }
    }
    let context = context.into_inner().map_err(|e| e.to_string())?;
    Ok((
        Recipe {
            from,
            steps,
            start: t.start_cmd.clone(),
            ready: t
                .ready_cmd
                .clone()
                .or_else(|| t.start_cmd.as_ref().map(|_| "sleep 20".into())),
            notes: Vec::new(),
        },
        labels,
        context,
    ))
}

/// Appends every entry of tar archive `blob` to `to`.
fn append_all(to: &mut tar::Builder<Vec<u8>>, blob: &[u8]) -> std::io::Result<()> {
    let mut a = tar::Archive::new(blob);
    for entry in a.entries()? {
        let mut entry = entry?;
        let mut header = entry.header().clone();
        let path = entry.path()?.into_owned();
        let mut data = Vec::new();
        entry.read_to_end(&mut data)?;
        to.append_data(&mut header, path, data.as_slice())?;
    }
    Ok(())
}

/// `POST /v2/templates/{id}/builds/{build}`: starts a requested build with
/// E2B's steps; its status reads `building` from the answer on.
async fn trigger(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    Path((id, build_id)): Path<(String, String)>,
    bytes: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let owner = caller(&e2b, &headers)?;
    let t: Trigger = body(&bytes)?;
    if !is_uuid(&build_id) {
        return Err(error(
            StatusCode::BAD_REQUEST,
            format!("build '{build_id}' is not a UUID"),
        ));
    }
    let build = e2b.templates.build(&owner, &id, &build_id).ok_or_else(|| {
        error(
            StatusCode::NOT_FOUND,
            format!("Build '{build_id}' not found"),
        )
    })?;
    let (recipe, labels, context) =
        translate(&e2b, &owner, &t).map_err(|e| error(StatusCode::BAD_REQUEST, e))?;
    let spec = crate::api::templates::build_spec(&e2b.app, &owner, &recipe.from, "fromImage")
        .await
        .map_err(api_error)?;
    {
        let mut p = build.progress.lock().unwrap_or_else(|p| p.into_inner());
        if p.status != "waiting" {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "build is not in waiting state",
            ));
        }
        p.status = "building";
    }
    let corral_name = format!("e2b-{id}-{}", &build_id.replace('-', "")[..16]);
    let mut req = BuildRequest::new(&corral_name, recipe, spec);
    req.namespace = owner.snapshot_namespace();
    req.context = Some(context);
    req.skip_cache = t.force || t.steps.iter().any(|s| s.force);
    let runtime = e2b.app.runtime().clone();
    tokio::spawn(async move {
        let log = |p: &mut Progress, level: &str, message: String, step: &str| {
            p.logs.push(json!({
                "timestamp": rfc3339(SystemTime::now()),
                "level": level,
                "message": message,
                "step": step,
            }));
        };
        let current = Mutex::new(String::from("base"));
        let progress = |e: BuildEvent| {
            let mut p = build.progress.lock().unwrap_or_else(|p| p.into_inner());
            match e {
                BuildEvent::Step {
                    index,
                    total,
                    text,
                    cached,
                    ..
                } => {
                    let step = labels
                        .get(index - 1)
                        .cloned()
                        .unwrap_or_else(|| "base".into());
                    *current.lock().unwrap_or_else(|p| p.into_inner()) = step.clone();
                    let cached = if cached { "CACHED " } else { "" };
                    log(
                        &mut p,
                        "info",
                        format!("[builder {index}/{total}] {cached}{text}"),
                        &step,
                    );
                }
                BuildEvent::Output { text, .. } => {
                    let step = current.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    for line in text.lines() {
                        log(&mut p, "info", line.to_string(), &step);
                    }
                }
                BuildEvent::Note { text } => log(&mut p, "warn", text, "base"),
            }
        };
        let result = runtime.build_template(&req, &progress).await;
        let mut p = build.progress.lock().unwrap_or_else(|p| p.into_inner());
        match result {
            Ok(_) => {
                log(&mut p, "info", "Build finished".into(), "finalize");
                p.corral = Some(corral_name);
                p.status = "ready";
            }
            Err(e) => {
                let step = match &e {
                    Error::Build(b) => labels
                        .get(b.step - 1)
                        .cloned()
                        .unwrap_or_else(|| "base".into()),
                    _ => "base".into(),
                };
                let message = match &e {
                    Error::Build(b) => {
                        format!("{}: {}\n{}", b.instruction, b.detail, b.output.trim_end())
                    }
                    other => other.to_string(),
                };
                log(&mut p, "error", message.clone(), &step);
                p.reason = Some(json!({"message": message, "step": step}));
                p.status = "error";
            }
        }
    });
    Ok(StatusCode::ACCEPTED.into_response())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatusQuery {
    logs_offset: Option<usize>,
    limit: Option<usize>,
    level: Option<String>,
}

/// `GET /templates/{id}/builds/{build}/status`.
async fn status(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    Path((id, build_id)): Path<(String, String)>,
    Query(q): Query<StatusQuery>,
) -> Result<Response, E2bError> {
    let owner = caller(&e2b, &headers)?;
    let build = e2b.templates.build(&owner, &id, &build_id).ok_or_else(|| {
        error(
            StatusCode::BAD_REQUEST,
            format!("Build '{build_id}' not found"),
        )
    })?;
    let p = build.progress.lock().unwrap_or_else(|p| p.into_inner());
    let offset = q.logs_offset.unwrap_or(0);
    let limit = q.limit.unwrap_or(100).min(100);
    let entries: Vec<&Value> = p
        .logs
        .iter()
        .filter(|e| q.level.as_deref().is_none_or(|l| e["level"] == l))
        .skip(offset)
        .take(limit)
        .collect();
    let mut answer = json!({
        "templateID": build.template,
        "buildID": build.id,
        "status": p.status,
        "logs": [],
        "logEntries": entries,
    });
    if let Some(reason) = &p.reason {
        answer["reason"] = reason.clone();
    }
    Ok((StatusCode::OK, Json(answer)).into_response())
}

/// `GET /templates/aliases/{alias}`: whether the caller has a template of
/// the name.
async fn alias(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    Path(alias): Path<String>,
) -> Result<Response, E2bError> {
    let owner = caller(&e2b, &headers)?;
    let (name, tag) = match alias.split_once(':') {
        Some((n, t)) => (n.to_string(), Some(t)),
        None => (alias.clone(), None),
    };
    if !e2b.templates.owns(&owner, &name) {
        return Err(error(
            StatusCode::NOT_FOUND,
            format!("template '{alias}' not found"),
        ));
    }
    if tag.is_some() {
        if let Some(Err(e)) = e2b.templates.resolve(&owner, &alias) {
            return Err(e);
        }
    }
    Ok((
        StatusCode::OK,
        Json(json!({"templateID": name, "public": false})),
    )
        .into_response())
}

/// `GET /templates/{id}/tags`: each tag's build, whatever its status.
async fn tags(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, E2bError> {
    let owner = caller(&e2b, &headers)?;
    let st = e2b.templates.lock();
    let named = st
        .templates
        .get(&(owner.id(), id.clone()))
        .ok_or_else(|| no_template(&id))?;
    let list: Vec<Value> = named
        .tags
        .iter()
        .map(|(tag, (build, at))| json!({"tag": tag, "buildID": build, "createdAt": rfc3339(*at)}))
        .collect();
    Ok((StatusCode::OK, Json(Value::Array(list))).into_response())
}

#[derive(Deserialize)]
struct AssignTags {
    target: String,
    tags: Vec<String>,
}

/// `POST /templates/tags`: points `tags` at the build `target` names.
async fn assign_tags(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    bytes: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let owner = caller(&e2b, &headers)?;
    let req: AssignTags = body(&bytes)?;
    let (name, tag) = req
        .target
        .split_once(':')
        .unwrap_or((&req.target, "default"));
    let mut st = e2b.templates.lock();
    let named = st
        .templates
        .get_mut(&(owner.id(), name.to_string()))
        .ok_or_else(|| no_template(name))?;
    let build = match named.tags.get(tag) {
        Some((b, _)) => b.clone(),
        None if is_uuid(tag) => tag.to_string(),
        None => {
            return Err(error(
                StatusCode::NOT_FOUND,
                format!("Template '{name}' with tag '{tag}' not found"),
            ))
        }
    };
    let mut assigned = Vec::new();
    for t in &req.tags {
        let t = valid("tag", t, ".")?;
        named
            .tags
            .insert(t.clone(), (build.clone(), SystemTime::now()));
        assigned.push(t);
    }
    Ok((
        StatusCode::CREATED,
        Json(json!({"tags": assigned, "buildID": build})),
    )
        .into_response())
}

#[derive(Deserialize)]
struct RemoveTags {
    name: String,
    tags: Vec<String>,
}

/// `DELETE /templates/tags`.
async fn remove_tags(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    bytes: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let owner = caller(&e2b, &headers)?;
    let req: RemoveTags = body(&bytes)?;
    if req.name.contains(':') || req.tags.iter().any(|t| t == "default") {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "name a template without a tag, and never the tag 'default'",
        ));
    }
    let mut st = e2b.templates.lock();
    let named = st
        .templates
        .get_mut(&(owner.id(), req.name.clone()))
        .ok_or_else(|| no_template(&req.name))?;
    for t in &req.tags {
        named.tags.remove(t);
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_ids_are_uuids() {
        for _ in 0..50 {
            let id = new_uuid();
            assert!(is_uuid(&id), "{id}");
            assert_eq!(&id[14..15], "4");
        }
        assert!(!is_uuid("default"));
    }
}
