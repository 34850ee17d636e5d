//! Templates over HTTP: build one from a Dockerfile (with its context) or
//! from steps, list, inspect and delete them; `POST /v1/sandboxes` starts
//! from one by `template`.
//!
//! A template is its builder's own: each principal's live in its
//! namespace, found by name there only (another's is answered 404, as if
//! absent), and a build's cached steps are its namespace's alone. A build
//! runs in sandboxes of the caller's own spec, the one a create without
//! fields would give it: the service's defaults under its policy (network,
//! egress, limits, hardening, isolation). Its `FROM` image passes the
//! image policy a create's `image` does; a template is named
//! `template:NAME`, never by its image.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use base64::Engine;
use corral::template::{Recipe, Step};
use corral::{BuildEvent, BuildRequest, TemplateInfo};
use corral_core::principal::Principal;
use corral_core::Error;

use super::{check_image, spec_of, AppState, JsonBody};
use crate::error::ApiError;
use crate::guard::Caller;
use crate::wire::{
    BuildSummaryBody, BuildTemplate, CreateSandbox, ErrorBody, TemplateBody, TemplateList,
};

/// Lines of a build's log kept for its answer.
const LOG_LINES: usize = 400;

/// 404 for a template the caller has not (or may not see).
pub(crate) fn no_template(name: &str) -> ApiError {
    let mut e = ApiError::not_found(format!("no template '{name}'"));
    e.detail.field = Some("template".into());
    e
}

fn body(t: &TemplateInfo, owner: &Principal, log: Vec<String>) -> TemplateBody {
    TemplateBody {
        name: t.name.clone(),
        owner: owner.id(),
        image: t.image.clone(),
        from: t.config.from.clone(),
        env: t.config.env.clone(),
        workdir: t.config.workdir.clone(),
        user: t.config.user.clone(),
        start: t.config.start.clone(),
        ready: t.config.ready.clone(),
        created: t.created,
        size: t.size,
        build: t.build.map(|b| BuildSummaryBody {
            steps: b.steps,
            cached: b.cached,
            took_ms: b.took_ms,
        }),
        log,
    }
}

/// The spec `caller`'s build sandboxes get (the one a create without
/// fields would give it), once the image the build starts `from` passes
/// the image policy a create's `image` does (named `field` if refused).
pub(crate) async fn build_spec(
    s: &AppState,
    caller: &Principal,
    from: &str,
    field: &str,
) -> Result<corral::SandboxSpec, ApiError> {
    let (spec, _, _) = spec_of(s, &CreateSandbox::default())?;
    if !from.starts_with("template:") {
        check_image(s, caller, field, from).await?;
    }
    Ok(spec)
}

/// The recipe a build request describes, its fields checked by name.
fn recipe_of(req: &BuildTemplate) -> Result<Recipe, ApiError> {
    let mut recipe = match (&req.dockerfile, &req.from) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "from",
                "give either a dockerfile or from (with steps), not both",
            ))
        }
        (None, None) => {
            return Err(ApiError::invalid(
                "dockerfile",
                "give a dockerfile, or from (with steps)",
            ))
        }
        (Some(text), None) => {
            if req.steps.is_some() {
                return Err(ApiError::invalid(
                    "steps",
                    "steps go with from, not a dockerfile",
                ));
            }
            Recipe::from_dockerfile(text, &req.build_args).map_err(|e| {
                ApiError::invalid("dockerfile", format!("{}: {}", e.value, e.reason))
            })?
        }
        (None, Some(from)) => {
            let steps: Vec<Step> = match &req.steps {
                None => Vec::new(),
                Some(v) => serde_path_to_error::deserialize(v.clone()).map_err(|e| {
                    ApiError::invalid(
                        format!("steps{}", path_of(&e.path().to_string())),
                        e.inner().to_string(),
                    )
                })?,
            };
            Recipe {
                from: from.clone(),
                steps,
                start: None,
                ready: None,
                notes: Vec::new(),
            }
        }
    };
    if req.start.is_some() {
        recipe.start = req.start.clone();
    }
    if req.ready.is_some() {
        recipe.ready = req.ready.clone();
    }
    recipe
        .validate()
        .map_err(|e| ApiError::invalid(e.field.clone(), format!("'{}': {}", e.value, e.reason)))?;
    Ok(recipe)
}

fn path_of(p: &str) -> String {
    if p == "." || p.is_empty() {
        String::new()
    } else if p.starts_with('[') {
        p.to_string()
    } else {
        format!(".{p}")
    }
}

/// Build a template from a Dockerfile (with its context) or from steps,
/// in sandboxes of the caller's own spec; waits for the build and answers
/// the template with the build's log. Unchanged steps come from the
/// caller's cache and are not run again. A failing step is 422
/// `build_failed`, naming the step, its Dockerfile line and the end of its
/// output.
#[utoipa::path(
    post, path = "/v1/templates", tag = "templates",
    request_body = BuildTemplate,
    responses(
        (status = 201, body = TemplateBody),
        (status = 400, description = "A bad field (named), or a Dockerfile instruction this build cannot do (named with its line)", body = ErrorBody),
        (status = 403, description = "`from` (or the Dockerfile's FROM) names an image the caller may not start from", body = ErrorBody),
        (status = 422, description = "A step failed (`build_failed`): the step, its line, the end of its output", body = ErrorBody),
        (status = 401, description = "No or a wrong bearer token", body = ErrorBody),
    )
)]
pub(super) async fn build_template(
    State(s): State<AppState>,
    Caller(caller): Caller,
    JsonBody(req): JsonBody<BuildTemplate>,
) -> Result<(StatusCode, Json<TemplateBody>), ApiError> {
    s.refuse_when_closing()?;
    corral::template::validate_name(&req.name)
        .map_err(|e| ApiError::invalid("name", format!("'{}': {}", e.value, e.reason)))?;
    let recipe = recipe_of(&req)?;
    let context = match &req.context {
        None => None,
        Some(b64) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .map_err(|e| ApiError::invalid("context", format!("not base64: {e}")))?,
        ),
    };
    let spec = build_spec(&s, &caller, &recipe.from, "from").await?;
    let mut build = BuildRequest::new(&req.name, recipe, spec);
    build.namespace = caller.snapshot_namespace();
    build.context = context;
    build.skip_cache = req.skip_cache;
    let log: Arc<Mutex<VecDeque<String>>> = Arc::default();
    let sink = log.clone();
    let progress = move |e: BuildEvent| {
        let line = match e {
            BuildEvent::Step {
                index,
                total,
                text,
                cached,
                ..
            } => format!(
                "[{index}/{total}] {}{text}",
                if cached { "CACHED " } else { "" }
            ),
            BuildEvent::Output { text, .. } => text.trim_end().to_string(),
            BuildEvent::Note { text } => format!("note: {text}"),
        };
        let mut l = sink.lock().unwrap_or_else(|p| p.into_inner());
        for part in line.lines() {
            l.push_back(part.to_string());
        }
        while l.len() > LOG_LINES {
            l.pop_front();
        }
    };
    let built = s.inner.runtime.build_template(&build, &progress).await;
    let log: Vec<String> = log
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .cloned()
        .collect();
    match built {
        Ok(t) => Ok((StatusCode::CREATED, Json(body(&t, &caller, log)))),
        Err(Error::Build(b)) => {
            let mut e = ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "build_failed",
                format!("{b}\n--- output ---\n{}", b.output),
            );
            e.detail.field = Some(match b.line {
                Some(l) => format!("dockerfile:{l}"),
                None => format!("steps[{}]", b.step - 1),
            });
            Err(e)
        }
        Err(e) => Err(ApiError::runtime(&e, "")),
    }
}

/// List the caller's templates.
#[utoipa::path(
    get, path = "/v1/templates", tag = "templates",
    responses((status = 200, body = TemplateList), (status = 401, description = "No or a wrong bearer token", body = ErrorBody))
)]
pub(super) async fn list_templates(
    State(s): State<AppState>,
    Caller(caller): Caller,
) -> Result<Json<TemplateList>, ApiError> {
    let ns = caller.snapshot_namespace();
    let all = s
        .inner
        .runtime
        .templates(ns.as_deref())
        .await
        .map_err(|e| ApiError::runtime(&e, ""))?;
    Ok(Json(TemplateList {
        templates: all.iter().map(|t| body(t, &caller, Vec::new())).collect(),
    }))
}

/// Describe one of the caller's templates.
#[utoipa::path(
    get, path = "/v1/templates/{name}", tag = "templates",
    params(("name" = String, Path, description = "Template name")),
    responses((status = 200, body = TemplateBody), (status = 404, body = ErrorBody), (status = 401, description = "No or a wrong bearer token", body = ErrorBody))
)]
pub(super) async fn get_template(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path(name): Path<String>,
) -> Result<Json<TemplateBody>, ApiError> {
    let ns = caller.snapshot_namespace();
    let t = s
        .inner
        .runtime
        .template(ns.as_deref(), &name)
        .await
        .map_err(|e| ApiError::runtime(&e, "name"))?
        .ok_or_else(|| no_template(&name))?;
    Ok(Json(body(&t, &caller, Vec::new())))
}

/// Delete one of the caller's templates (sandboxes started from it keep
/// running; its cached steps stay for later builds).
#[utoipa::path(
    delete, path = "/v1/templates/{name}", tag = "templates",
    params(("name" = String, Path, description = "Template name")),
    responses((status = 204, description = "Deleted"), (status = 404, body = ErrorBody), (status = 401, description = "No or a wrong bearer token", body = ErrorBody))
)]
pub(super) async fn delete_template(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let ns = caller.snapshot_namespace();
    let deleted = s
        .inner
        .runtime
        .delete_template(ns.as_deref(), &name)
        .await
        .map_err(|e| ApiError::runtime(&e, "name"))?;
    if deleted {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(no_template(&name))
    }
}
