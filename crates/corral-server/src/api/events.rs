//! `GET /v1/events`: the runtime's lifecycle events (`corral::events`) as
//! server-sent events, each principal seeing its own sandboxes' (the
//! operator every one), resumable after an id within the runtime's window.
//!
//! Whose an event is comes from the provider session key it carries and
//! the service's books (`Tenancy::owner_ever`: owners are remembered after
//! their sessions end, so a `removed` still reaches its owner). An event
//! with no session (a warm pool's spare being started, a sandbox made by
//! another front end of the process) is the operator's.

use std::convert::Infallible;

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as Sse_, KeepAlive, Sse};
use corral::events::Event;
use corral_core::principal::Principal;
use serde::Deserialize;
use tokio::sync::broadcast::error::RecvError;
use tokio_stream::wrappers::ReceiverStream;
use utoipa::IntoParams;

use super::AppState;
use crate::error::ApiError;
use crate::guard::Caller;
use crate::wire::{ErrorBody, EventBody};

/// Query of `GET /v1/events`.
#[derive(Debug, Deserialize, IntoParams)]
pub(super) struct EventsQuery {
    /// Resume after this event id (else `Last-Event-ID`, else only events
    /// from now on; 0: everything still kept).
    after: Option<u64>,
}

/// The event as `caller` may see it, or `None` when it is another's.
fn visible(s: &AppState, caller: &Principal, e: &Event) -> Option<EventBody> {
    let owner = e.session.as_deref().and_then(|k| s.tenancy().owner_ever(k));
    let may = match (&owner, caller) {
        (_, Principal::Operator) => true,
        (Some(o), c) => c.may_session(o),
        (None, _) => false,
    };
    may.then(|| EventBody {
        id: e.id,
        time_ms: e.time_ms,
        kind: e.kind.as_str().to_string(),
        sandbox: e.sandbox.clone(),
        session: e.session.as_deref().map(|k| caller.display_key(k)),
        owner: owner.map(|o| o.id()),
        outcome: e.outcome.clone(),
        detail: e.detail.clone(),
    })
}

fn sse(body: &EventBody) -> Sse_ {
    Sse_::default()
        .id(body.id.to_string())
        .event(body.kind.clone())
        .json_data(body)
        .unwrap_or_else(|_| Sse_::default().event("error").data("unencodable event"))
}

/// The lifecycle events of the caller's sandboxes, as they happen:
/// created, start_failed, command (with its outcome kind), reset,
/// snapshot, lost, recovered, evicted, removed. Each SSE event is named
/// after its kind, carries its id (resume after it with `?after=ID` or
/// `Last-Event-ID`) and an EventBody. A `gap` event says events after the
/// id asked for had already left the window (the last 10000 are kept).
#[utoipa::path(
    get, path = "/v1/events", tag = "service",
    params(EventsQuery),
    responses(
        (status = 200, content_type = "text/event-stream", description = "SSE: events named after their kind, data EventBody; `gap` when some were lost"),
        (status = 400, description = "A bad `after` or `Last-Event-ID`", body = ErrorBody),
        (status = 401, description = "No or a wrong bearer token", body = ErrorBody),
        (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody),
    )
)]
pub(super) async fn events(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Query(q): Query<EventsQuery>,
    headers: HeaderMap,
) -> Result<Sse<impl futures_util::Stream<Item = Result<Sse_, Infallible>>>, ApiError> {
    let log = s.inner.runtime.events();
    let after = match (q.after, headers.get("last-event-id")) {
        (Some(a), _) => a,
        (None, Some(v)) => v
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| {
                ApiError::invalid(
                    "Last-Event-ID",
                    format!(
                        "Last-Event-ID '{}' is not an event id",
                        String::from_utf8_lossy(v.as_bytes())
                    ),
                )
            })?,
        (None, None) => log.last_id(),
    };
    let (since, mut live) = log.subscribe(after);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Sse_, Infallible>>(256);
    tokio::spawn(async move {
        if since.gap {
            let gap = Sse_::default().event("gap").data(format!(
                "events after {after} are no longer kept; these are the oldest still kept"
            ));
            if tx.send(Ok(gap)).await.is_err() {
                return;
            }
        }
        let mut last = after;
        for e in &since.events {
            last = e.id;
            if let Some(body) = visible(&s, &caller, e) {
                if tx.send(Ok(sse(&body))).await.is_err() {
                    return;
                }
            }
        }
        loop {
            let next = tokio::select! {
                next = live.recv() => next,
                // A service on its way out ends its streams.
                () = tokio::time::sleep(std::time::Duration::from_millis(500)) => {
                    if s.is_closing() {
                        return;
                    }
                    continue;
                }
            };
            match next {
                Ok(e) if e.id <= last => {}
                Ok(e) => {
                    last = e.id;
                    if let Some(body) = visible(&s, &caller, &e) {
                        if tx.send(Ok(sse(&body))).await.is_err() {
                            return;
                        }
                    }
                }
                Err(RecvError::Lagged(n)) => {
                    let gap = Sse_::default().event("gap").data(format!(
                        "this reader fell {n} events behind; resume with ?after={last}"
                    ));
                    if tx.send(Ok(gap)).await.is_err() {
                        return;
                    }
                }
                Err(RecvError::Closed) => return,
            }
        }
    });
    Ok(Sse::new(ReceiverStream::new(rx)).keep_alive(KeepAlive::default()))
}
