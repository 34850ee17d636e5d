//! The dashboard: one page, embedded in the binary (no CDN, no asset
//! fetched from anywhere else), served at `/dashboard`. The page itself
//! holds no data and needs no token (the guard lets it through, with the
//! Host and Origin checks); it asks for the token in a form, keeps it in
//! its memory only (never in its address, which a browser writes to its
//! history even when the page changes it at once, nor in storage or a
//! cookie), then reads the API with it like any client: `/v1/health`,
//! `/v1/whoami`, `/v1/sandboxes` and each one's `/usage` every 2 s,
//! `/metrics` for the pools, and `/v1/events` as a stream for commands per
//! second, failures by kind and each sandbox's recent commands. Its code
//! panel runs Python in the selected sandbox's default code context (`POST
//! /v1/sandboxes/{id}/code`, read as a stream) and shows what comes back
//! as text, a result's PNG or JPEG as an image (a `data:` URL), never as
//! HTML. It sees and does what its token's principal may, nothing more.

use axum::http::header;
use axum::response::IntoResponse;

/// The page.
const PAGE: &str = include_str!("dashboard.html");

/// What the page may load: itself, and the API on its own origin.
const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                   connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
                   form-action 'none'; frame-ancestors 'none'";

/// `GET /dashboard`.
pub async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::CACHE_CONTROL, "no-store"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            // A page it opens, or that opens it, gets no handle on it.
            (
                header::HeaderName::from_static("cross-origin-opener-policy"),
                "same-origin",
            ),
        ],
        PAGE,
    )
}
