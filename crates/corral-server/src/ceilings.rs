//! The operator's ceilings (`server.limits`, [`ServerLimits`]) applied to
//! every HTTP request and every MCP tool call, in one place.
//!
//! Three things keep a client from growing the service without bound, or
//! from taking it from the others:
//!
//! - **Per-request ceilings**: a request asking for more output, a longer
//!   timeout, more stdin or a larger read than the operator allows is
//!   refused naming the field, its value and the ceiling (never clamped:
//!   a client that asked for 512 MiB of output must not believe it got
//!   it). A field left out takes a default at most the ceiling.
//! - **One budget for all requests in flight**: each request reserves its
//!   worst case in bytes ([`ServerLimits::command_bytes`],
//!   [`ServerLimits::file_bytes`]) and one of `max_concurrent` slots before
//!   it starts, and holds them until its answer has been handed to the
//!   connection ([`hold`] wraps the response body), so a slow reader
//!   cannot keep memory the budget no longer counts. What cannot be had at
//!   once is refused with 503 `overloaded` and `Retry-After` ([`Busy`]):
//!   nothing of the request ran, so retrying it is safe. Refusing rather
//!   than queueing keeps a waiting request from holding its body and
//!   connection, and makes the client's backoff the queue.
//! - **A share per principal** ([`Holder`]): a tenant (the operator counts
//!   as one), or the address of a peer no token names, holds at most
//!   `share_percent` of the bytes and of the slots
//!   ([`ServerLimits::share_bytes`], [`ServerLimits::share_slots`]), so no
//!   one of them can starve the others.
//!
//! A request's body is reserved as its bytes arrive ([`hold`] meters the
//! body the handler reads), never by the size it announces, from the share
//! of the principal the door found (authentication comes first on every
//! listener: a request no token names has its body read by no handler but
//! a port relay's). It must arrive within `body_timeout_ms` of the
//! request, else it is cut off and the request answered 408. A relay's
//! body (port links, E2B ports) streams on to the sandbox and holds only
//! the piece in hand. Creating, resetting, snapshotting and forking
//! sandboxes take no slot: start slots and `provider.max_live` bound them.
//!
//! Bytes are counted as the output, input and file contents a request
//! holds, not their JSON encoding, so the memory they stand for is a small
//! constant times the budget, which is what makes it a bound.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future as _;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::connect_info::ConnectInfo;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, IntoResponseParts, Response, ResponseParts};
use corral_core::principal::Principal;
use corral_core::server_limits::ServerLimits;
use corral_core::CommandSpec;
use http_body::{Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;
use crate::guard::Caller;

/// Seconds a client is asked to wait (`Retry-After`) after an `overloaded`
/// refusal: room comes back as commands end, usually within seconds.
pub const OVERLOADED_RETRY_AFTER_SECS: u64 = 1;

/// Budget permits are KiB: tokio counts permits of one acquire in a u32.
const PERMIT_BYTES: u64 = 1024;

/// Largest piece of a response body handed to the connection at once, so
/// that a reservation is released only when at most this much of its
/// answer is still unsent.
const CHUNK: usize = 64 << 10;

/// Shares kept for principals holding nothing before they are swept.
const IDLE_SHARES: usize = 1024;

/// The ceilings and the shared budget; cheap to clone (one per service,
/// shared by the API, E2B and MCP).
#[derive(Clone)]
pub struct Ceilings {
    inner: Arc<Inner>,
}

struct Inner {
    limits: ServerLimits,
    budget: Arc<Semaphore>,
    /// Permits `budget` started with.
    budget_permits: usize,
    slots: Arc<Semaphore>,
    /// Each principal's share, made when it first reserves.
    shares: Mutex<HashMap<Holder, Share>>,
    /// Bytes, permits (KiB) and slots of one share.
    share_bytes: u64,
    share_permits: usize,
    share_slots: usize,
    /// Requests refused because the budget was full.
    refused_budget: AtomicU64,
    /// Requests refused because every slot was taken.
    refused_slots: AtomicU64,
    /// Requests refused because their principal's share was full.
    refused_share: AtomicU64,
}

/// One principal's part of the budget and of the slots.
#[derive(Clone)]
struct Share {
    bytes: Arc<Semaphore>,
    slots: Arc<Semaphore>,
}

impl Share {
    fn in_use(&self) -> bool {
        // A permit in a reservation holds its semaphore.
        Arc::strong_count(&self.bytes) > 1 || Arc::strong_count(&self.slots) > 1
    }
}

/// Whose share a reservation comes from: the principal a request's token
/// named (an MCP session counts as its tenant), or, for a request no token
/// names (a port link, a public E2B port, a health check), its peer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Holder {
    /// The operator.
    Operator,
    /// A tenant, by name.
    Tenant(String),
    /// An unauthenticated peer, by its IP address.
    Peer(IpAddr),
    /// An unauthenticated peer on a Unix socket.
    Local,
}

impl Holder {
    /// The share `principal` draws from.
    pub fn of(principal: &Principal) -> Holder {
        match principal {
            Principal::Operator | Principal::Mcp { tenant: None, .. } => Holder::Operator,
            Principal::Tenant(t)
            | Principal::Mcp {
                tenant: Some(t), ..
            } => Holder::Tenant(t.clone()),
        }
    }

    /// The share of `req`: its [`Caller`], else its peer's address.
    fn of_request(req: &Request) -> Holder {
        if let Some(Caller(p)) = req.extensions().get::<Caller>() {
            return Holder::of(p);
        }
        match req.extensions().get::<ConnectInfo<SocketAddr>>() {
            Some(ConnectInfo(addr)) => Holder::Peer(addr.ip()),
            None => Holder::Local,
        }
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Holder::Operator => write!(f, "the operator"),
            Holder::Tenant(t) => write!(f, "tenant '{t}'"),
            Holder::Peer(ip) => write!(f, "unauthenticated peer {ip}"),
            Holder::Local => write!(f, "unauthenticated local peers"),
        }
    }
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
    /// Requests refused since start because their principal's share was
    /// full.
    pub refused_share: u64,
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
    /// The principal's own requests in flight hold its whole share.
    #[error(
        "{holder} holds its whole share of the service ({share} bytes of \
         server.limits.buffer_bytes and {slots} of server.limits.max_concurrent: \
         server.limits.share_percent) and this request needs up to {needed} bytes more; retry \
         when some of its requests finish (the rest of the service is kept for others)"
    )]
    Share {
        /// Whose share.
        holder: String,
        /// Bytes the request would reserve (0 for a slot).
        needed: u64,
        /// Bytes of one share.
        share: u64,
        /// Slots of one share.
        slots: u64,
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

/// Permits of the budget and of a share, given back when dropped.
#[derive(Default)]
struct Held {
    _bytes: Option<OwnedSemaphorePermit>,
    _share_bytes: Option<OwnedSemaphorePermit>,
    _slot: Option<OwnedSemaphorePermit>,
    _share_slot: Option<OwnedSemaphorePermit>,
}

impl Ceilings {
    /// The ceilings of `limits`, for request bodies of up to `max_body`
    /// bytes (`server.max_body_bytes`).
    pub fn new(limits: &ServerLimits, max_body: u64) -> Ceilings {
        // Rounded up, plus one: a request's body and its own reservation
        // are each rounded up to whole KiB, and a request at the ceilings
        // that `ServerLimits::validate` found to fit must fit here too.
        let permits = |bytes: u64| {
            usize::try_from(bytes.div_ceil(PERMIT_BYTES) + 1)
                .unwrap_or(usize::MAX)
                .min(Semaphore::MAX_PERMITS)
        };
        let slots = usize::try_from(limits.max_concurrent)
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        Ceilings {
            inner: Arc::new(Inner {
                limits: limits.clone(),
                budget: Arc::new(Semaphore::new(permits(limits.buffer_bytes))),
                budget_permits: permits(limits.buffer_bytes),
                slots: Arc::new(Semaphore::new(slots)),
                shares: Mutex::new(HashMap::new()),
                share_bytes: limits.share_bytes(max_body),
                share_permits: permits(limits.share_bytes(max_body)),
                share_slots: usize::try_from(limits.share_slots())
                    .unwrap_or(usize::MAX)
                    .min(Semaphore::MAX_PERMITS),
                refused_budget: AtomicU64::new(0),
                refused_slots: AtomicU64::new(0),
                refused_share: AtomicU64::new(0),
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
            refused_share: inner.refused_share.load(Ordering::Relaxed),
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

    /// A slot and the budget, from `holder`'s share, for a command keeping
    /// `max_output` bytes per stream with `stdin` bytes of input,
    /// `streamed` or not.
    pub fn command(
        &self,
        holder: &Holder,
        max_output: u64,
        stdin: u64,
        streamed: bool,
    ) -> Result<Reservation, Busy> {
        self.reserve(
            holder,
            ServerLimits::command_bytes(max_output, stdin, streamed),
            true,
        )
    }

    /// [`Ceilings::command`] for `cmd` as it will run.
    pub fn exec(
        &self,
        holder: &Holder,
        cmd: &CommandSpec,
        streamed: bool,
    ) -> Result<Reservation, Busy> {
        let stdin = cmd.stdin.as_ref().map_or(0, |b| b.len() as u64);
        self.command(holder, cmd.max_output, stdin, streamed)
    }

    /// A slot and the budget, from `holder`'s share, for a file operation
    /// moving up to `payload` bytes. The agent's file commands write only
    /// their error report to stderr, so one stream's worth is counted.
    pub fn file(&self, holder: &Holder, payload: u64) -> Result<Reservation, Busy> {
        self.reserve(holder, ServerLimits::file_bytes(payload), true)
    }

    /// `holder`'s share, made on its first use. Shares of principals that
    /// hold nothing are swept once there are many (unauthenticated peers
    /// come and go).
    fn share(&self, holder: &Holder) -> Share {
        let inner = &self.inner;
        // Plain map updates: a panic cannot leave one half-done.
        let mut shares = inner.shares.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = shares.get(holder) {
            return s.clone();
        }
        if shares.len() >= IDLE_SHARES {
            shares.retain(|_, s| s.in_use());
        }
        let share = Share {
            bytes: Arc::new(Semaphore::new(inner.share_permits)),
            slots: Arc::new(Semaphore::new(inner.share_slots)),
        };
        shares.insert(holder.clone(), share.clone());
        share
    }

    fn share_busy(&self, holder: &Holder, needed: u64) -> Busy {
        let inner = &self.inner;
        inner.refused_share.fetch_add(1, Ordering::Relaxed);
        Busy::Share {
            holder: holder.to_string(),
            needed,
            share: inner.share_bytes,
            slots: inner.share_slots as u64,
        }
    }

    fn reserve(&self, holder: &Holder, bytes: u64, slot: bool) -> Result<Reservation, Busy> {
        let inner = &self.inner;
        let share = self.share(holder);
        let mut held = Held::default();
        // The service's own room first: a share of 100% is the budget.
        if slot {
            held._slot = Some(inner.slots.clone().try_acquire_owned().map_err(|_| {
                inner.refused_slots.fetch_add(1, Ordering::Relaxed);
                Busy::Slots {
                    max: inner.limits.max_concurrent,
                }
            })?);
            held._share_slot = Some(
                share
                    .slots
                    .clone()
                    .try_acquire_owned()
                    .map_err(|_| self.share_busy(holder, 0))?,
            );
        }
        let permits = bytes.div_ceil(PERMIT_BYTES);
        if permits > 0 {
            let budget_busy = || {
                inner.refused_budget.fetch_add(1, Ordering::Relaxed);
                Busy::Budget {
                    needed: bytes,
                    budget: inner.limits.buffer_bytes,
                }
            };
            let Ok(permits) = u32::try_from(permits) else {
                return Err(budget_busy());
            };
            held._bytes = Some(
                inner
                    .budget
                    .clone()
                    .try_acquire_many_owned(permits)
                    .map_err(|_| budget_busy())?,
            );
            held._share_bytes = Some(
                share
                    .bytes
                    .clone()
                    .try_acquire_many_owned(permits)
                    .map_err(|_| self.share_busy(holder, bytes))?,
            );
        }
        Ok(Reservation {
            _held: Arc::new(held),
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

/// Marks a request whose body streams on to a sandbox's server (a port
/// link, an E2B port): it holds only the piece in hand, not all it sent.
/// Set by the door ([`crate::guard`]).
#[derive(Debug, Clone, Copy)]
pub struct Relayed;

/// The budget share of every listener, behind its door ([`crate::door`]):
/// meters the request's body as it arrives, from the share of the
/// principal the door found (or of its peer), cut off at
/// `body_timeout_ms`; and holds a [`Reservation`] the handler put in its
/// response until the response body has been handed over. A body cut off
/// answers 503 `overloaded` (its share or the budget is full) or 408 (too
/// slow), whatever the handler made of the broken body.
pub async fn hold(State(ceilings): State<Ceilings>, req: Request, next: Next) -> Response {
    let holder = Holder::of_request(&req);
    let relayed = req.extensions().get::<Relayed>().is_some();
    let wait = Duration::from_millis(ceilings.inner.limits.body_timeout_ms);
    if req.body().is_end_stream() {
        return held(next.run(req).await);
    }
    let meter = Arc::new(Meter {
        ceilings: ceilings.clone(),
        holder,
        state: Mutex::new(Metered::default()),
    });
    let req = req.map(|body| {
        Body::new(MeteredBody {
            inner: body,
            meter: meter.clone(),
            relayed,
            deadline: Box::pin(tokio::time::sleep(wait)),
            done: false,
        })
    });
    let response = next.run(req).await;
    // The body has been read by now (a handler answers after taking it):
    // what it holds goes with the meter, unless a relay still streams it.
    let cut = meter.take_cut();
    drop(meter);
    match cut {
        Some(cut) => cut.into_response(),
        None => held(response),
    }
}

/// `response`, holding the [`Reservation`] its handler put in it until its
/// body has been handed over.
fn held(mut response: Response) -> Response {
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

/// Why a request's body was cut off.
#[derive(Debug, Clone)]
enum Cut {
    /// Its principal's share, or the budget, could not hold the next bytes.
    Busy(Busy),
    /// It did not arrive within `body_timeout_ms`.
    Slow(u64),
}

impl IntoResponse for Cut {
    fn into_response(self) -> Response {
        match self {
            Cut::Busy(b) => ApiError::from(b).into_response(),
            Cut::Slow(ms) => {
                let mut e = ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "request_timeout",
                    format!(
                        "the request body did not arrive within {ms} ms \
                         (server.limits.body_timeout_ms): send it faster, or ask the operator \
                         for a longer timeout"
                    ),
                );
                e.detail.field = Some("body".into());
                e.into_response()
            }
        }
    }
}

/// What one request's body holds, shared by the body and [`hold`].
struct Meter {
    ceilings: Ceilings,
    holder: Holder,
    state: Mutex<Metered>,
}

#[derive(Default)]
struct Metered {
    /// Bytes received (of the piece in hand only, for a relay).
    bytes: u64,
    /// The reservations for them.
    held: Vec<Reservation>,
    /// KiB reserved.
    permits: u64,
    cut: Option<Cut>,
}

impl Meter {
    fn lock(&self) -> std::sync::MutexGuard<'_, Metered> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reserves `len` more bytes (a relay: in place of the last piece).
    fn take(&self, len: u64, relayed: bool) -> Result<(), Busy> {
        let mut m = self.lock();
        if relayed {
            m.bytes = 0;
            m.permits = 0;
            m.held.clear();
        }
        m.bytes = m.bytes.saturating_add(len);
        let want = m.bytes.div_ceil(PERMIT_BYTES);
        if want > m.permits {
            let more = (want - m.permits) * PERMIT_BYTES;
            let r = self.ceilings.reserve(&self.holder, more, false)?;
            m.held.push(r);
            m.permits = want;
        }
        Ok(())
    }

    fn cut(&self, cut: Cut) {
        let mut m = self.lock();
        m.held.clear();
        m.cut.get_or_insert(cut);
    }

    fn take_cut(&self) -> Option<Cut> {
        self.lock().cut.take()
    }
}

/// A request body reserved as it arrives and cut off at its deadline.
struct MeteredBody {
    inner: Body,
    meter: Arc<Meter>,
    relayed: bool,
    deadline: Pin<Box<tokio::time::Sleep>>,
    done: bool,
}

impl HttpBody for MeteredBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => {
                if this.deadline.as_mut().poll(cx).is_ready() {
                    this.done = true;
                    let ms = this.meter.ceilings.inner.limits.body_timeout_ms;
                    this.meter.cut(Cut::Slow(ms));
                    return Poll::Ready(Some(Err(axum::Error::new(format!(
                        "the request body did not arrive within {ms} ms"
                    )))));
                }
                Poll::Pending
            }
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if let Err(busy) = this.meter.take(data.len() as u64, this.relayed) {
                        this.done = true;
                        let message = busy.to_string();
                        this.meter.cut(Cut::Busy(busy));
                        return Poll::Ready(Some(Err(axum::Error::new(message))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                this.done = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
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

    fn h() -> Holder {
        Holder::Tenant("t".into())
    }

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
        let body = c.reserve(&h(), max_body, false).expect("the body");
        let _command = c
            .command(&h(), 1000, 1001, true)
            .expect("the largest command beside its body");
        drop(body);
    }

    #[test]
    fn the_budget_and_the_slots_refuse_what_does_not_fit_and_come_back() {
        let limits = ServerLimits {
            max_concurrent: 2,
            buffer_bytes: 100 << 10,
            share_percent: 100,
            ..ServerLimits::default()
        };
        let c = Ceilings::new(&limits, 1024);
        // 2 x 10 KiB of output: 20 of the 100 KiB.
        let a = c.command(&h(), 10 << 10, 0, false).expect("fits");
        // 10 KiB + 64 KiB of room for the report: 94 KiB in all.
        let b = c.file(&h(), 10 << 10).expect("fits");
        let e = c.command(&h(), 1, 0, false).err().expect("no slot left");
        assert_eq!(e, Busy::Slots { max: 2 });
        let now = c.usage();
        assert_eq!((now.reserved_bytes, now.in_flight), (94 << 10, 2));
        assert_eq!((now.refused_slots, now.refused_budget), (1, 0));
        drop(b);
        // 4 x 21 KiB streamed: 84 KiB, more than the 80 (and one of
        // rounding slack) left.
        let e = c
            .command(&h(), 21 << 10, 0, true)
            .err()
            .expect("over the budget");
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
        let small = c
            .command(&h(), 1, 0, false)
            .expect("a slot and 1 KiB are free");
        drop(small);
        let kept = a.clone();
        drop(a);
        assert!(
            c.command(&h(), 21 << 10, 0, true).is_err(),
            "a clone still holds it"
        );
        drop(kept);
        c.command(&h(), 21 << 10, 0, true)
            .expect("the budget is free again");
    }

    #[test]
    fn one_principal_holds_its_share_and_leaves_the_rest_to_others() {
        let limits = ServerLimits {
            max_output: 1 << 10,
            max_stdin_bytes: 1 << 10,
            max_read_bytes: 1 << 10,
            max_concurrent: 4,
            buffer_bytes: 400 << 10,
            share_percent: 50,
            ..ServerLimits::default()
        };
        let c = Ceilings::new(&limits, 1 << 10);
        let alice = Holder::Tenant("alice".into());
        let bob = Holder::Tenant("bob".into());
        let peer = Holder::Peer("192.0.2.7".parse().expect("ip"));
        // alice takes half of 400 KiB (and the KiB of rounding slack), then
        // asks for more: her share is full.
        let a = c.reserve(&alice, 201 << 10, false).expect("half");
        let e = c
            .reserve(&alice, 1, false)
            .err()
            .expect("her share is spent");
        assert!(
            matches!(&e, Busy::Share { holder, .. } if holder == "tenant 'alice'"),
            "{e}"
        );
        let api = ApiError::from(e.clone());
        assert_eq!(
            (api.status.as_u16(), api.detail.kind.as_str()),
            (503, "overloaded")
        );
        assert!(e.to_string().contains("server.limits.share_percent"), "{e}");
        // Two slots of four each.
        let s1 = c.command(&alice, 1, 0, false);
        assert!(
            matches!(s1, Err(Busy::Share { .. })),
            "no bytes left to alice"
        );
        let b1 = c.command(&bob, 1, 0, false).expect("bob's own share");
        let b2 = c.command(&bob, 1, 0, false).expect("bob's second slot");
        assert!(matches!(
            c.command(&bob, 1, 0, false),
            Err(Busy::Share { needed: 0, .. })
        ));
        let p = c
            .reserve(&peer, 100 << 10, false)
            .expect("a peer's share is its own");
        assert_eq!(c.usage().refused_share, 3);
        drop((a, b1, b2, p));
        c.reserve(&alice, 201 << 10, false).expect("room is back");
    }

    #[tokio::test]
    async fn a_response_holds_its_reservation_until_its_last_piece_is_taken() {
        use http_body_util::BodyExt;
        let limits = ServerLimits {
            buffer_bytes: 100 << 10,
            share_percent: 100,
            ..ServerLimits::default()
        };
        let c = Ceilings::new(&limits, 1024);
        let answer = vec![7u8; 3 * CHUNK + 10];
        let mut body = HeldBody {
            inner: Body::from(answer.clone()),
            pending: None,
            held: Some(c.command(&h(), 40 << 10, 0, false).expect("80 KiB")),
        };
        assert_eq!(body.size_hint().exact(), Some(answer.len() as u64));
        let mut got = Vec::new();
        while got.len() < 3 * CHUNK {
            let frame = body.frame().await.expect("a frame").expect("data");
            let data = frame.into_data().expect("data");
            assert!(data.len() <= CHUNK);
            got.extend_from_slice(&data);
            // A slow reader has not taken the rest: still reserved.
            assert!(c.command(&h(), 40 << 10, 0, false).is_err());
        }
        let last = body.frame().await.expect("the last piece").expect("data");
        got.extend_from_slice(&last.into_data().expect("data"));
        assert_eq!(got, answer);
        assert!(body.is_end_stream());
        let again = c
            .command(&h(), 40 << 10, 0, false)
            .expect("released with the last piece");
        // A client that goes away mid-answer releases it too.
        let dropped = HeldBody {
            inner: Body::from(answer),
            pending: None,
            held: Some(again),
        };
        assert!(c.command(&h(), 40 << 10, 0, false).is_err());
        drop(dropped);
        c.command(&h(), 40 << 10, 0, false)
            .expect("released with the body");
    }
}
