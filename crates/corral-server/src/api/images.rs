//! Images over HTTP: which images the caller may name and the engine
//! holds, the pulls under way (a start of a missing image waits for its
//! pull; `GET /v1/images` is where its progress shows), and a pull ahead
//! of the first start.
//!
//! Both pass the same image policy a create does (`server.policy.images`,
//! [`super::check_image`]): a client may pull only what the policy lists,
//! lists only images it may name, and sees only pulls of those. The
//! service's own default image is the operator's choice and always
//! allowed. Registry credentials come from the operator's
//! `daemon.registry_auth_file`, never from a request.

use std::time::Instant;

use axum::extract::State;
use axum::Json;

use super::{check_image, AppState, JsonBody};
use crate::error::ApiError;
use crate::guard::Caller;
use crate::wire::{ErrorBody, ImageEntry, ImageList, PullEntry, PullRequest, PullResult};

/// Longest image reference accepted.
const MAX_IMAGE: usize = 512;

/// Whether the caller may name `image` (as a create's `image` field).
fn may_name(s: &AppState, image: &str) -> bool {
    image == s.inner.default_image
        || s.inner
            .config
            .server
            .policy
            .check_image("image", image)
            .is_ok()
}

/// The images the caller may use and the pulls under way.
#[utoipa::path(
    get, path = "/v1/images", tag = "images",
    responses(
        (status = 200, body = ImageList),
        (status = 503, description = "Daemon unavailable", body = ErrorBody),
        (status = 401, description = "No or a wrong bearer token", body = ErrorBody),
        (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody),
    )
)]
pub(super) async fn list_images(State(s): State<AppState>) -> Result<Json<ImageList>, ApiError> {
    let backend = s.inner.runtime.backend();
    let images = match backend.images().await {
        Ok(list) => list,
        // An engine whose machines pull for themselves has nothing to list.
        Err(corral_core::Error::Unsupported { .. }) => Vec::new(),
        Err(e) => return Err(ApiError::runtime(&e, "")),
    };
    let images = images
        .into_iter()
        .filter(|i| may_name(&s, &i.reference))
        .map(|i| ImageEntry {
            image: i.reference,
            size: i.size,
            created: i.created,
        })
        .collect();
    let pulls = backend
        .pulls()
        .into_iter()
        .filter(|p| may_name(&s, &p.image))
        .map(PullEntry::from)
        .collect();
    Ok(Json(ImageList { images, pulls }))
}

/// Pull an image ahead of the first sandbox (a no-op when present), as a
/// start would: one pull per image at a time, whoever asks; answered
/// when the image is there. Its progress shows in `GET /v1/images`.
#[utoipa::path(
    post, path = "/v1/images/pull", tag = "images",
    request_body = PullRequest,
    responses(
        (status = 200, description = "The image is present", body = PullResult),
        (status = 400, description = "No image, or an image reference that is too long; the registry has no such name or tag (`image_not_found`); or the engine pulls on its own machines when a sandbox starts (Kubernetes: `unsupported`)", body = ErrorBody),
        (status = 403, description = "The policy does not let clients pull this image (`server.policy.images`; the message names the line that would), or it is a snapshot's image the caller may not read; or a browser Origin or a foreign Host", body = ErrorBody),
        (status = 503, description = "The registry or daemon could not be reached, or the pull took longer than `daemon.pull_timeout_ms` (`daemon_unavailable`, retryable)", body = ErrorBody),
        (status = 401, description = "No or a wrong bearer token", body = ErrorBody),
        (status = 415, description = "A JSON body not sent as application/json", body = ErrorBody),
    )
)]
pub(super) async fn pull_image(
    State(s): State<AppState>,
    Caller(caller): Caller,
    JsonBody(req): JsonBody<PullRequest>,
) -> Result<Json<PullResult>, ApiError> {
    let image = req.image.trim();
    if image.is_empty() {
        return Err(ApiError::invalid(
            "image",
            "image '' is empty; name one such as python:3.12-slim",
        ));
    }
    if image.len() > MAX_IMAGE || image.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ApiError::invalid(
            "image",
            format!(
                "image '{}' is not an image reference (at most {MAX_IMAGE} bytes, no spaces)",
                image.chars().take(80).collect::<String>()
            ),
        ));
    }
    if image != s.inner.default_image {
        check_image(&s, &caller, "image", image).await?;
    }
    let started = Instant::now();
    s.inner
        .runtime
        .backend()
        .pull(image)
        .await
        .map_err(|e| ApiError::runtime(&e, ""))?;
    Ok(Json(PullResult {
        image: image.to_string(),
        waited_ms: started.elapsed().as_millis().min(u128::from(u64::MAX)) as u64,
    }))
}
