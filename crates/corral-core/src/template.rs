//! Templates: environments built from code. A template is an image made
//! by running a [`Recipe`] (from a Dockerfile, [`Recipe::from_dockerfile`],
//! or from steps) in corral sandboxes and committing each step, plus what
//! sandboxes started from it get: its environment, working directory,
//! user, and start and ready commands ([`TemplateConfig`]).
//!
//! Types and pure decisions only: `corral`'s `templates.rs` runs the
//! build, the backends commit and list the images.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::SpecError;

/// Label of a template's image: its name.
pub const NAME_LABEL: &str = "corral.template";
/// Label of a template's image: its owner's namespace (empty: the
/// operator's).
pub const NAMESPACE_LABEL: &str = "corral.template.namespace";
/// Label of a template's image: its [`TemplateConfig`] as JSON.
pub const CONFIG_LABEL: &str = "corral.template.config";
/// Label of a build step's cached image: its cache key.
pub const CACHE_LABEL: &str = "corral.template.cache";
/// Repository of templates' images (a namespace's: `corral-template/NS`).
pub const REPOSITORY: &str = "corral-template";
/// Repository of build steps' cached images (a namespace's own: no
/// principal's build ever starts from another's step).
pub const CACHE_REPOSITORY: &str = "corral-template-cache";

/// The shell a `RUN` in shell form runs under unless `SHELL` changes it.
pub const DEFAULT_SHELL: [&str; 2] = ["/bin/sh", "-c"];

/// What a build runs, in order, from `from`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    /// The image (or `template:NAME`, a template of the same owner) the
    /// first step starts from.
    pub from: String,
    /// The steps.
    #[serde(default)]
    pub steps: Vec<Step>,
    /// A command every sandbox of the template starts in the background
    /// (E2B's start command), after which `ready` must succeed.
    #[serde(default)]
    pub start: Option<String>,
    /// A command run until it succeeds (up to a minute) once `start` ran.
    #[serde(default)]
    pub ready: Option<String>,
    /// What the build ignores or changes, for its log (Dockerfile
    /// instructions it does not apply).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// One step, with where it came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// What it does.
    #[serde(flatten)]
    pub op: Op,
    /// Its Dockerfile line (1-based), when it came from one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
}

/// What a step does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// Run a command: `argv` as given (shell form is the shell's argv),
    /// with `env` (build arguments) for this step only.
    Run {
        /// The command.
        argv: Vec<String>,
        /// Build arguments in force for it.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        env: Vec<(String, String)>,
        /// The user it runs as, for this step only (`None`: the current
        /// `USER`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
    },
    /// Copy files of the build context (or inline ones) to `dest`.
    Copy {
        /// Paths in the context (a file, a directory's contents, or a
        /// pattern with `*` and `?`).
        #[serde(default)]
        src: Vec<String>,
        /// Inline files (`COPY <<EOF`): name and content.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        inline: Vec<(String, String)>,
        /// Where they go (a directory when it ends in `/` or when several
        /// sources are copied).
        dest: String,
        /// `--chown`: owner of what is copied.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        chown: Option<String>,
        /// `--chmod`: mode of what is copied, octal.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        chmod: Option<String>,
    },
    /// Set an environment variable for later steps and the template.
    Env {
        /// Name.
        name: String,
        /// Value.
        value: String,
    },
    /// Change (and create) the working directory.
    Workdir {
        /// Absolute path.
        path: String,
    },
    /// Run later steps, and the template's commands, as `user`.
    User {
        /// A name or uid[:gid] the image knows.
        user: String,
    },
}

impl Op {
    /// How the build log names it.
    pub fn describe(&self) -> String {
        match self {
            Op::Run { argv, .. } => {
                format!("RUN {}", argv.last().map(String::as_str).unwrap_or(""))
            }
            Op::Copy {
                src, inline, dest, ..
            } => {
                let mut all: Vec<&str> = src.iter().map(String::as_str).collect();
                all.extend(inline.iter().map(|(n, _)| n.as_str()));
                format!("COPY {} {dest}", all.join(" "))
            }
            Op::Env { name, value } => format!("ENV {name}={value}"),
            Op::Workdir { path } => format!("WORKDIR {path}"),
            Op::User { user } => format!("USER {user}"),
        }
    }

    /// The user its sandbox runs as in `state`: a run's own or the
    /// current one; a copy and a directory are made as root (what they make
    /// is root's unless `chown` says otherwise, as in a Dockerfile).
    pub fn runs_as(&self, state: &BuildState) -> Option<String> {
        match self {
            Op::Run { user, .. } => user.clone().or_else(|| state.user.clone()),
            Op::Copy { .. } | Op::Workdir { .. } => Some("0".into()),
            Op::Env { .. } | Op::User { .. } => state.user.clone(),
        }
    }

    /// Whether it changes the file system (and so is a cached layer).
    pub fn changes_files(&self) -> bool {
        matches!(self, Op::Run { .. } | Op::Copy { .. } | Op::Workdir { .. })
    }
}

/// What sandboxes started from a template get, recorded on its image.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TemplateConfig {
    /// Environment, in order.
    pub env: Vec<(String, String)>,
    /// Working directory.
    pub workdir: Option<String>,
    /// User commands run as.
    pub user: Option<String>,
    /// Started in the background at start.
    pub start: Option<String>,
    /// Run until it succeeds once `start` ran.
    pub ready: Option<String>,
    /// The image it was built from.
    pub from: String,
}

impl TemplateConfig {
    /// The start-up commands a sandbox of this template runs: the start
    /// command in the background, then the ready check until it holds
    /// (a minute at most).
    pub fn startup(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(start) = &self.start {
            out.push(format!(
                "nohup /bin/sh -c {} >/tmp/.corral-start.log 2>&1 </dev/null &",
                shell_quote(start)
            ));
        }
        if let Some(ready) = &self.ready {
            out.push(format!(
                "i=0; until /bin/sh -c {}; do i=$((i+1)); [ $i -ge 600 ] && exit 1; sleep 0.1; done",
                shell_quote(ready)
            ));
        }
        out
    }
}

/// `s` quoted for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Checks a template name: as a snapshot's (1 to 128 characters: lower-case
/// letters, digits, `.`, `_`, `-`, starting with a letter or digit).
pub fn validate_name(name: &str) -> Result<(), SpecError> {
    crate::snapshot::validate_name(name).map_err(|mut e| {
        e.reason = e.reason.replace("a snapshot name", "a template name");
        e
    })
}

/// The image reference of template `name` in `namespace`.
pub fn image_ref(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        None => format!("{REPOSITORY}:{name}"),
        Some(ns) => format!("{REPOSITORY}/{ns}:{name}"),
    }
}

/// The image reference of a cached step of `namespace` with `key`.
pub fn cache_ref(namespace: Option<&str>, key: &str) -> String {
    match namespace {
        None => format!("{CACHE_REPOSITORY}:{key}"),
        Some(ns) => format!("{CACHE_REPOSITORY}/{ns}:{key}"),
    }
}

/// The cache key of a step: what it starts from (the parent image's id),
/// what it does, the state it runs in, and for a copy the digest of what
/// it copies. Equal keys mean the step would make the same layer.
pub fn cache_key(parent: &str, op: &Op, state: &BuildState, content: Option<&str>) -> String {
    let mut h = Sha256::new();
    h.update(b"corral-template-step-v1\0");
    h.update(parent.as_bytes());
    h.update(b"\0");
    h.update(serde_json::to_vec(op).unwrap_or_default());
    h.update(b"\0");
    h.update(serde_json::to_vec(state).unwrap_or_default());
    h.update(b"\0");
    h.update(content.unwrap_or("").as_bytes());
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What a step runs in: the environment, directory and user the steps
/// before it set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BuildState {
    /// Environment, in order.
    pub env: Vec<(String, String)>,
    /// Working directory.
    pub workdir: Option<String>,
    /// User.
    pub user: Option<String>,
}

impl BuildState {
    /// `op` with its `ENV` value's variables expanded from `image_env` (the
    /// base image's `NAME=value` list) and this state's environment; other
    /// steps as they are.
    pub fn resolve(&self, op: &Op, image_env: &[String]) -> Op {
        let Op::Env { name, value } = op else {
            return op.clone();
        };
        if !value.contains('$') {
            return op.clone();
        }
        let mut vars: BTreeMap<String, String> = image_env
            .iter()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        vars.extend(self.env.iter().cloned());
        Op::Env {
            name: name.clone(),
            value: expand(value, &vars),
        }
    }

    /// Applies what a step changes of the state (its environment,
    /// directory or user; nothing for a run or a copy).
    pub fn apply(&mut self, op: &Op) {
        match op {
            Op::Env { name, value } => {
                self.env.retain(|(n, _)| n != name);
                self.env.push((name.clone(), value.clone()));
            }
            Op::Workdir { path } => self.workdir = Some(path.clone()),
            Op::User { user } => self.user = Some(user.clone()),
            Op::Run { .. } | Op::Copy { .. } => {}
        }
    }
}

fn bad(field: &str, value: impl Into<String>, reason: impl Into<String>) -> SpecError {
    SpecError {
        field: field.into(),
        value: value.into(),
        reason: reason.into(),
    }
}

/// 1-based line of byte offset `at` in `text`.
fn line_of(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

impl Recipe {
    /// The recipe of a Dockerfile: one stage; `RUN`, `COPY`/`ADD` of the
    /// context, `ENV`, `ARG` (`build_args` override defaults; in force for
    /// later `RUN`s, not kept), `WORKDIR`, `USER`, `SHELL`; `CMD` and
    /// `ENTRYPOINT` become the start command only with `start_from_cmd`
    /// (corral's agent is PID 1 either way). `LABEL`, `EXPOSE`,
    /// `MAINTAINER`, `STOPSIGNAL`, `VOLUME` and `HEALTHCHECK` are noted and
    /// ignored. Refused by name, with the line: several stages, `COPY
    /// --from`, `ADD` of a URL, `ONBUILD`, `RUN --mount` and other `RUN`
    /// flags.
    pub fn from_dockerfile(
        text: &str,
        build_args: &BTreeMap<String, String>,
    ) -> Result<Recipe, SpecError> {
        use parse_dockerfile::{Command, Instruction, Source};
        let parsed = parse_dockerfile::parse(text)
            .map_err(|e| bad("dockerfile", "", format!("does not parse: {e}")))?;
        let mut args: BTreeMap<String, String> = BTreeMap::new();
        let mut env: BTreeMap<String, String> = BTreeMap::new();
        let mut from: Option<String> = None;
        let mut steps = Vec::new();
        let mut notes = Vec::new();
        let mut shell: Vec<String> = DEFAULT_SHELL.iter().map(|s| s.to_string()).collect();
        let mut workdir: Option<String> = None;
        let mut start: Option<String> = None;
        let mut entrypoint: Option<Vec<String>> = None;
        let mut cmd: Option<Vec<String>> = None;
        let vars = |args: &BTreeMap<String, String>, env: &BTreeMap<String, String>| {
            let mut all = args.clone();
            all.extend(env.iter().map(|(k, v)| (k.clone(), v.clone())));
            all
        };
        for ins in &parsed.instructions {
            let line = line_of(text, span_start(ins));
            let at = |what: &str| format!("line {line}: {what}");
            let refuse = |what: &str, why: &str| bad("dockerfile", at(what), why.to_string());
            if from.is_none() && !matches!(ins, Instruction::From(_) | Instruction::Arg(_)) {
                return Err(refuse("before FROM", "only ARG may come before FROM"));
            }
            let push = |steps: &mut Vec<Step>, op: Op| {
                steps.push(Step {
                    op,
                    line: Some(line),
                })
            };
            match ins {
                Instruction::Arg(a) => {
                    for (name, default) in split_assignments(&a.arguments.value, true)
                        .map_err(|r| refuse("ARG", &r))?
                    {
                        let value = build_args
                            .get(&name)
                            .cloned()
                            .or(default.map(|d| expand(&d, &vars(&args, &env))))
                            .unwrap_or_default();
                        args.insert(name, value);
                    }
                }
                Instruction::From(f) => {
                    if from.is_some() {
                        return Err(refuse(
                            "FROM",
                            "multi-stage builds are not supported: one FROM per Dockerfile",
                        ));
                    }
                    if let Some(flag) = f.options.first() {
                        return Err(refuse(
                            &format!("FROM --{}", flag.name.value),
                            "FROM takes no flags here",
                        ));
                    }
                    // Only global ARGs reach FROM; a stage's ARGs start
                    // unset again (their defaults re-declared inside).
                    from = Some(expand(&f.image.value, &args));
                    args.clear();
                }
                Instruction::Run(r) => {
                    if let Some(flag) = r.options.first() {
                        return Err(refuse(
                            &format!("RUN --{}", flag.name.value),
                            "RUN takes no flags here (no --mount, --network, --security)",
                        ));
                    }
                    let argv = match &r.arguments {
                        Command::Exec(e) => e.value.iter().map(|s| s.value.to_string()).collect(),
                        Command::Shell(s) => {
                            let mut script = s.value.to_string();
                            if let Some(doc) = r.here_docs.first() {
                                if r.here_docs.len() > 1 || !script.trim_start().starts_with("<<") {
                                    return Err(refuse(
                                        "RUN <<",
                                        "a RUN here-document must be the whole command",
                                    ));
                                }
                                script = doc.value.to_string();
                            }
                            let mut argv = shell.clone();
                            argv.push(script);
                            argv
                        }
                        _ => return Err(refuse("RUN", "not a command form this build knows")),
                    };
                    let env_of_step: Vec<(String, String)> = args
                        .iter()
                        .filter(|(k, _)| !env.contains_key(*k))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    push(
                        &mut steps,
                        Op::Run {
                            argv,
                            env: env_of_step,
                            user: None,
                        },
                    );
                }
                Instruction::Copy(c) => {
                    let v = vars(&args, &env);
                    let op = copy_op(&c.options, &c.src, &c.dest.value, &v, false, &refuse)?;
                    push(&mut steps, op);
                }
                Instruction::Add(c) => {
                    let v = vars(&args, &env);
                    for s in &c.src {
                        if let Source::Path(p) = s {
                            if p.value.contains("://") || p.value.starts_with("git@") {
                                return Err(refuse(
                                    "ADD",
                                    "ADD of a URL is not supported: fetch it in a RUN step (under the build's egress policy)",
                                ));
                            }
                        }
                    }
                    let op = copy_op(&c.options, &c.src, &c.dest.value, &v, true, &refuse)?;
                    notes.push(at("ADD copies like COPY (archives are not extracted)"));
                    push(&mut steps, op);
                }
                Instruction::Env(e) => {
                    for (name, value) in split_assignments(&e.arguments.value, false)
                        .map_err(|r| refuse("ENV", &r))?
                    {
                        let value = expand_known(&value.unwrap_or_default(), &vars(&args, &env));
                        env.insert(name.clone(), value.clone());
                        push(&mut steps, Op::Env { name, value });
                    }
                }
                Instruction::Workdir(w) => {
                    let path = expand(&w.arguments.value, &vars(&args, &env));
                    let path = if path.starts_with('/') {
                        path
                    } else {
                        format!(
                            "{}/{path}",
                            workdir.as_deref().unwrap_or("").trim_end_matches('/')
                        )
                    };
                    workdir = Some(path.clone());
                    push(&mut steps, Op::Workdir { path });
                }
                Instruction::User(u) => {
                    let user = expand(&u.arguments.value, &vars(&args, &env));
                    push(&mut steps, Op::User { user });
                }
                Instruction::Shell(s) => {
                    shell = s.arguments.iter().map(|a| a.value.to_string()).collect();
                }
                Instruction::Cmd(c) => cmd = Some(command_argv(&c.arguments, &shell)),
                Instruction::Entrypoint(e) => entrypoint = Some(command_argv(&e.arguments, &shell)),
                Instruction::Onbuild(_) => {
                    return Err(refuse("ONBUILD", "ONBUILD is not supported"));
                }
                Instruction::Label(_)
                | Instruction::Expose(_)
                | Instruction::Maintainer(_)
                | Instruction::Stopsignal(_)
                | Instruction::Volume(_)
                | Instruction::Healthcheck(_) => {
                    notes.push(at(
                        "ignored (it changes nothing a sandbox of the template sees)",
                    ));
                }
                _ => return Err(refuse("instruction", "not supported")),
            }
        }
        let Some(from) = from else {
            return Err(bad("dockerfile", "", "has no FROM"));
        };
        if entrypoint.is_some() || cmd.is_some() {
            let mut argv = entrypoint.unwrap_or_default();
            argv.extend(cmd.unwrap_or_default());
            notes.push(format!(
                "CMD/ENTRYPOINT not run at start (corral's agent is PID 1): {}",
                argv.join(" ")
            ));
            start = None;
        }
        Ok(Recipe {
            from,
            steps,
            start,
            ready: None,
            notes,
        })
    }

    /// Checks a recipe given as steps: names the first bad field.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.from.trim().is_empty() {
            return Err(bad(
                "from",
                "",
                "a template is built from an image or template",
            ));
        }
        for (i, s) in self.steps.iter().enumerate() {
            let field = |f: &str| format!("steps[{i}].{f}");
            match &s.op {
                Op::Run { argv, .. } if argv.is_empty() || argv[0].is_empty() => {
                    return Err(bad(&field("run"), "", "a command is required"));
                }
                Op::Copy {
                    src, inline, dest, ..
                } => {
                    if src.is_empty() && inline.is_empty() {
                        return Err(bad(&field("copy.src"), "", "nothing to copy"));
                    }
                    if dest.is_empty() {
                        return Err(bad(&field("copy.dest"), "", "a destination is required"));
                    }
                    for p in src {
                        context_path(p).map_err(|r| bad(&field("copy.src"), p.clone(), r))?;
                    }
                }
                Op::Workdir { path } if !path.starts_with('/') => {
                    return Err(bad(
                        &field("workdir"),
                        path.clone(),
                        "an absolute path is required",
                    ));
                }
                Op::Env { name, .. } if name.is_empty() || name.contains('=') => {
                    return Err(bad(&field("env"), name.clone(), "not a variable name"));
                }
                Op::User { user } if user.trim().is_empty() => {
                    return Err(bad(&field("user"), user.clone(), "a user is required"));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

fn span_start(ins: &parse_dockerfile::Instruction<'_>) -> usize {
    use parse_dockerfile::Instruction as I;
    match ins {
        I::Add(i) => i.add.span.start,
        I::Arg(i) => i.arg.span.start,
        I::Cmd(i) => i.cmd.span.start,
        I::Copy(i) => i.copy.span.start,
        I::Entrypoint(i) => i.entrypoint.span.start,
        I::Env(i) => i.env.span.start,
        I::Expose(i) => i.expose.span.start,
        I::From(i) => i.from.span.start,
        I::Healthcheck(i) => i.healthcheck.span.start,
        I::Label(i) => i.label.span.start,
        I::Maintainer(i) => i.maintainer.span.start,
        I::Onbuild(i) => i.onbuild.span.start,
        I::Run(i) => i.run.span.start,
        I::Shell(i) => i.shell.span.start,
        I::Stopsignal(i) => i.stopsignal.span.start,
        I::User(i) => i.user.span.start,
        I::Volume(i) => i.volume.span.start,
        I::Workdir(i) => i.workdir.span.start,
        _ => 0,
    }
}

fn command_argv(c: &parse_dockerfile::Command<'_>, shell: &[String]) -> Vec<String> {
    match c {
        parse_dockerfile::Command::Exec(e) => e.value.iter().map(|s| s.value.to_string()).collect(),
        parse_dockerfile::Command::Shell(s) => {
            let mut argv = shell.to_vec();
            argv.push(s.value.to_string());
            argv
        }
        _ => Vec::new(),
    }
}

fn copy_op(
    options: &[parse_dockerfile::Flag<'_>],
    src: &[parse_dockerfile::Source<'_>],
    dest: &str,
    vars: &BTreeMap<String, String>,
    is_add: bool,
    refuse: &dyn Fn(&str, &str) -> SpecError,
) -> Result<Op, SpecError> {
    let keyword = if is_add { "ADD" } else { "COPY" };
    let mut chown = None;
    let mut chmod = None;
    for flag in options {
        let value = flag.value.as_ref().map(|v| expand(&v.value, vars));
        match &*flag.name.value {
            "chown" => chown = value,
            "chmod" => {
                let v = value.unwrap_or_default();
                if u32::from_str_radix(&v, 8).map_or(true, |m| m > 0o7777) {
                    return Err(refuse(
                        &format!("{keyword} --chmod={v}"),
                        "--chmod takes an octal mode",
                    ));
                }
                chmod = Some(v);
            }
            "link" => {}
            "from" => {
                return Err(refuse(
                    &format!("{keyword} --from"),
                    "COPY --from is not supported (one stage; no other image's files)",
                ))
            }
            other => {
                return Err(refuse(
                    &format!("{keyword} --{other}"),
                    "not a supported flag",
                ));
            }
        }
    }
    let mut paths = Vec::new();
    let mut inline = Vec::new();
    for s in src {
        match s {
            parse_dockerfile::Source::Path(p) => {
                let p = expand(&p.value, vars);
                context_path(&p).map_err(|r| refuse(&format!("{keyword} {p}"), &r))?;
                paths.push(p);
            }
            parse_dockerfile::Source::HereDoc(h) => {
                let text = if h.expand {
                    expand(&h.value, vars)
                } else {
                    h.value.to_string()
                };
                inline.push((format!("inline-{}", inline.len()), text));
            }
            _ => return Err(refuse(keyword, "not a source this build knows")),
        }
    }
    Ok(Op::Copy {
        src: paths,
        inline,
        dest: expand(dest, vars),
        chown,
        chmod,
    })
}

/// Checks a source path of the context: relative, never climbing out.
pub fn context_path(p: &str) -> Result<(), String> {
    let trimmed = p.trim_start_matches("./");
    if p.starts_with('/') {
        // Docker reads an absolute source relative to the context too.
        return context_path(p.trim_start_matches('/'));
    }
    if trimmed.split('/').any(|c| c == "..") {
        return Err("a source may not climb out of the build context ('..')".into());
    }
    Ok(())
}

/// `name=value` pairs (quoted values allowed) or, when `bare_names`, names
/// alone; a single `NAME value` (the legacy form) when there is no `=`.
fn split_assignments(
    text: &str,
    bare_names: bool,
) -> Result<Vec<(String, Option<String>)>, String> {
    let words = split_words(text)?;
    if words.is_empty() {
        return Err("names nothing".into());
    }
    if !bare_names && !words[0].contains('=') {
        // `ENV NAME value with spaces`.
        let mut parts = text.trim().splitn(2, char::is_whitespace);
        let name = parts.next().unwrap_or("").to_string();
        let value = parts.next().unwrap_or("").trim().to_string();
        return Ok(vec![(name, Some(unquote_simple(&value)))]);
    }
    let mut out = Vec::new();
    for w in words {
        match w.split_once('=') {
            Some((n, v)) => out.push((n.to_string(), Some(v.to_string()))),
            None if bare_names => out.push((w, None)),
            None => return Err(format!("'{w}' is not NAME=value")),
        }
    }
    for (n, _) in &out {
        if n.is_empty() || !n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("'{n}' is not a variable name"));
        }
    }
    Ok(out)
}

fn unquote_simple(v: &str) -> String {
    split_words(v)
        .ok()
        .filter(|w| w.len() == 1)
        .and_then(|mut w| w.pop())
        .unwrap_or_else(|| v.to_string())
}

/// Splits on unquoted whitespace, removing quotes and backslash escapes.
fn split_words(text: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' | '\'' => {
                in_word = true;
                let quote = c;
                loop {
                    match chars.next() {
                        None => return Err(format!("an unclosed {quote} quote")),
                        Some(q) if q == quote => break,
                        Some('\\') if quote == '"' => {
                            if let Some(n) = chars.next() {
                                cur.push(n);
                            }
                        }
                        Some(o) => cur.push(o),
                    }
                }
            }
            '\\' => {
                in_word = true;
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            c if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        out.push(cur);
    }
    Ok(out)
}

/// Expands `$NAME`, `${NAME}`, `${NAME:-default}` and `${NAME:+alt}` from
/// `vars` (unset: empty), as a Dockerfile does; `\$` is a literal `$`.
pub fn expand(text: &str, vars: &BTreeMap<String, String>) -> String {
    expand_with(text, vars, false)
}

/// [`expand`], leaving `$NAME` and `${NAME}` of names `vars` lacks as they
/// are: an `ENV` value refers to the base image's variables too, which the
/// build knows only when it runs (`$PATH`).
pub fn expand_known(text: &str, vars: &BTreeMap<String, String>) -> String {
    expand_with(text, vars, true)
}

fn expand_with(text: &str, vars: &BTreeMap<String, String>, keep_unknown: bool) -> String {
    let mut out = String::new();
    let b: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == '\\' && b.get(i + 1) == Some(&'$') {
            out.push('$');
            i += 2;
            continue;
        }
        if c != '$' {
            out.push(c);
            i += 1;
            continue;
        }
        if b.get(i + 1) == Some(&'{') {
            let Some(close) = b[i + 2..].iter().position(|c| *c == '}') else {
                out.push(c);
                i += 1;
                continue;
            };
            let inner: String = b[i + 2..i + 2 + close].iter().collect();
            let value = match inner.split_once(":-") {
                Some((n, d)) => vars
                    .get(n)
                    .filter(|v| !v.is_empty())
                    .cloned()
                    .unwrap_or_else(|| expand(d, vars)),
                None => match inner.split_once(":+") {
                    Some((n, a)) => {
                        if vars.get(n).is_some_and(|v| !v.is_empty()) {
                            expand(a, vars)
                        } else {
                            String::new()
                        }
                    }
                    None => match vars.get(&inner) {
                        Some(v) => v.clone(),
                        None if keep_unknown => format!("${{{inner}}}"),
                        None => String::new(),
                    },
                },
            };
            out.push_str(&value);
            i += 3 + close;
            continue;
        }
        let name: String = b[i + 1..]
            .iter()
            .take_while(|c| c.is_ascii_alphanumeric() || **c == '_')
            .collect();
        if name.is_empty() {
            out.push(c);
            i += 1;
        } else {
            match vars.get(&name) {
                Some(v) => out.push_str(v),
                None if keep_unknown => {
                    out.push('$');
                    out.push_str(&name);
                }
                None => {}
            }
            i += 1 + name.chars().count();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recipe(text: &str) -> Recipe {
        Recipe::from_dockerfile(text, &BTreeMap::new()).expect("parses")
    }

    #[test]
    fn a_dockerfile_becomes_steps_with_their_lines() {
        let r = recipe(
            "ARG BASE=corral-test/busybox\nFROM $BASE\nARG GREETING=hi\nENV A=1 B=\"two words\"\n\
             WORKDIR /app\nWORKDIR sub\nCOPY --chmod=755 run.sh ./\nRUN echo $GREETING > /x\n\
             USER nobody\nEXPOSE 80\nCMD [\"sleep\", \"1\"]\n",
        );
        assert_eq!(r.from, "corral-test/busybox");
        let ops: Vec<&Op> = r.steps.iter().map(|s| &s.op).collect();
        assert_eq!(
            ops[0],
            &Op::Env {
                name: "A".into(),
                value: "1".into()
            }
        );
        assert_eq!(
            ops[1],
            &Op::Env {
                name: "B".into(),
                value: "two words".into()
            }
        );
        assert_eq!(
            ops[2],
            &Op::Workdir {
                path: "/app".into()
            }
        );
        assert_eq!(
            ops[3],
            &Op::Workdir {
                path: "/app/sub".into()
            }
        );
        assert!(matches!(ops[4], Op::Copy { chmod: Some(m), .. } if m == "755"));
        assert_eq!(
            ops[5],
            &Op::Run {
                argv: vec!["/bin/sh".into(), "-c".into(), "echo $GREETING > /x".into()],
                env: vec![("GREETING".into(), "hi".into())],
                user: None,
            }
        );
        assert_eq!(r.steps[5].line, Some(8));
        assert_eq!(
            ops[6],
            &Op::User {
                user: "nobody".into()
            }
        );
        assert_eq!(r.notes.len(), 2, "{:?}", r.notes);
    }

    #[test]
    fn build_args_override_defaults_and_env_expands() {
        let args = BTreeMap::from([("V".to_string(), "9".to_string())]);
        let r =
            Recipe::from_dockerfile("FROM x\nARG V=1\nENV P=/opt/v$V\nWORKDIR ${P}/bin\n", &args)
                .expect("parses");
        assert_eq!(
            r.steps[1].op,
            Op::Workdir {
                path: "/opt/v9/bin".into()
            }
        );
    }

    #[test]
    fn what_cannot_be_built_is_refused_by_line() {
        for (text, says) in [
            ("FROM a\nFROM b\n", "line 2"),
            ("FROM a\nCOPY --from=a /x /y\n", "--from"),
            ("FROM a\nADD https://example.com/x /x\n", "URL"),
            (
                "FROM a\nRUN --mount=type=cache,target=/c true\n",
                "RUN --mount",
            ),
            ("RUN true\n", "FROM"),
            ("FROM a\nCOPY ../secret /x\n", "climb"),
        ] {
            let e = Recipe::from_dockerfile(text, &BTreeMap::new()).expect_err(text);
            assert!(
                format!("{} {}", e.value, e.reason).contains(says),
                "{text}: {e:?}"
            );
        }
    }

    #[test]
    fn cache_keys_change_with_parent_op_state_and_content() {
        let op = Op::Run {
            argv: vec!["true".into()],
            env: vec![],
            user: None,
        };
        let s = BuildState::default();
        let k = cache_key("p", &op, &s, None);
        assert_eq!(k, cache_key("p", &op, &s, None));
        assert_ne!(k, cache_key("q", &op, &s, None));
        assert_ne!(k, cache_key("p", &op, &s, Some("c")));
        let mut s2 = s.clone();
        s2.apply(&Op::User { user: "u".into() });
        assert_ne!(k, cache_key("p", &op, &s2, None));
        assert_eq!(k.len(), 64);
    }

    #[test]
    fn expansion_follows_the_dockerfile_forms() {
        let v = BTreeMap::from([("A".to_string(), "1".to_string())]);
        assert_eq!(
            expand("$A-${A}-${B:-d}-${A:+x}-${B:+y}-\\$A", &v),
            "1-1-d-x--$A"
        );
    }
}
