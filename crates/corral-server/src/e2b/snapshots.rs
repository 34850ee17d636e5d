//! E2B's snapshots and forks on corral's: `Sandbox.create_snapshot` takes
//! a snapshot of the sandbox's file system in its owner's namespace
//! ([`AppState::snapshot_as`]), `Sandbox.list_snapshots` lists the
//! caller's, `Sandbox.delete_snapshot` deletes one
//! ([`AppState::delete_snapshot_as`]), and `Sandbox.create(snapshot_id)`
//! forks it (`control.rs`). `sandbox.fork(count)` snapshots the sandbox
//! once and starts `count` forks of it ([`AppState::fork_as`]), the same
//! owner's, all or nothing; the snapshot under them is removed as soon as
//! the engine lets it go (at once for a delta, after the last fork for an
//! image).
//!
//! `memory: true` (E2B's `mode="full"`) takes a live snapshot: the
//! sandbox's processes and memory too, which its sandboxes go on from, on
//! a tier that checkpoints (gVisor without network); elsewhere it is
//! refused by name. Otherwise (`mode="filesystem"`, the default) the file
//! system is kept and its sandboxes start fresh from it. `fork(count)`
//! forks the running processes where the tier checkpoints, and the file
//! system elsewhere (as before).

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Json;
use corral::SnapshotOptions;
use corral_core::principal::Principal;
use serde::Deserialize;
use serde_json::{json, Value};

use super::control::{
    api_error, body, caller, error, lifetime, not_found, register, sandbox_json, E2bError,
    Registered,
};
use super::{lock, E2b, Entry};
use crate::api::Observed;

/// Names of the snapshots `fork` takes under its forks: not listed.
const FORK_BASE: &str = "e2b-fork-";

/// Most forks one `fork` call starts (E2B's own bound).
const MAX_FORKS: u64 = 20;

/// Most snapshots one page lists.
const MAX_PAGE: usize = 100;

pub(super) fn routes() -> axum::Router<E2b> {
    axum::Router::new()
        .route("/sandboxes/{id}/snapshots", post(create_snapshot))
        .route("/sandboxes/{id}/fork", post(fork))
        .route("/snapshots", get(list_snapshots))
        .route("/templates/{id}", delete(delete_snapshot))
}

/// The entry `id` as `caller` may see it: 404 for another principal's.
fn visible(e2b: &E2b, caller: &Principal, id: &str) -> Result<std::sync::Arc<Entry>, E2bError> {
    e2b.entry(id)
        .filter(|e| caller.may_session(&e.owner))
        .ok_or_else(|| not_found(id))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SnapshotRequest {
    name: Option<String>,
    memory: Option<bool>,
}

/// The snapshot E2B's `memory` asks for: a live one for `true`.
fn snapshot_options(memory: Option<bool>) -> SnapshotOptions {
    SnapshotOptions {
        kind: (memory == Some(true)).then_some(corral::snapshot::SnapshotKind::Live),
        ..SnapshotOptions::default()
    }
}

async fn create_snapshot(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let caller = caller(&e2b, &headers)?;
    let req: SnapshotRequest = body(&bytes)?;
    let entry = visible(&e2b, &caller, &id)?;
    let name = match req.name {
        Some(n) if n.starts_with(FORK_BASE) => {
            return Err(error(
                StatusCode::BAD_REQUEST,
                format!("name '{n}': names starting with '{FORK_BASE}' are kept for forks"),
            ))
        }
        Some(n) => n,
        None => format!("e2b-snapshot-{}", corral::host::random_hex(12)),
    };
    let info = e2b
        .app
        .snapshot_as(&entry.owner, &id, &name, snapshot_options(req.memory))
        .await
        .map_err(|mut e| {
            if e.detail.kind == "unsupported" {
                e.detail.message = format!(
                    "memory true (mode=\"full\") keeps the sandbox's processes, which needs a \
                     tier corral can checkpoint: {}; mode=\"filesystem\" keeps its files",
                    e.detail.message
                );
            }
            api_error(e)
        })?;
    let snapshot_id = info.qualified().name;
    Ok((
        StatusCode::CREATED,
        Json(json!({"snapshotID": snapshot_id, "names": [snapshot_id]})),
    )
        .into_response())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListQuery {
    #[serde(rename = "sandboxID")]
    sandbox_id: Option<String>,
    name: Option<String>,
    limit: Option<String>,
    next_token: Option<String>,
}

async fn list_snapshots(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, E2bError> {
    let caller = caller(&e2b, &headers)?;
    let Query(q) = query.map_err(|e| error(StatusCode::BAD_REQUEST, e.body_text()))?;
    let limit = match q.limit.as_deref() {
        None => MAX_PAGE,
        Some(v) => match v.parse::<usize>() {
            Ok(n) if (1..=MAX_PAGE).contains(&n) => n,
            _ => {
                return Err(error(
                    StatusCode::BAD_REQUEST,
                    format!("limit '{v}' is not a number from 1 to {MAX_PAGE}"),
                ))
            }
        },
    };
    // A sandbox's snapshots are those its corral sandbox was the source of.
    let source = match &q.sandbox_id {
        None => None,
        Some(id) => {
            let entry = visible(&e2b, &caller, id)?;
            match e2b.app.observed(&entry.owner, id) {
                Ok(Observed::Live(sandbox)) => Some(sandbox.id().to_string()),
                _ => return Err(not_found(id)),
            }
        }
    };
    let mut names: Vec<String> = e2b
        .app
        .snapshots_of(&caller)
        .await
        .map_err(api_error)?
        .into_iter()
        .filter(|(info, _)| !info.name.starts_with(FORK_BASE))
        .filter(|(info, _)| source.as_ref().is_none_or(|s| &info.source_sandbox == s))
        .filter(|(info, _)| q.name.as_ref().is_none_or(|n| &info.name == n))
        .map(|(info, _)| info.qualified().name)
        .collect();
    names.sort();
    names.dedup();
    let after = q.next_token.as_deref().filter(|t| !t.is_empty());
    let start = after.map_or(0, |t| names.partition_point(|n| n.as_str() <= t));
    let page = &names[start..names.len().min(start + limit)];
    let items: Vec<Value> = page
        .iter()
        .map(|n| json!({"snapshotID": n, "names": [n]}))
        .collect();
    let mut response = Json(items).into_response();
    if start + page.len() < names.len() {
        if let Some(last) = page.last().and_then(|l| l.parse().ok()) {
            response.headers_mut().insert("x-next-token", last);
        }
    }
    Ok(response)
}

async fn delete_snapshot(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, E2bError> {
    let caller = caller(&e2b, &headers)?;
    // A template built here: its builds' templates go with its name.
    if let Some(built) = e2b.templates.forget(&caller, &id) {
        let ns = caller.snapshot_namespace();
        for name in built {
            if let Err(e) = e2b
                .app
                .runtime()
                .delete_template(ns.as_deref(), &name)
                .await
            {
                tracing::warn!(template = %name, error = %e, "cannot delete the template of an e2b build");
            }
        }
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    e2b.app
        .delete_snapshot_as(&caller, &id)
        .await
        .map_err(api_error)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ForkRequest {
    timeout: Option<u64>,
    count: Option<u64>,
}

async fn fork(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let caller = caller(&e2b, &headers)?;
    let req: ForkRequest = body(&bytes)?;
    let life = lifetime("timeout", req.timeout)?;
    let count = req.count.unwrap_or(1);
    if !(1..=MAX_FORKS).contains(&count) {
        return Err(error(
            StatusCode::BAD_REQUEST,
            format!("count {count} must be 1 to {MAX_FORKS}"),
        ));
    }
    let source = visible(&e2b, &caller, &id)?;
    let base = format!("{FORK_BASE}{}", corral::host::random_hex(12));
    // The running processes where the tier checkpoints; else the file
    // system, as E2B's `fork` did on corral before.
    let live = e2b
        .app
        .snapshot_as(&source.owner, &id, &base, snapshot_options(Some(true)))
        .await;
    match live {
        Ok(_) => {}
        Err(e) if e.detail.kind == "unsupported" => {
            e2b.app
                .snapshot_as(&source.owner, &id, &base, SnapshotOptions::default())
                .await
                .map_err(api_error)?;
        }
        Err(e) => return Err(api_error(e)),
    }
    let ids: Vec<String> = (0..count).map(|_| super::new_sandbox_id()).collect();
    let forked = e2b
        .app
        .fork_as(&source.owner, &base, &ids, &source.envs)
        .await;
    let sweep = e2b.clone();
    let owner = source.owner.clone();
    e2b.fork_bases().push((owner, base));
    if let Err(e) = forked {
        sweep.sweep_fork_bases().await;
        return Err(api_error(e));
    }
    let mut results = Vec::with_capacity(ids.len());
    for id in ids {
        let entry = register(
            &e2b,
            Registered {
                id,
                owner: source.owner.clone(),
                template: source.template.clone(),
                metadata: source.metadata.clone(),
                envs: source.envs.clone(),
                public: source.public,
                auto_pause: source.auto_pause,
            },
            &headers,
            life,
        );
        results.push(json!({ "sandbox": sandbox_json(&entry) }));
    }
    // A delta base goes at once; an image's waits for its last fork.
    sweep.sweep_fork_bases().await;
    Ok((StatusCode::CREATED, Json(results)).into_response())
}

impl E2b {
    fn fork_bases(&self) -> std::sync::MutexGuard<'_, Vec<(Principal, String)>> {
        lock(&self.fork_bases)
    }

    /// Deletes the snapshots under forks that the engine now lets go (a
    /// delta at once, an image once no fork of it is left); the rest are
    /// tried again after the next sandbox ends.
    pub(super) async fn sweep_fork_bases(&self) {
        let pending: Vec<(Principal, String)> = std::mem::take(&mut *self.fork_bases());
        let mut kept = Vec::new();
        for (owner, name) in pending {
            match self.app.delete_snapshot_as(&owner, &name).await {
                Ok(()) => {}
                Err(e) if e.status == StatusCode::NOT_FOUND => {}
                Err(e) => {
                    tracing::debug!(snapshot = %name, error = %e.detail.message, "the snapshot under forks is still in use");
                    kept.push((owner, name));
                }
            }
        }
        self.fork_bases().extend(kept);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_true_asks_for_a_live_snapshot() {
        use corral::snapshot::SnapshotKind;
        assert_eq!(snapshot_options(None).kind, None);
        assert_eq!(snapshot_options(Some(false)).kind, None);
        assert_eq!(snapshot_options(Some(true)).kind, Some(SnapshotKind::Live));
    }

    #[test]
    fn unknown_fields_are_refused() {
        let e: Result<ForkRequest, _> = serde_json::from_value(json!({"count": 2, "cpu": 1}));
        assert!(e.is_err());
    }
}
