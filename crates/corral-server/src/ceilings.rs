//! The operator's ceilings (`server.limits`, [`ServerLimits`]) applied to
//! every HTTP request and every MCP tool call, in one place.
//!
//! Two things keep a client from growing the service without bound:
//!
//! - **Per-request ceilings**: a request asking for more output, a longer
//!   timeout, more stdin or a larger read than the operator allows is
//!   refused naming the field, its value and the ceiling (never clamped:
//!   a client that asked for 512 MiB of output must not believe it got
//!   it). A field left out takes a default at most the ceiling.
//! - **One budget for all requests in flight**: each request reserves its
//!   worst case in bytes ([`ServerLimits::command_bytes`],
//!   [`ServerLimits::file_bytes`], its body) and one of
//!   `max_concurrent` slots before it starts, and holds them until its
//!   answer has been handed to the connection ([`hold`] wraps the
//!   response body), so a slow reader cannot keep memory the budget no
//!   longer counts. What cannot be had at once is refused with 503
//!   `overloaded` and `Retry-After` ([`Busy`]): nothing of the request ran,
//!   so retrying it is safe. Refusing rather than queueing keeps a waiting
//!   request from holding its body and connection, and makes the client's
//!   backoff the queue.
//!
//! Request bodies are reserved by [`hold`] from their `Content-Length`
//! before they are read (a chunked body reserves `server.max_body_bytes`),
//! so the budget also bounds bodies, MCP's included. Creating, resetting,
//! snapshotting and forking sandboxes take no slot: start slots and
//! `provider.max_live` bound them.
//!
//! Bytes are counted as the output, input and file contents a request
//! holds, not their JSON encoding, so the memory they stand for is a small
//! constant times the budget, which is what makes it a bound.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, IntoResponseParts, Response, ResponseParts};
use corral_core::server_limits::ServerLimits;
use corral_core::CommandSpec;
use http_body::{Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;

/// Seconds a client is asked to wait (`Retry-After`) after an `overloaded`
/// refusal: room comes back as commands end, usually within seconds.
pub const OVERLOADED_RETRY_AFTER_SECS: u64 = 1;

/// Budget permits are KiB: tokio counts permits of one acquire in a u32.
const PERMIT_BYTES: u64 = 1024;

/// Largest piece of a response body handed to the connection at once, so
/// that a reservation is released only when at most this much of its
/// answer is still unsent.
const CHUNK: usize = 64 << 10;

/// The ceilings and the shared budget; cheap to clone (one per service,
/// shared by the API and MCP).
#[derive(Clone)]
pub struct Ceilings {
    inner: Arc<Inner>,
}

struct Inner {
    limits: ServerLimits,
    max_body: u64,
    budget: Arc<Semaphore>,
    /// Permits `budget` started with.
    budget_permits: usize,
    slots: Arc<Semaphore>,
    /// Requests refused because the budget was full.
    refused_budget: AtomicU64,
    /// Requests refused because every slot was taken.
    refused_slots: AtomicU64,
}

/// What the ceilings hold now, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Bytes reserved by requests in flight (whole KiB).
    pub reserved_bytes: u64,
    /// The budget (`server.limits.buffer_bytes`).
    pub budget_bytes: u64,
    /// Commands, file operations and tool calls in flight.
    pub in_flight: u64,
    /// Requests refused since start because the budget was full.
    pub refused_budget: u64,
    /// Requests refused since start because every slot was taken.
    pub refused_slots: u64,
}

/// A request field above its ceiling.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{field} {value} is above this service's ceiling of {ceiling} (server.limits.{key}); ask for \
     at most {ceiling}"
)]
pub struct OverCeiling {
    /// The request field.
    pub field: String,
    /// What the request asked for, in the field's unit.
    pub value: String,
    /// The ceiling, in the field's unit.
    pub ceiling: String,
    /// The key under `server.limits` that sets it.
    pub key: &'static str,
}

/// No room for a request now; nothing of it ran.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Busy {
    /// The bytes it would hold are not free in the budget.
    #[error(
        "the service is overloaded: requests in flight hold its whole buffer budget \
         (server.limits.buffer_bytes {budget}) and this one needs up to {needed} bytes; retry \
         when some finish"
    )]
    Budget {
        /// Bytes the request would reserve.
        needed: u64,
        /// The whole budget.
        budget: u64,
    },
    /// Every slot for commands and file operations is taken.
    #[error(
        "the service is overloaded: {max} commands and file operations are in flight \
         (server.limits.max_concurrent); retry when some finish"
    )]
    Slots {
        /// `max_concurrent`.
        max: u32,
    },
}

/// The unit a timeout field is given in, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeUnit {
    /// Milliseconds (`timeout_ms`).
    Millis,
    /// Seconds (`timeout_secs`).
    Secs,
}

impl TimeUnit {
    fn show(self, d: Duration) -> String {
        match self {
            TimeUnit::Millis => d.as_millis().to_string(),
            TimeUnit::Secs => d.as_secs_f64().to_string(),
        }
    }
}

/// What a request holds from the budget (and its slot); released when the
/// last clone is dropped. As a response part ([`IntoResponseParts`]) it is
/// held until the response body has been handed over ([`hold`]).
#[derive(Clone)]
pub struct Reservation {
    _held: Arc<Held>,
}

struct Held {
    _bytes: Option<OwnedSemaphorePermit>,
    _slot: Option<OwnedSemaphorePermit>,
}

impl Ceilings {
    /// The ceilings of `limits`, for request bodies of up to `max_body`
    /// bytes (`server.max_body_bytes`).
    pub fn new(limits: &ServerLimits, max_body: u64) -> Ceilings {
        // Rounded up, plus one: a request's body and its own reservation
        // are each rounded up to whole KiB, and a request at the ceilings
        // that `ServerLimits::validate` found to fit must fit here too.
        let permits = usize::try_from(limits.buffer_bytes.div_ceil(PERMIT_BYTES) + 1)
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        let slots = usize::try_from(limits.max_concurrent)
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        Ceilings {
            inner: Arc::new(Inner {
                limits: limits.clone(),
                max_body,
                budget: Arc::new(Semaphore::new(permits)),
                budget_permits: permits,
                slots: Arc::new(Semaphore::new(slots)),
                refused_budget: AtomicU64::new(0),
                refused_slots: AtomicU64::new(0),
            }),
        }
    }

    /// The ceilings.
    pub fn limits(&self) -> &ServerLimits {
        &self.inner.limits
    }

    /// What is reserved now, and how often requests were refused.
    pub fn usage(&self) -> Usage {
        let inner = &self.inner;
        let free = inner.budget.available_permits();
        let slots = usize::try_from(inner.limits.max_concurrent).unwrap_or(usize::MAX);
        let taken = slots.saturating_sub(inner.slots.available_permits());
        Usage {
            reserved_bytes: (inner.budget_permits.saturating_sub(free) as u64) * PERMIT_BYTES,
            budget_bytes: inner.limits.buffer_bytes,
            in_flight: taken as u64,
            refused_budget: inner.refused_budget.load(Ordering::Relaxed),
            refused_slots: inner.refused_slots.load(Ordering::Relaxed),
        }
    }

    /// `max_output` (request field `field`): `default` (at most the
    /// ceiling) when none was asked for.
    pub fn max_output(
        &self,
        field: &str,
        asked: Option<u64>,
        default: u64,
    ) -> Result<u64, OverCeiling> {
        self.at_most(
            field,
            asked,
            default,
            self.inner.limits.max_output,
            "max_output",
        )
    }

    /// `max_bytes` of a file operation (request field `field`): `default`
    /// (at most the ceiling) when none was asked for.
    pub fn read_bytes(
        &self,
        field: &str,
        asked: Option<u64>,
        default: u64,
    ) -> Result<u64, OverCeiling> {
        let ceiling = self.inner.limits.max_read_bytes;
        self.at_most(field, asked, default, ceiling, "max_read_bytes")
    }

    /// A command's time limit (request field `field`, shown in `unit`):
    /// `default` when none was asked for, the ceiling when there is no
    /// default either or it is longer.
    pub fn timeout(
        &self,
        field: &str,
        asked: Option<Duration>,
        default: Option<Duration>,
        unit: TimeUnit,
    ) -> Result<Duration, OverCeiling> {
        let ceiling = Duration::from_millis(self.inner.limits.max_timeout_ms);
        match asked {
            None => Ok(default.map_or(ceiling, |d| d.min(ceiling))),
            Some(t) if t > ceiling => Err(OverCeiling {
                field: field.to_string(),
                value: unit.show(t),
                ceiling: unit.show(ceiling),
                key: "max_timeout_ms",
            }),
            Some(t) => Ok(t),
        }
    }

    /// A command's stdin of `len` bytes (request field `field`).
    pub fn stdin(&self, field: &str, len: u64) -> Result<(), OverCeiling> {
        let ceiling = self.inner.limits.max_stdin_bytes;
        self.at_most(field, Some(len), 0, ceiling, "max_stdin_bytes")
            .map(|_| ())
    }

    fn at_most(
        &self,
        field: &str,
        asked: Option<u64>,
        default: u64,
        ceiling: u64,
        key: &'static str,
    ) -> Result<u64, OverCeiling> {
        match asked {
            None => Ok(default.min(ceiling)),
            Some(n) if n > ceiling => Err(OverCeiling {
                field: field.to_string(),
                value: n.to_string(),
                ceiling: ceiling.to_string(),
                key,
            }),
            Some(n) => Ok(n),
        }
    }

    /// A slot and the budget for a command keeping `max_output` bytes per
    /// stream with `stdin` bytes of input, `streamed` or not.
    pub fn command(
        &self,
        max_output: u64,
        stdin: u64,
        streamed: bool,
    ) -> Result<Reservation, Busy> {
        self.reserve(
            ServerLimits::command_bytes(max_output, stdin, streamed),
            true,
        )
    }

    /// [`Ceilings::command`] for `cmd` as it will run.
    pub fn exec(&self, cmd: &CommandSpec, streamed: bool) -> Result<Reservation, Busy> {
        let stdin = cmd.stdin.as_ref().map_or(0, |b| b.len() as u64);
        self.command(cmd.max_output, stdin, streamed)
    }

    /// A slot and the budget for a file operation moving up to `payload`
    /// bytes. The agent's file commands write only their error report to
    /// stderr, so one stream's worth is counted.
    pub fn file(&self, payload: u64) -> Result<Reservation, Busy> {
        self.reserve(ServerLimits::file_bytes(payload), true)
    }

    fn reserve(&self, bytes: u64, slot: bool) -> Result<Reservation, Busy> {
        let inner = &self.inner;
        let slot = if slot {
            Some(inner.slots.clone().try_acquire_owned().map_err(|_| {
                inner.refused_slots.fetch_add(1, Ordering::Relaxed);
                Busy::Slots {
                    max: inner.limits.max_concurrent,
                }
            })?)
        } else {
            None
        };
        let busy = || {
            inner.refused_budget.fetch_add(1, Ordering::Relaxed);
            Busy::Budget {
                needed: bytes,
                budget: inner.limits.buffer_bytes,
            }
        };
        let permits = bytes.div_ceil(PERMIT_BYTES);
        let bytes = if permits == 0 {
            None
        } else {
            let permits = u32::try_from(permits).map_err(|_| busy())?;
            Some(
                inner
                    .budget
                    .clone()
                    .try_acquire_many_owned(permits)
                    .map_err(|_| busy())?,
            )
        };
        Ok(Reservation {
            _held: Arc::new(Held {
                _bytes: bytes,
                _slot: slot,
            }),
        })
    }
}

impl From<OverCeiling> for ApiError {
    fn from(e: OverCeiling) -> ApiError {
        let field = e.field.clone();
        ApiError::invalid(field, e.to_string())
    }
}

impl From<Busy> for ApiError {
    fn from(e: Busy) -> ApiError {
        ApiError::overloaded(e.to_string(), OVERLOADED_RETRY_AFTER_SECS)
    }
}

impl IntoResponseParts for Reservation {
    type Error = Infallible;

    fn into_response_parts(self, mut res: ResponseParts) -> Result<ResponseParts, Infallible> {
        res.extensions_mut().insert(self);
        Ok(res)
    }
}

/// The middleware in front of every route and `/mcp`: reserves the
/// request's body before it is read (refused with 503 `overloaded` when
/// the budget cannot hold it), and holds a [`Reservation`] the handler put
/// in its response until the response body has been handed over.
pub async fn hold(State(ceilings): State<Ceilings>, req: Request, next: Next) -> Response {
    let declared = body_bytes(&req, ceilings.inner.max_body);
    let body = match ceilings.reserve(declared, false) {
        Ok(r) => r,
        Err(busy) => return ApiError::from(busy).into_response(),
    };
    let mut response = next.run(req).await;
    // The body has been read and dropped by now (a handler answers after
    // taking it), so its reservation goes here.
    drop(body);
    match response.extensions_mut().remove::<Reservation>() {
        None => response,
        Some(held) => response.map(|inner| {
            Body::new(HeldBody {
                inner,
                pending: None,
                held: Some(held),
            })
        }),
    }
}

/// The bytes a request's body may take: its `Content-Length`, or the body
/// limit when it is chunked, at most the limit (axum refuses more).
fn body_bytes(req: &Request, max_body: u64) -> u64 {
    let headers = req.headers();
    if let Some(len) = headers.get(header::CONTENT_LENGTH) {
        return len
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map_or(max_body, |n| n.min(max_body));
    }
    if headers.contains_key(header::TRANSFER_ENCODING) {
        return max_body;
    }
    0
}

/// A response body holding its request's reservation until the last
/// piece has been handed to the connection (or the body is dropped, when
/// the client went away). Large frames are handed over in [`CHUNK`]s, so
/// what the connection holds beyond the reservation stays small.
struct HeldBody {
    inner: Body,
    pending: Option<Bytes>,
    held: Option<Reservation>,
}

impl HeldBody {
    fn piece(&mut self, mut data: Bytes) -> Frame<Bytes> {
        if data.len() > CHUNK {
            let rest = data.split_off(CHUNK);
            self.pending = Some(rest);
        }
        Frame::data(data)
    }

    fn release_when_done(&mut self) {
        if self.pending.is_none() && self.inner.is_end_stream() {
            self.held = None;
        }
    }
}

impl HttpBody for HeldBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if let Some(data) = this.pending.take() {
            let frame = this.piece(data);
            this.release_when_done();
            return Poll::Ready(Some(Ok(frame)));
        }
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        let out = match polled {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(None) => {
                this.held = None;
                return Poll::Ready(None);
            }
            Poll::Ready(Some(Err(e))) => {
                this.held = None;
                return Poll::Ready(Some(Err(e)));
            }
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => this.piece(data),
                Err(other) => other,
            },
        };
        this.release_when_done();
        Poll::Ready(Some(Ok(out)))
    }

    fn is_end_stream(&self) -> bool {
        self.pending.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let pending = self.pending.as_ref().map_or(0, |p| p.len() as u64);
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower().saturating_add(pending));
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(pending));
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Ceilings {
        let limits = ServerLimits {
            max_output: 1000,
            max_timeout_ms: 5000,
            max_stdin_bytes: 100,
            max_read_bytes: 2000,
            max_concurrent: 2,
            buffer_bytes: 10 * 1024,
            ..ServerLimits::default()
        };
        Ceilings::new(&limits, 1024)
    }

    #[test]
    fn an_ask_above_a_ceiling_is_refused_naming_field_value_and_ceiling() {
        let c = small();
        let e = c
            .max_output("max_output", Some(1001), 10)
            .expect_err("above");
        assert_eq!((e.field.as_str(), e.value.as_str()), ("max_output", "1001"));
        assert_eq!(
            e.to_string(),
            "max_output 1001 is above this service's ceiling of 1000 \
             (server.limits.max_output); ask for at most 1000"
        );
        assert_eq!(c.max_output("max_output", Some(1000), 10), Ok(1000));
        assert_eq!(c.max_output("max_output", None, 1 << 20), Ok(1000));
        let e = c
            .timeout(
                "timeout_secs",
                Some(Duration::from_secs(6)),
                None,
                TimeUnit::Secs,
            )
            .expect_err("above");
        assert_eq!((e.value.as_str(), e.ceiling.as_str()), ("6", "5"));
        let e = c
            .timeout(
                "timeout_ms",
                Some(Duration::from_millis(5001)),
                None,
                TimeUnit::Millis,
            )
            .expect_err("above");
        assert_eq!((e.value.as_str(), e.key), ("5001", "max_timeout_ms"));
        assert_eq!(
            c.timeout("t", None, None, TimeUnit::Millis),
            Ok(Duration::from_millis(5000)),
            "no timeout takes the ceiling"
        );
        assert_eq!(
            c.timeout("t", None, Some(Duration::from_secs(1)), TimeUnit::Secs),
            Ok(Duration::from_secs(1))
        );
        assert_eq!(
            c.stdin("stdin", 101).map_err(|e| e.key),
            Err("max_stdin_bytes")
        );
        assert_eq!(
            c.read_bytes("max_bytes", Some(2001), 1).map_err(|e| e.key),
            Err("max_read_bytes")
        );
        let api = ApiError::from(c.stdin("stdin_base64", 500).expect_err("above"));
        assert_eq!(api.status, axum::http::StatusCode::BAD_REQUEST);
        assert_eq!(api.detail.field.as_deref(), Some("stdin_base64"));
    }

    #[test]
    fn a_request_at_the_ceilings_fits_the_smallest_valid_budget() {
        // Sizes that are not whole KiB, so every reservation rounds up.
        let mut limits = ServerLimits {
            max_output: 1000,
            max_stdin_bytes: 1001,
            max_read_bytes: 10,
            ..ServerLimits::default()
        };
        let max_body = 1003;
        limits.buffer_bytes = limits.largest_request(max_body);
        limits.validate(max_body).expect("valid");
        let c = Ceilings::new(&limits, max_body);
        let body = c.reserve(max_body, false).expect("the body");
        let _command = c
            .command(1000, 1001, true)
            .expect("the largest command beside its body");
        drop(body);
    }

    #[test]
    fn the_budget_and_the_slots_refuse_what_does_not_fit_and_come_back() {
        let limits = ServerLimits {
            max_concurrent: 2,
            buffer_bytes: 100 << 10,
            ..ServerLimits::default()
        };
        let c = Ceilings::new(&limits, 1024);
        // 2 x 10 KiB of output: 20 of the 100 KiB.
        let a = c.command(10 << 10, 0, false).expect("fits");
        // 10 KiB + 64 KiB of room for the report: 94 KiB in all.
        let b = c.file(10 << 10).expect("fits");
        let e = c.command(1, 0, false).err().expect("no slot left");
        assert_eq!(e, Busy::Slots { max: 2 });
        let now = c.usage();
        assert_eq!((now.reserved_bytes, now.in_flight), (94 << 10, 2));
        assert_eq!((now.refused_slots, now.refused_budget), (1, 0));
        drop(b);
        // 4 x 21 KiB streamed: 84 KiB, more than the 80 (and one of
        // rounding slack) left.
        let e = c.command(21 << 10, 0, true).err().expect("over the budget");
        assert_eq!(
            e,
            Busy::Budget {
                needed: 84 << 10,
                budget: 100 << 10
            }
        );
        let api = ApiError::from(e);
        assert_eq!(api.status, axum::http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(api.detail.kind, "overloaded");
        assert!(api.detail.retryable);
        assert_eq!(api.retry_after, Some(OVERLOADED_RETRY_AFTER_SECS));
        // The refused request gave its slot back: one more fits beside a.
        let small = c.command(1, 0, false).expect("a slot and 1 KiB are free");
        drop(small);
        let kept = a.clone();
        drop(a);
        assert!(
            c.command(21 << 10, 0, true).is_err(),
            "a clone still holds it"
        );
        drop(kept);
        c.command(21 << 10, 0, true)
            .expect("the budget is free again");
    }

    #[tokio::test]
    async fn a_response_holds_its_reservation_until_its_last_piece_is_taken() {
        use http_body_util::BodyExt;
        let limits = ServerLimits {
            buffer_bytes: 100 << 10,
            ..ServerLimits::default()
        };
        let c = Ceilings::new(&limits, 1024);
        let answer = vec![7u8; 3 * CHUNK + 10];
        let mut body = HeldBody {
            inner: Body::from(answer.clone()),
            pending: None,
            held: Some(c.command(40 << 10, 0, false).expect("80 KiB")),
        };
        assert_eq!(body.size_hint().exact(), Some(answer.len() as u64));
        let mut got = Vec::new();
        while got.len() < 3 * CHUNK {
            let frame = body.frame().await.expect("a frame").expect("data");
            let data = frame.into_data().expect("data");
            assert!(data.len() <= CHUNK);
            got.extend_from_slice(&data);
            // A slow reader has not taken the rest: still reserved.
            assert!(c.command(40 << 10, 0, false).is_err());
        }
        let last = body.frame().await.expect("the last piece").expect("data");
        got.extend_from_slice(&last.into_data().expect("data"));
        assert_eq!(got, answer);
        assert!(body.is_end_stream());
        let again = c
            .command(40 << 10, 0, false)
            .expect("released with the last piece");
        // A client that goes away mid-answer releases it too.
        let dropped = HeldBody {
            inner: Body::from(answer),
            pending: None,
            held: Some(again),
        };
        assert!(c.command(40 << 10, 0, false).is_err());
        drop(dropped);
        c.command(40 << 10, 0, false)
            .expect("released with the body");
    }
}
