//! Snapshots and forks over HTTP: take a snapshot of a sandbox, list,
//! inspect and delete snapshots, and fork sandboxes from one.
//!
//! Forks are provider sessions like any created sandbox (one fresh session
//! key each, so `max_live`, eviction and release apply), and a client's
//! fork passes the client policy a create does: the snapshot's recorded
//! spec is checked against the operator's `defaults`
//! ([`ClientPolicy::check_fork`](corral_core::client_policy::ClientPolicy::check_fork)),
//! so a snapshot the operator took of a sandbox with a host mount or an
//! added capability cannot be forked by a client. The snapshot's image is
//! not checked against `server.policy.images`: it is the runtime's own,
//! found by name among the snapshots it lists (a client never names it).
//! A client naming a snapshot's image in a create gets no such exemption.
//!
//! Snapshots are the caller's own: each principal's live in its namespace
//! (`corral_core::principal`), a name is looked up there first and then
//! among the operator's snapshots shared with the caller (read-only), and
//! whatever the caller may not see is answered 404 as if absent. A fork's
//! variables take their values from the fork request and the service's
//! defaults: the snapshot keeps only their names.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use corral::SnapshotOptions;
use corral_core::principal::{Principal, SnapshotAccess, SnapshotLookup};
use corral_core::snapshot::SnapshotInfo;
use corral_core::{EnvVar, Error};

use super::{check_name, AppState, JsonBody, Meta, MAX_NAME};
use crate::error::ApiError;
use crate::guard::Caller;
use crate::wire::{
    CreateSnapshot, ErrorBody, ForkRequest, SandboxList, SnapshotBody, SnapshotList,
};

/// Most forks one request may ask for when the provider sets no
/// `max_live`.
const MAX_FORKS_UNLIMITED: usize = 64;

/// 409: the request conflicts with what exists.
pub(super) fn conflict(field: &str, message: impl Into<String>) -> ApiError {
    let mut e = ApiError::invalid(field, message);
    e.status = StatusCode::CONFLICT;
    e.detail.kind = "conflict".into();
    e
}

/// 400 naming `name` when it is not a snapshot name (`name` or
/// `namespace/name`).
fn check_snapshot_name(name: &str) -> Result<(), ApiError> {
    corral_core::principal::QualifiedName::parse(name)
        .map(|_| ())
        .map_err(|e| ApiError::invalid("name", e.to_string()))
}

/// 404 naming `name`.
fn no_snapshot(name: &str) -> ApiError {
    let mut e = ApiError::not_found(format!("no snapshot '{name}'"));
    e.detail.field = Some("name".into());
    e
}

/// Snapshot `name` as `caller` names it, for `access`, and whether the
/// caller may only read it: 404 when there is none it may see, 403 when it
/// may see it but not write it (an operator's shared snapshot), 400 for a
/// bad name, or the daemon's trouble.
async fn find(
    s: &AppState,
    caller: &Principal,
    name: &str,
    access: SnapshotAccess,
) -> Result<(SnapshotInfo, bool), ApiError> {
    let all = all_snapshots(s).await?;
    let found = caller
        .find_snapshot(name, &all, access, s.inner.tenancy.sharing())
        .map_err(|e| ApiError::invalid("name", e.to_string()))?;
    match found {
        SnapshotLookup::Found { info, read_only } => Ok((info.clone(), read_only)),
        SnapshotLookup::ReadOnly(_) => Err(ApiError::forbidden(
            "name",
            format!("snapshot '{name}' is the operator's, shared with you read-only"),
        )),
        SnapshotLookup::Absent => Err(no_snapshot(name)),
    }
}

/// Every snapshot the runtime keeps (whoever's: callers filter).
async fn all_snapshots(s: &AppState) -> Result<Vec<SnapshotInfo>, ApiError> {
    s.inner
        .runtime
        .snapshots()
        .await
        .map_err(|e| ApiError::runtime(&e, ""))
}

/// Refuses one more snapshot of `caller`'s tenant (replacing `replacing`
/// does not count) when its quota is spent.
async fn check_snapshot_quota(
    s: &AppState,
    caller: &Principal,
    replacing: &corral_core::principal::QualifiedName,
) -> Result<(), ApiError> {
    let Some((tenant, quota)) = s.inner.tenancy.quota(caller) else {
        return Ok(());
    };
    let (kept, bytes) = tenant_snapshots(s, &tenant, Some(replacing)).await?;
    quota
        .snapshots(&tenant, kept, bytes)
        .map_err(|e| ApiError::quota(&e))
}

/// How many snapshots `tenant` (with its MCP sessions) keeps, and their
/// bytes, leaving out `except`.
async fn tenant_snapshots(
    s: &AppState,
    tenant: &str,
    except: Option<&corral_core::principal::QualifiedName>,
) -> Result<(u64, u64), ApiError> {
    let all = all_snapshots(s).await?;
    let mine = all.iter().filter(|i| {
        let q = i.qualified();
        q.owner().tenant() == Some(tenant) && Some(&q) != except
    });
    Ok(mine.fold((0, 0), |(n, b), i| {
        (n + 1, b + u64::try_from(i.size).unwrap_or(0))
    }))
}

/// Keep a sandbox's file system as a named snapshot (replacing one of that
/// name). A sandbox that resets in place (a pristine pool's) first keeps
/// its changes as its new pristine state, which ends its processes, and by
/// default its changes become a `delta` snapshot the service keeps (no
/// image, no registry; durable ones on Docker become images); any other
/// sandbox is paused while the engine copies it into an image and goes on
/// as it was.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/snapshot", tag = "snapshots",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = CreateSnapshot,
    responses(
        (status = 201, description = "Taken", body = SnapshotBody),
        (status = 400, description = "A bad name (field `name`), a persistent sandbox, or a sandbox the engine cannot snapshot (field `pristine`: Kubernetes snapshots sandboxes that reset in place)", body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 410, description = "The sandbox's container was lost", body = ErrorBody),
        (status = 413, description = "The sandbox's changes exceed `snapshots.max_bytes` (kind `too_large`); nothing is kept", body = ErrorBody),
        (status = 401, description = "No or a wrong bearer token", body = ErrorBody), (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody), (status = 415, description = "A JSON body not sent as application/json", body = ErrorBody),
    )
)]
pub(super) async fn take_snapshot(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<CreateSnapshot>,
) -> Result<(StatusCode, Json<SnapshotBody>), ApiError> {
    let opts = SnapshotOptions {
        durable: req.durable,
        namespace: None,
        kind: req.kind.map(Into::into),
    };
    let info = s.snapshot_as(&caller, &id, &req.name, opts).await?;
    Ok((
        StatusCode::CREATED,
        Json(SnapshotBody::new(&info, &caller, false)),
    ))
}

/// The caller's snapshots and the operator's shared with it (read-only); the
/// operator sees every principal's, named `NAMESPACE/NAME`.
#[utoipa::path(
    get, path = "/v1/snapshots", tag = "snapshots",
    responses((status = 200, body = SnapshotList), (status = 503, description = "Daemon unavailable (retryable)", body = ErrorBody), (status = 401, description = "No or a wrong bearer token", body = ErrorBody), (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody))
)]
pub(super) async fn list_snapshots(
    State(s): State<AppState>,
    Caller(caller): Caller,
) -> Result<Json<SnapshotList>, ApiError> {
    let snapshots = s
        .snapshots_of(&caller)
        .await?
        .iter()
        .map(|(i, read_only)| SnapshotBody::new(i, &caller, *read_only))
        .collect();
    Ok(Json(SnapshotList { snapshots }))
}

/// One snapshot.
#[utoipa::path(
    get, path = "/v1/snapshots/{name}", tag = "snapshots",
    params(("name" = String, Path, description = "Snapshot name")),
    responses((status = 200, body = SnapshotBody), (status = 400, description = "Not a snapshot name", body = ErrorBody), (status = 404, body = ErrorBody), (status = 401, description = "No or a wrong bearer token", body = ErrorBody), (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody))
)]
pub(super) async fn get_snapshot(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path(name): Path<String>,
) -> Result<Json<SnapshotBody>, ApiError> {
    let (info, read_only) = find(&s, &caller, &name, SnapshotAccess::Read).await?;
    Ok(Json(SnapshotBody::new(&info, &caller, read_only)))
}

/// Delete a snapshot; refused (409) while sandboxes forked from it exist.
#[utoipa::path(
    delete, path = "/v1/snapshots/{name}", tag = "snapshots",
    params(("name" = String, Path, description = "Snapshot name")),
    responses((status = 204, description = "Deleted"), (status = 400, description = "Not a snapshot name", body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, description = "Sandboxes forked from it still exist: delete them first", body = ErrorBody), (status = 401, description = "No or a wrong bearer token", body = ErrorBody), (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody))
)]
pub(super) async fn delete_snapshot(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    s.delete_snapshot_as(&caller, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Start sandboxes from a snapshot, all or nothing: each has the
/// snapshot's file system and the spec of the sandbox it was taken from
/// (start-up commands are not run again), under a session key of its own.
/// That spec must be one a client may ask for: a snapshot of a sandbox
/// with settings only the operator gives (host mounts, added capabilities,
/// a profile's limits) is refused (403 naming the field).
#[utoipa::path(
    post, path = "/v1/snapshots/{name}/fork", tag = "snapshots",
    params(("name" = String, Path, description = "Snapshot name")),
    request_body = ForkRequest,
    responses(
        (status = 201, description = "Started, one per fork", body = SandboxList),
        (status = 400, description = "A bad name, count or session_prefix (named in `field`)", body = ErrorBody),
        (status = 403, description = "Refused: the snapshot's spec has a field the service's policy keeps from clients, named in `field`; or a browser Origin or a foreign Host", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "A session key of the forks is taken", body = ErrorBody),
        (status = 413, description = "The snapshot's changes exceed `snapshots.max_bytes` (kind `too_large`)", body = ErrorBody),
        (status = 503, description = "Daemon unavailable (`daemon_unavailable`), or no room for the sandbox now (`capacity`, with `Retry-After`); both retryable", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait before trying again, with kind `capacity`"))),
        (status = 401, description = "No or a wrong bearer token", body = ErrorBody),
        (status = 415, description = "A JSON body not sent as application/json", body = ErrorBody),
    )
)]
pub(super) async fn fork(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<ForkRequest>,
) -> Result<(StatusCode, Json<SandboxList>), ApiError> {
    s.refuse_when_closing()?;
    check_snapshot_name(&name)?;
    let provider = &s.inner.provider;
    let most = match provider.config().max_live {
        0 => MAX_FORKS_UNLIMITED,
        n => n,
    };
    let count = usize::try_from(req.count).unwrap_or(usize::MAX);
    if count == 0 || count > most {
        return Err(ApiError::invalid(
            "count",
            format!(
                "count {} must be 1 to {most} (the service's provider.max_live)",
                req.count
            ),
        ));
    }
    let client_keys = fork_keys(req.session_prefix.as_deref(), count)?;
    let sandboxes = s.fork_as(&caller, &name, &client_keys, &req.env).await?;
    Ok((StatusCode::CREATED, Json(SandboxList { sandboxes })))
}

impl AppState {
    /// Starts one sandbox per client key from snapshot `name` for `caller`
    /// (all or nothing): the one way every front end forks, through the
    /// snapshot's visibility, the client policy and the tenant's quota.
    /// `env` gives the values of the variables (the snapshot kept only the
    /// names).
    pub(crate) async fn fork_as(
        &self,
        caller: &Principal,
        name: &str,
        client_keys: &[String],
        req_env: &std::collections::BTreeMap<String, String>,
    ) -> Result<Vec<crate::wire::SandboxInfo>, ApiError> {
        let s = self;
        let count = client_keys.len();
        let provider = &s.inner.provider;
        let keys: Vec<String> = client_keys.iter().map(|k| caller.session_key(k)).collect();
        for (key, client_key) in keys.iter().zip(client_keys) {
            if s.sessions().contains_key(key) || provider.has_session(key) {
                return Err(conflict(
                    "session_prefix",
                    format!("session key '{client_key}' already has a sandbox"),
                ));
            }
        }
        for name in req_env.keys() {
            if name.is_empty() || name.contains('=') || name.contains('\0') {
                return Err(ApiError::invalid(
                    format!("env.{name}"),
                    format!("environment variable name '{name}' is empty or holds '=' or NUL"),
                ));
            }
        }
        let (info, _) = find(s, caller, name, SnapshotAccess::Read).await?;
        let config = &s.inner.config;
        let mut base = config.defaults.clone();
        if base.image.is_empty() {
            base.image = s.inner.default_image.clone();
        }
        // The values come from the request, then the defaults; the snapshot
        // kept only the names.
        let mut env: Vec<EnvVar> = req_env
            .iter()
            .map(|(name, value)| EnvVar::Set {
                name: name.clone(),
                value: value.clone(),
            })
            .collect();
        env.extend(base.env.iter().cloned());
        let spec = info.fork_spec_with(&env);
        config.server.policy.check_fork(&base, &spec).map_err(|r| {
            let mut e = ApiError::refused(&r, "spec");
            e.detail.message = format!(
                "snapshot '{name}' was taken of a sandbox this service would not give a client: {}",
                e.detail.message
            );
            e
        })?;

        let base = s
            .inner
            .runtime
            .fork_base(&info)
            .await
            .map_err(|_| no_snapshot(name))?;
        let restore = s.inner.runtime.fork_restore(&info);
        let reservation = s
            .inner
            .tenancy
            .reserve(caller, &keys)
            .map_err(|e| ApiError::quota(&e))?;
        let starts = keys
            .iter()
            .map(|k| provider.acquire_fork(k, &spec, base.clone(), restore.as_deref()));
        let results = futures_util::future::join_all(starts).await;
        let mut failed = None;
        let mut made = Vec::with_capacity(count);
        for (key, r) in keys.iter().zip(results) {
            match r {
                Ok(lease) => made.push((key.clone(), lease)),
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failed {
            // All or nothing: the forks that started go again.
            for (key, lease) in made {
                drop(lease);
                if let Err(d) = provider.release_and_wait(&key).await {
                    tracing::warn!(session = %key, error = %d, "releasing a fork after a failed fork failed");
                }
            }
            return Err(ApiError::runtime(&e, "spec"));
        }
        reservation.commit();
        let mut sandboxes = Vec::with_capacity(count);
        for (key, lease) in &made {
            s.register(
                key,
                lease,
                Meta {
                    owner: caller.clone(),
                    profile: None,
                    persistent: false,
                    lost: None,
                },
            );
            sandboxes.push(s.info(caller, key, lease));
        }
        Ok(sandboxes)
    }
}

/// The session keys of `count` forks: `<prefix>-<i>`, or random ones.
fn fork_keys(prefix: Option<&str>, count: usize) -> Result<Vec<String>, ApiError> {
    let Some(prefix) = prefix else {
        return Ok((0..count)
            .map(|_| format!("sb-{}", corral::host::random_hex(16)))
            .collect());
    };
    check_name("session_prefix", prefix)?;
    let longest = format!("{prefix}-{}", count.saturating_sub(1));
    if longest.len() > MAX_NAME {
        return Err(ApiError::invalid(
            "session_prefix",
            format!(
                "session_prefix '{prefix}' is too long: the key '{longest}' would exceed {MAX_NAME} characters"
            ),
        ));
    }
    Ok((0..count).map(|i| format!("{prefix}-{i}")).collect())
}

impl AppState {
    /// Takes snapshot `name` of sandbox `id` in `caller`'s namespace (the
    /// one way every front end snapshots): the caller's own sandbox, a
    /// name of its own, within its tenant's snapshot quota.
    pub(crate) async fn snapshot_as(
        &self,
        caller: &Principal,
        id: &str,
        name: &str,
        opts: SnapshotOptions,
    ) -> Result<SnapshotInfo, ApiError> {
        let s = self;
        let target = caller
            .own_snapshot(name)
            .map_err(|e| ApiError::invalid("name", e.to_string()))?;
        if !caller.may_snapshot(SnapshotAccess::Write, &target, s.inner.tenancy.sharing()) {
            return Err(ApiError::forbidden(
                "name",
                format!(
                    "snapshot '{}' is not in your namespace: a snapshot is taken under a name of \
                     your own",
                    name
                ),
            ));
        }
        let lease = s.lease(caller, id).await?;
        check_snapshot_quota(s, caller, &target).await?;
        let opts = SnapshotOptions {
            namespace: target.namespace.clone(),
            ..opts
        };
        let info = lease
            .snapshot(&target.name, opts)
            .await
            .map_err(|e| ApiError::runtime(&e, ""))?;
        // Its size is known only now: one that takes the tenant over its byte
        // quota is not kept.
        if let Some((tenant, quota)) = s.inner.tenancy.quota(caller) {
            let (_, bytes) = tenant_snapshots(s, &tenant, None).await?;
            if let Err(e) = quota.snapshot_bytes(&tenant, bytes) {
                if let Err(d) = s.inner.runtime.delete_snapshot(&target.to_string()).await {
                    tracing::warn!(snapshot = %target, error = %d, "removing a snapshot over quota failed");
                }
                return Err(ApiError::quota(&e));
            }
        }
        Ok(info)
    }

    /// Deletes `caller`'s snapshot `name` (refused, 409, while it is in
    /// use).
    pub(crate) async fn delete_snapshot_as(
        &self,
        caller: &Principal,
        name: &str,
    ) -> Result<(), ApiError> {
        let s = self;
        s.refuse_when_closing()?;
        let (info, _) = find(s, caller, name, SnapshotAccess::Write).await?;
        let qualified = info.qualified().to_string();
        match s.inner.runtime.delete_snapshot(&qualified).await {
            Ok(()) => Ok(()),
            Err(Error::InvalidSpec(e)) if e.field == "snapshot" => {
                // It existed a moment ago: in use, unless it just went away.
                find(s, caller, name, SnapshotAccess::Write).await?;
                Err(conflict(
                    "name",
                    format!("snapshot '{name}' is not deleted: {}", e.reason),
                ))
            }
            Err(e) => Err(ApiError::runtime(&e, "")),
        }
    }

    /// The snapshots `caller` may see (its own and those shared with it),
    /// each with whether it may only read it.
    pub(crate) async fn snapshots_of(
        &self,
        caller: &Principal,
    ) -> Result<Vec<(SnapshotInfo, bool)>, ApiError> {
        let all = all_snapshots(self).await?;
        let sharing = self.inner.tenancy.sharing();
        Ok(all
            .into_iter()
            .filter(|i| caller.may_snapshot(SnapshotAccess::Read, &i.qualified(), sharing))
            .map(|i| {
                let writable = caller.may_snapshot(SnapshotAccess::Write, &i.qualified(), sharing);
                (i, !writable)
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fork_keys_are_numbered_or_random_and_checked() {
        assert_eq!(
            fork_keys(Some("ep"), 3).expect("keys"),
            ["ep-0", "ep-1", "ep-2"]
        );
        let random = fork_keys(None, 2).expect("keys");
        assert_ne!(random[0], random[1]);
        let e = fork_keys(Some("a/b"), 1).expect_err("bad prefix");
        assert_eq!(e.detail.field.as_deref(), Some("session_prefix"));
        let e = fork_keys(Some(&"x".repeat(MAX_NAME - 1)), 1).expect_err("too long");
        assert_eq!(e.detail.field.as_deref(), Some("session_prefix"));
    }

    #[test]
    fn bad_snapshot_names_name_the_field() {
        let e = check_snapshot_name("Bad Name").expect_err("refused");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.detail.field.as_deref(), Some("name"));
        assert!(
            e.detail.message.contains("Bad Name"),
            "{}",
            e.detail.message
        );
    }
}
