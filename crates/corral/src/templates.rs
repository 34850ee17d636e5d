//! Template builds: a [`Recipe`] run step by step in corral sandboxes of
//! the caller's own spec (its hardening, limits, network and egress
//! policy: a build is untrusted code like any command), each file-changing
//! step committed as a cached layer, the last one as the template.
//!
//! A step's layer is cached under its key ([`template::cache_key`]: the
//! parent layer, the step, the environment, directory and user it runs
//! with, the digest of what it copies) in its owner's namespace only; an
//! unchanged step is taken from the cache and not run. Two builds reaching
//! the same step at once run it once ([`StepLocks`]). Steps run in one
//! sandbox for as long as the user stays the same, so processes of a step
//! end with it as in a Dockerfile build (each step's tree is killed); a
//! cached step or a change of user starts a sandbox from the layer.
//!
//! `/tmp` of a build sandbox is part of its file system (no tmpfs), so
//! what a step leaves there is in the layer, as `docker build` keeps it.

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use corral_core::backend::BuiltImage;
use corral_core::template::{self, BuildState, Op, Recipe, TemplateConfig};
use corral_core::{CommandSpec, Error, FailureKind, SandboxSpec, SpecError};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::files::FileOptions;
use crate::{OutputStream, Runtime, Sandbox};

/// Template build steps in progress, by cache image.
#[derive(Default)]
pub(crate) struct StepLocks(Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>);

impl StepLocks {
    fn get(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, w| w.strong_count() > 0);
        if let Some(l) = map.get(key).and_then(Weak::upgrade) {
            return l;
        }
        let l = Arc::new(tokio::sync::Mutex::new(()));
        map.insert(key.to_string(), Arc::downgrade(&l));
        l
    }
}

/// What to build.
#[derive(Debug, Clone)]
pub struct BuildRequest {
    /// The template's name ([`template::validate_name`]).
    pub name: String,
    /// Its owner's namespace (`None`: the operator's); its steps' cache is
    /// this namespace's alone.
    pub namespace: Option<String>,
    /// The steps.
    pub recipe: Recipe,
    /// The build context, a tar archive, which `COPY` reads.
    pub context: Option<Vec<u8>>,
    /// The spec every build sandbox is made from (its image is replaced by
    /// each step's parent): the caller's own, as for its sandboxes.
    pub spec: SandboxSpec,
    /// Run every step, cached or not (and cache the new layers).
    pub skip_cache: bool,
    /// Longest one step may run.
    pub step_timeout: Duration,
    /// Most output kept of one step (head and tail), and sent as events.
    pub max_output: u64,
}

impl BuildRequest {
    /// A request with the defaults: 30 minutes a step, 1 MiB of output.
    pub fn new(name: &str, recipe: Recipe, spec: SandboxSpec) -> BuildRequest {
        BuildRequest {
            name: name.to_string(),
            namespace: None,
            recipe,
            context: None,
            spec,
            skip_cache: false,
            step_timeout: Duration::from_secs(30 * 60),
            max_output: 1 << 20,
        }
    }
}

/// What a build reports as it goes.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum BuildEvent {
    /// A step begins (`cached`: taken from the cache, not run).
    Step {
        /// From 1.
        index: usize,
        /// Steps in all.
        total: usize,
        /// The step as the log names it.
        text: String,
        /// Its Dockerfile line.
        line: Option<usize>,
        /// Taken from the cache.
        cached: bool,
    },
    /// Output of the running step.
    Output {
        /// `stdout` or `stderr`.
        stream: &'static str,
        /// The bytes, as text (lossy).
        text: String,
    },
    /// Something the build says (a Dockerfile instruction it ignores).
    Note {
        /// What.
        text: String,
    },
}

/// A template: its image and what its sandboxes get.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TemplateInfo {
    /// Its name.
    pub name: String,
    /// Its owner's namespace (`None`: the operator's).
    pub namespace: Option<String>,
    /// Its image reference (what sandboxes start from).
    pub image: String,
    /// The engine's id of the image.
    pub image_id: String,
    /// What its sandboxes get.
    pub config: TemplateConfig,
    /// When it was built (seconds since the epoch; 0 where unknown).
    pub created: i64,
    /// Bytes of its image (its layers, shared with others).
    pub size: u64,
    /// Steps of the build that made it, and how many came from the cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub build: Option<BuildSummary>,
}

/// How a build went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct BuildSummary {
    /// Steps in all.
    pub steps: usize,
    /// Steps taken from the cache.
    pub cached: usize,
    /// Wall time in ms.
    pub took_ms: u64,
}

impl TemplateInfo {
    fn from_image(img: &BuiltImage) -> Option<TemplateInfo> {
        let name = img.labels.get(template::NAME_LABEL)?.clone();
        let namespace = img
            .labels
            .get(template::NAMESPACE_LABEL)
            .filter(|n| !n.is_empty())
            .cloned();
        let config = img
            .labels
            .get(template::CONFIG_LABEL)
            .and_then(|c| serde_json::from_str(c).ok())?;
        // Only the image its own name's tag points at.
        if img.reference != template::image_ref(namespace.as_deref(), &name) {
            return None;
        }
        Some(TemplateInfo {
            name,
            namespace,
            image: img.reference.clone(),
            image_id: img.id.clone(),
            config,
            created: img.created,
            size: img.size,
            build: None,
        })
    }

    /// `spec` made a sandbox of this template: its image, its environment
    /// under the spec's own, its directory and user where the spec sets
    /// none, its start and ready commands before the spec's start-up ones.
    pub fn apply(&self, spec: &mut SandboxSpec) {
        spec.image = self.image.clone();
        let mut env: Vec<corral_core::EnvVar> = self
            .config
            .env
            .iter()
            .map(|(name, value)| corral_core::EnvVar::Set {
                name: name.clone(),
                value: value.clone(),
            })
            .collect();
        env.append(&mut spec.env);
        spec.env = env;
        if spec.workdir.is_none() {
            spec.workdir = self.config.workdir.clone();
        }
        if spec.security.user.is_none() {
            spec.security.user = self.config.user.clone();
        }
        let mut startup = self.config.startup();
        startup.append(&mut spec.startup);
        spec.startup = startup;
    }
}

fn build_error(
    req: &BuildRequest,
    step: usize,
    line: Option<usize>,
    op: &Op,
) -> impl Fn(String, String, FailureKind) -> Error {
    let instruction = op.describe();
    let template = req.name.clone();
    move |detail, output, kind| {
        Error::Build(Box::new(corral_core::error::BuildFailure {
            template: template.clone(),
            step,
            line,
            instruction: instruction.clone(),
            detail,
            output,
            kind,
        }))
    }
}

fn invalid(field: &str, value: &str, reason: impl Into<String>) -> Error {
    Error::InvalidSpec(SpecError {
        field: field.into(),
        value: value.into(),
        reason: reason.into(),
    })
}

/// The sandbox a build runs its steps in, with the user it runs as.
struct Builder {
    sandbox: Sandbox,
    user: Option<String>,
}

impl Runtime {
    /// Builds template `req.name`, telling `progress` each step and its
    /// output; replaces a template of the name. Fails typed: a bad recipe
    /// names its field, a failed step is [`Error::Build`] with the step,
    /// its Dockerfile line and its output's end.
    pub async fn build_template(
        &self,
        req: &BuildRequest,
        progress: &(dyn Fn(BuildEvent) + Send + Sync),
    ) -> Result<TemplateInfo, Error> {
        let started = std::time::Instant::now();
        template::validate_name(&req.name)?;
        req.recipe.validate()?;
        let backend = self.backend().clone();
        if backend.checkpoints(&req.spec) {
            return Err(invalid(
                "isolation",
                "gvisor",
                "builds cannot run under gVisor without network (runsc-live keeps file changes in \
                 memory, where a commit does not see them): build with network, or under runc",
            ));
        }
        for note in &req.recipe.notes {
            progress(BuildEvent::Note { text: note.clone() });
        }
        let ns = req.namespace.as_deref();
        let (mut parent_ref, mut state) = self.resolve_from(req).await?;
        let base = match backend.built_image(&parent_ref).await? {
            Some(img) => img,
            None => {
                backend.pull(&parent_ref).await?;
                backend
                    .built_image(&parent_ref)
                    .await?
                    .ok_or_else(|| invalid("from", &parent_ref, "no such image"))?
            }
        };
        let mut parent_id = base.id;
        let image_env = base.env;
        let context = match &req.context {
            Some(bytes) => Context::read(bytes)?,
            None => Context::default(),
        };
        let total = req.recipe.steps.len();
        let mut builder: Option<Builder> = None;
        let mut cached_steps = 0;
        let result = async {
            for (i, step) in req.recipe.steps.iter().enumerate() {
                let index = i + 1;
                let fail = build_error(req, index, step.line, &step.op);
                if !step.op.changes_files() {
                    let op = state.resolve(&step.op, &image_env);
                    progress(BuildEvent::Step {
                        index,
                        total,
                        text: op.describe(),
                        line: step.line,
                        cached: false,
                    });
                    state.apply(&op);
                    continue;
                }
                let copy = match &step.op {
                    Op::Copy { .. } => Some(
                        context
                            .select(&step.op, state.workdir.as_deref())
                            .map_err(|why| fail(why, String::new(), FailureKind::InvalidSpec))?,
                    ),
                    _ => None,
                };
                let key = template::cache_key(
                    &parent_id,
                    &step.op,
                    &state,
                    copy.as_ref().map(|c| c.digest.as_str()),
                );
                let cache_ref = template::cache_ref(ns, &key);
                let lock = self.inner.build_steps.get(&cache_ref);
                let _held = lock.lock().await;
                let hit = if req.skip_cache {
                    None
                } else {
                    backend
                        .built_image(&cache_ref)
                        .await?
                        .filter(|i| i.labels.get(template::CACHE_LABEL) == Some(&key))
                };
                progress(BuildEvent::Step {
                    index,
                    total,
                    text: step.op.describe(),
                    line: step.line,
                    cached: hit.is_some(),
                });
                if let Some(img) = hit {
                    cached_steps += 1;
                    parent_ref = cache_ref;
                    parent_id = img.id;
                    state.apply(&step.op);
                    // Its sandbox is behind the cache now.
                    if let Some(b) = builder.take() {
                        let _ = b.sandbox.destroy().await;
                    }
                    continue;
                }
                let user = step.op.runs_as(&state);
                if builder.as_ref().is_some_and(|b| b.user != user) {
                    if let Some(b) = builder.take() {
                        let _ = b.sandbox.destroy().await;
                    }
                }
                if builder.is_none() {
                    let sandbox = self
                        .create(&build_spec(&req.spec, &parent_ref, user.clone()))
                        .await
                        .map_err(|e| {
                            fail(
                                format!("starting the build sandbox: {e}"),
                                String::new(),
                                e.kind(),
                            )
                        })?;
                    builder = Some(Builder { sandbox, user });
                }
                let sb = &builder
                    .as_ref()
                    .map(|b| b.sandbox.clone())
                    .expect("a builder");
                run_step(sb, req, &step.op, &state, copy.as_ref(), progress)
                    .await
                    .map_err(|(detail, output, kind)| fail(detail, output, kind))?;
                let labels = HashMap::from([(template::CACHE_LABEL.to_string(), key.clone())]);
                let img = backend.commit(&sb.placement(), &cache_ref, &labels).await?;
                parent_ref = cache_ref;
                parent_id = img.id;
                state.apply(&step.op);
            }
            // The template: its own image, labelled with what its
            // sandboxes get, committed from a sandbox of the last layer.
            let config = TemplateConfig {
                env: state.env.clone(),
                workdir: state.workdir.clone(),
                user: state.user.clone(),
                start: req.recipe.start.clone(),
                ready: req.recipe.ready.clone(),
                from: req.recipe.from.clone(),
            };
            let sb = match builder.take() {
                Some(b) => b.sandbox,
                None => {
                    self.create(&build_spec(&req.spec, &parent_ref, None))
                        .await?
                }
            };
            builder = Some(Builder {
                sandbox: sb.clone(),
                user: None,
            });
            let labels = HashMap::from([
                (template::NAME_LABEL.to_string(), req.name.clone()),
                (
                    template::NAMESPACE_LABEL.to_string(),
                    ns.unwrap_or("").to_string(),
                ),
                (
                    template::CONFIG_LABEL.to_string(),
                    serde_json::to_string(&config).unwrap_or_default(),
                ),
            ]);
            let reference = template::image_ref(ns, &req.name);
            let img = backend.commit(&sb.placement(), &reference, &labels).await?;
            Ok::<_, Error>(TemplateInfo {
                name: req.name.clone(),
                namespace: req.namespace.clone(),
                image: reference,
                image_id: img.id,
                config,
                created: crate::snapshots::now(),
                size: img.size,
                build: Some(BuildSummary {
                    steps: total,
                    cached: cached_steps,
                    took_ms: started.elapsed().as_millis() as u64,
                }),
            })
        }
        .await;
        if let Some(b) = builder.take() {
            if let Err(e) = b.sandbox.destroy().await {
                tracing::warn!(template = %req.name, error = %e, "removing a build sandbox failed");
            }
        }
        result
    }

    /// The image the recipe starts from and the state it starts in: an
    /// image as is, or `template:NAME`, a template of the same namespace,
    /// whose environment, directory and user carry on.
    async fn resolve_from(&self, req: &BuildRequest) -> Result<(String, BuildState), Error> {
        let from = req.recipe.from.trim();
        if let Some(name) = from.strip_prefix("template:") {
            let t = self
                .template(req.namespace.as_deref(), name)
                .await?
                .ok_or_else(|| invalid("from", from, "no such template"))?;
            let state = BuildState {
                env: t.config.env.clone(),
                workdir: t.config.workdir.clone(),
                user: t.config.user.clone(),
            };
            return Ok((t.image, state));
        }
        // Templates and cached steps are reached by name only: an image
        // reference into corral's own repositories would skip the owner
        // check.
        for repo in [template::REPOSITORY, template::CACHE_REPOSITORY] {
            if from == repo
                || from.starts_with(&format!("{repo}:"))
                || from.starts_with(&format!("{repo}/"))
            {
                return Err(invalid(
                    "from",
                    from,
                    "name a template as template:NAME, not by its image",
                ));
            }
        }
        Ok((from.to_string(), BuildState::default()))
    }

    /// Template `name` of `namespace`, if there is one.
    pub async fn template(
        &self,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<TemplateInfo>, Error> {
        template::validate_name(name)?;
        let reference = template::image_ref(namespace, name);
        let Some(img) = self.backend().built_image(&reference).await? else {
            return Ok(None);
        };
        let t = TemplateInfo::from_image(&img);
        Ok(t.filter(|t| t.namespace.as_deref() == namespace && t.name == name))
    }

    /// The templates of `namespace`, by name.
    pub async fn templates(&self, namespace: Option<&str>) -> Result<Vec<TemplateInfo>, Error> {
        let mut out: Vec<TemplateInfo> = self
            .backend()
            .built_images(template::NAME_LABEL)
            .await?
            .iter()
            .filter_map(TemplateInfo::from_image)
            .filter(|t| t.namespace.as_deref() == namespace)
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Deletes template `name` of `namespace` (its cached steps stay for
    /// later builds); false when there is none.
    pub async fn delete_template(
        &self,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<bool, Error> {
        let Some(t) = self.template(namespace, name).await? else {
            return Ok(false);
        };
        self.backend().remove_image(&t.image).await?;
        Ok(true)
    }

    /// Forgets the cached steps of `namespace`: their tags go, and their
    /// layers with them where no template or sandbox is built on them.
    /// Returns how many were forgotten.
    pub async fn prune_template_cache(&self, namespace: Option<&str>) -> Result<usize, Error> {
        let backend = self.backend();
        let cached = backend.built_images(template::CACHE_LABEL).await?;
        let prefix = template::cache_ref(namespace, "");
        let mut removed = 0;
        let mut seen = HashSet::new();
        for img in cached {
            if !img.reference.starts_with(&prefix) || !seen.insert(img.reference.clone()) {
                continue;
            }
            // The engine refuses to remove a layer a template or sandbox
            // still needs (a child image keeps its parent): only the tag goes.
            if backend.remove_image(&img.reference).await.is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }
}

/// A build sandbox's spec: the caller's, from `image`, as `user`,
/// with no tmpfs (what a step writes to `/tmp` stays in its layer) and
/// nothing of the caller's start-up.
fn build_spec(base: &SandboxSpec, image: &str, user: Option<String>) -> SandboxSpec {
    let mut spec = base.clone();
    spec.image = image.to_string();
    spec.tmpfs.clear();
    spec.startup.clear();
    spec.pristine = false;
    spec.persistent = None;
    spec.workdir = None;
    spec.security.user = user;
    spec.security.read_only_root = false;
    spec
}

/// Runs one file-changing step in `sb`: `Err((detail, output, kind))`.
async fn run_step(
    sb: &Sandbox,
    req: &BuildRequest,
    op: &Op,
    state: &BuildState,
    copy: Option<&Selected>,
    progress: &(dyn Fn(BuildEvent) + Send + Sync),
) -> Result<(), (String, String, FailureKind)> {
    let run = |argv: Vec<String>, extra: &[(String, String)]| {
        let mut cmd = CommandSpec::argv(argv)
            .timeout(req.step_timeout)
            .max_output(req.max_output);
        cmd.env = state.env.clone();
        cmd.env.extend(extra.iter().cloned());
        cmd.cwd = state.workdir.clone();
        cmd
    };
    let exec = |cmd: CommandSpec| async move {
        let mut tail = Vec::new();
        let r = sb
            .run_with(&cmd, |stream, bytes| {
                tail.extend_from_slice(bytes);
                if tail.len() > 8192 {
                    tail.drain(..tail.len() - 8192);
                }
                progress(BuildEvent::Output {
                    stream: match stream {
                        OutputStream::Stdout => "stdout",
                        OutputStream::Stderr => "stderr",
                    },
                    text: String::from_utf8_lossy(bytes).into_owned(),
                });
            })
            .await;
        let output = String::from_utf8_lossy(&tail).into_owned();
        if let Some(f) = r.failure {
            return Err((f.message.clone(), output, f.kind));
        }
        match r.exit_code {
            Some(0) => Ok(()),
            Some(code) => Err((
                format!("exit code {code}"),
                output,
                FailureKind::InvalidSpec,
            )),
            None => Err((
                format!("killed by signal {}", r.signal.unwrap_or(0)),
                output,
                FailureKind::InvalidSpec,
            )),
        }
    };
    match op {
        Op::Run { argv, env, .. } => exec(run(argv.clone(), env)).await,
        Op::Workdir { path } => {
            exec(run(vec!["mkdir".into(), "-p".into(), path.clone()], &[])).await
        }
        Op::Copy { chown, .. } => {
            let selected = copy.expect("a copy's files");
            let opts = FileOptions {
                max_bytes: selected.tar.len() as u64 + 1,
                timeout: req.step_timeout,
                ..FileOptions::default()
            };
            sb.upload_tar("/", &selected.tar, &opts)
                .await
                .map_err(|e| (e.to_string(), String::new(), FailureKind::InvalidSpec))?;
            if let Some(owner) = chown {
                let mut argv = vec!["chown".to_string(), "-R".into(), owner.clone()];
                argv.extend(selected.targets.iter().cloned());
                exec(run(argv, &[])).await?;
            }
            Ok(())
        }
        Op::Env { .. } | Op::User { .. } => Ok(()),
    }
}

/// The build context: its files by path.
#[derive(Default)]
struct Context {
    entries: Vec<ContextEntry>,
}

struct ContextEntry {
    path: String,
    mode: u32,
    kind: EntryKind,
}

enum EntryKind {
    File(Vec<u8>),
    Dir,
    Symlink(String),
}

/// What a copy step copies: a tar archive to extract at `/`, its digest,
/// and the top-level paths it writes.
struct Selected {
    tar: Vec<u8>,
    digest: String,
    targets: Vec<String>,
}

/// Largest build context taken in.
const MAX_CONTEXT: usize = 512 << 20;

impl Context {
    fn read(bytes: &[u8]) -> Result<Context, Error> {
        if bytes.len() > MAX_CONTEXT {
            return Err(invalid(
                "context",
                &format!("{} bytes", bytes.len()),
                format!("a build context is at most {MAX_CONTEXT} bytes"),
            ));
        }
        let bad = |why: String| invalid("context", "", format!("not a tar archive: {why}"));
        let mut archive = tar::Archive::new(bytes);
        let mut entries = Vec::new();
        for entry in archive.entries().map_err(|e| bad(e.to_string()))? {
            let mut entry = entry.map_err(|e| bad(e.to_string()))?;
            let path = entry
                .path()
                .map_err(|e| bad(e.to_string()))?
                .to_string_lossy()
                .trim_start_matches("./")
                .trim_end_matches('/')
                .to_string();
            if path.is_empty() || path == "." {
                continue;
            }
            if path.starts_with('/') || path.split('/').any(|c| c == "..") {
                return Err(invalid(
                    "context",
                    &path,
                    "an entry climbs out of the context",
                ));
            }
            let mode = entry.header().mode().unwrap_or(0o644);
            let kind = match entry.header().entry_type() {
                tar::EntryType::Directory => EntryKind::Dir,
                tar::EntryType::Symlink => EntryKind::Symlink(
                    entry
                        .link_name()
                        .ok()
                        .flatten()
                        .map(|l| l.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                ),
                t if t.is_file() => {
                    let mut data = Vec::new();
                    entry
                        .read_to_end(&mut data)
                        .map_err(|e| bad(e.to_string()))?;
                    EntryKind::File(data)
                }
                _ => continue,
            };
            entries.push(ContextEntry { path, mode, kind });
        }
        Ok(Context { entries })
    }

    /// What `op` (a copy) copies, with `workdir` for a relative
    /// destination: Docker's rules (a directory's contents, a file to
    /// `dest` or into it when `dest` ends in `/` or several sources are
    /// given, `*` and `?` patterns).
    fn select(&self, op: &Op, workdir: Option<&str>) -> Result<Selected, String> {
        let Op::Copy {
            src,
            inline,
            dest,
            chmod,
            ..
        } = op
        else {
            return Err("not a copy".into());
        };
        let dest = if dest.starts_with('/') {
            dest.clone()
        } else {
            format!("{}/{dest}", workdir.unwrap_or("").trim_end_matches('/'))
        };
        let into_dir = dest.ends_with('/') || src.len() + inline.len() > 1;
        let dest = dest.trim_end_matches('/').to_string();
        let mode_override = chmod
            .as_deref()
            .and_then(|m| u32::from_str_radix(m, 8).ok());
        // (path in the sandbox, mode, kind)
        let mut out: Vec<(String, u32, &EntryKind)> = Vec::new();
        let inline_kinds: Vec<EntryKind> = inline
            .iter()
            .map(|(_, text)| EntryKind::File(text.clone().into_bytes()))
            .collect();
        for ((name, _), kind) in inline.iter().zip(&inline_kinds) {
            let target = if into_dir {
                format!("{dest}/{name}")
            } else {
                dest.clone()
            };
            out.push((target, 0o644, kind));
        }
        for s in src {
            let pattern = s
                .trim_start_matches('/')
                .trim_start_matches("./")
                .trim_end_matches('/');
            let whole = pattern.is_empty() || pattern == ".";
            let glob = pattern.contains(['*', '?', '[']);
            let mut matched = false;
            for e in &self.entries {
                let (rel, top_is_file) = if whole {
                    (Some(e.path.clone()), false)
                } else if glob {
                    // A match is a source of its own; under a matched
                    // directory, its entries follow it.
                    let top = e
                        .path
                        .split('/')
                        .take(pattern.split('/').count())
                        .collect::<Vec<_>>()
                        .join("/");
                    if !glob_match(pattern, &top) {
                        (None, false)
                    } else if top == e.path {
                        match e.kind {
                            EntryKind::Dir => (None, false),
                            _ => (Some(base_name(&e.path)), true),
                        }
                    } else {
                        (Some(e.path[top.len() + 1..].to_string()), false)
                    }
                } else if e.path == pattern {
                    match e.kind {
                        EntryKind::Dir => (None, false),
                        _ => (Some(base_name(&e.path)), true),
                    }
                } else if let Some(rest) = e.path.strip_prefix(&format!("{pattern}/")) {
                    (Some(rest.to_string()), false)
                } else {
                    (None, false)
                };
                let Some(rel) = rel else {
                    if !whole && (e.path == pattern || glob_match(pattern, &e.path)) {
                        matched = true;
                    }
                    continue;
                };
                matched = true;
                let target = if top_is_file && !into_dir {
                    dest.clone()
                } else {
                    format!("{dest}/{rel}")
                };
                let mode = match (&e.kind, mode_override) {
                    (EntryKind::Symlink(_), _) => 0o777,
                    (_, Some(m)) => m,
                    _ => e.mode,
                };
                out.push((target, mode, &e.kind));
            }
            if !matched && !whole {
                return Err(format!("'{s}' is not in the build context"));
            }
        }
        let mut builder = tar::Builder::new(Vec::new());
        let mut digest = Sha256::new();
        let mut targets: Vec<String> = Vec::new();
        for (target, mode, kind) in &out {
            let rel = target.trim_start_matches('/');
            if rel.is_empty() {
                continue;
            }
            let top = format!("/{rel}");
            if !targets
                .iter()
                .any(|t| top.starts_with(&format!("{t}/")) || *t == top)
            {
                targets.push(top);
            }
            let mut header = tar::Header::new_gnu();
            header.set_mode(*mode);
            digest.update(rel.as_bytes());
            digest.update(format!("\0{mode:o}\0").as_bytes());
            let appended = match kind {
                EntryKind::File(data) => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_size(data.len() as u64);
                    digest.update(data);
                    builder.append_data(&mut header, rel, data.as_slice())
                }
                EntryKind::Dir => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_size(0);
                    builder.append_data(&mut header, rel, std::io::empty())
                }
                EntryKind::Symlink(to) => {
                    header.set_entry_type(tar::EntryType::Symlink);
                    header.set_size(0);
                    digest.update(to.as_bytes());
                    builder.append_link(&mut header, rel, to)
                }
            };
            appended.map_err(|e| format!("packing {rel}: {e}"))?;
            digest.update(b"\n");
        }
        let tar = builder
            .into_inner()
            .map_err(|e| format!("packing the copy: {e}"))?;
        Ok(Selected {
            tar,
            digest: digest
                .finalize()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
            targets,
        })
    }
}

fn base_name(path: &str) -> String {
    path.rsplit('/').next().unwrap_or(path).to_string()
}

/// Whether `name` matches `pattern` (`*` and `?` within one path
/// component, `[...]` sets), component by component.
fn glob_match(pattern: &str, name: &str) -> bool {
    let p: Vec<&str> = pattern.split('/').collect();
    let n: Vec<&str> = name.split('/').collect();
    p.len() == n.len()
        && p.iter()
            .zip(&n)
            .all(|(p, n)| component_match(p.as_bytes(), n.as_bytes()))
}

fn component_match(p: &[u8], n: &[u8]) -> bool {
    match (p.first(), n.first()) {
        (None, None) => true,
        (Some(b'*'), _) => {
            component_match(&p[1..], n) || (!n.is_empty() && component_match(p, &n[1..]))
        }
        (Some(b'?'), Some(_)) => component_match(&p[1..], &n[1..]),
        (Some(b'['), Some(c)) => match p.iter().position(|b| *b == b']') {
            Some(end) => {
                let set = &p[1..end];
                let (negate, set) = match set.first() {
                    Some(b'!') | Some(b'^') => (true, &set[1..]),
                    _ => (false, set),
                };
                let mut hit = false;
                let mut i = 0;
                while i < set.len() {
                    if i + 2 < set.len() && set[i + 1] == b'-' {
                        hit |= set[i] <= *c && *c <= set[i + 2];
                        i += 3;
                    } else {
                        hit |= set[i] == *c;
                        i += 1;
                    }
                }
                hit != negate && component_match(&p[end + 1..], &n[1..])
            }
            None => p[0] == *c && component_match(&p[1..], &n[1..]),
        },
        (Some(a), Some(b)) => a == b && component_match(&p[1..], &n[1..]),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(files: &[(&str, &str)]) -> Context {
        let mut b = tar::Builder::new(Vec::new());
        for (path, text) in files {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o640);
            h.set_size(text.len() as u64);
            b.append_data(&mut h, path, text.as_bytes())
                .expect("append");
        }
        Context::read(&b.into_inner().expect("tar")).expect("context")
    }

    fn copy(src: &[&str], dest: &str) -> Op {
        Op::Copy {
            src: src.iter().map(|s| s.to_string()).collect(),
            inline: vec![],
            dest: dest.into(),
            chown: None,
            chmod: None,
        }
    }

    fn paths(s: &Selected) -> Vec<String> {
        let mut a = tar::Archive::new(s.tar.as_slice());
        a.entries()
            .expect("entries")
            .map(|e| {
                e.expect("entry")
                    .path()
                    .expect("path")
                    .display()
                    .to_string()
            })
            .collect()
    }

    #[test]
    fn copies_follow_dockerfile_rules() {
        let ctx = context(&[
            ("a.txt", "A"),
            ("src/m.py", "M"),
            ("src/lib/n.py", "N"),
            ("b.txt", "B"),
        ]);
        let one = ctx.select(&copy(&["a.txt"], "/opt/x"), None).expect("file");
        assert_eq!(paths(&one), ["opt/x"]);
        let into = ctx.select(&copy(&["a.txt"], "/opt/"), None).expect("into");
        assert_eq!(paths(&into), ["opt/a.txt"]);
        let dir = ctx.select(&copy(&["src"], "app"), Some("/w")).expect("dir");
        assert_eq!(paths(&dir), ["w/app/m.py", "w/app/lib/n.py"]);
        let glob = ctx.select(&copy(&["*.txt"], "/t/"), None).expect("glob");
        assert_eq!(paths(&glob), ["t/a.txt", "t/b.txt"]);
        assert!(ctx.select(&copy(&["nope"], "/x"), None).is_err());
        // The digest follows the content.
        let other = context(&[("a.txt", "Z")]);
        assert_ne!(
            other
                .select(&copy(&["a.txt"], "/opt/x"), None)
                .expect("file")
                .digest,
            one.digest
        );
    }

    #[test]
    fn globs_match_within_a_component() {
        assert!(glob_match("*.py", "m.py"));
        assert!(!glob_match("*.py", "src/m.py"));
        assert!(glob_match("src/?.py", "src/m.py"));
        assert!(glob_match("[a-c]x", "bx"));
        assert!(!glob_match("[!a-c]x", "bx"));
    }
}
