//! Pulling a missing image: one pull per image at a time (every start of
//! it waits for that pull and shares its outcome, so N rollouts of one new
//! image make one pull, not N), bounded in time, its failure typed (a name
//! or tag the registry does not have is `image_not_found`, anything else
//! that stops a pull is retryable), its progress logged and listed
//! ([`Pulls::in_flight`]), at most `daemon.pull_limit` pulls at once (the
//! others queue; a pull holds no start slot), with the registry's
//! credentials from `daemon.registry_auth_file` (`registry_auth.rs`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bollard::models::CreateImageInfo;
use bollard::query_parameters::CreateImageOptionsBuilder;
use bollard::Docker;
use corral_core::backend::{PullProgress, PullStatus};
use corral_core::image_pull::{self, PullCause};
use corral_core::{Error, FailureKind};
use futures_util::future::{BoxFuture, Shared};
use futures_util::{FutureExt, StreamExt};
use tokio::sync::Semaphore;

use crate::error::{is_connection_error, is_not_found};

/// How a pull ended, shared by everyone waiting for it (corral's `Error`
/// is not `Clone`; this is, and becomes one per waiter).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PullFailure {
    /// The registry does not have this name or tag, or refuses it: retrying
    /// fails the same way.
    NotFound(String),
    /// The registry or the daemon could not be reached, failed (5xx) or
    /// took too long: a later try may succeed.
    Unavailable(String),
}

impl PullFailure {
    /// The runtime's error for this outcome.
    pub(crate) fn into_error(self, image: &str) -> Error {
        match self {
            PullFailure::NotFound(reason) => Error::ImageNotFound {
                image: image.to_string(),
                reason,
            },
            PullFailure::Unavailable(reason) => Error::Engine {
                op: format!("pull image {image}"),
                kind: FailureKind::DaemonUnavailable,
                source: reason.into(),
            },
        }
    }
}

/// Classifies the text of a failed pull (the daemon's answer, or an error
/// item of its progress stream), as every engine does
/// ([`corral_core::image_pull`]).
pub(crate) fn classify_text(status: Option<u16>, message: &str) -> PullFailure {
    match image_pull::classify(status, message) {
        PullCause::NotFound => PullFailure::NotFound(message.to_string()),
        PullCause::Unavailable => PullFailure::Unavailable(message.to_string()),
    }
}

/// Classifies a daemon error of a pull.
fn classify(e: &bollard::errors::Error) -> PullFailure {
    match e {
        bollard::errors::Error::DockerResponseServerError {
            status_code,
            message,
        } => classify_text(Some(*status_code), message),
        bollard::errors::Error::DockerStreamError { error } => classify_text(None, error),
        e if is_connection_error(e) => PullFailure::Unavailable(e.to_string()),
        e => classify_text(None, &e.to_string()),
    }
}

/// Layers and bytes of one pull, from the daemon's progress stream.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    /// Per layer: (bytes downloaded, bytes in all, done).
    layers: HashMap<String, (u64, u64, bool)>,
}

impl Progress {
    /// Folds in one item of the stream.
    pub(crate) fn update(&mut self, info: &CreateImageInfo) {
        let (Some(id), Some(status)) = (info.id.as_deref(), info.status.as_deref()) else {
            return;
        };
        // Items without a layer id ("Pulling from x", "Digest: ...") or for
        // the tag itself carry no layer progress.
        if status.starts_with("Pulling from") || status.starts_with("Digest") {
            return;
        }
        let layer = self.layers.entry(id.to_string()).or_default();
        match status {
            "Downloading" => {
                if let Some(d) = &info.progress_detail {
                    layer.0 = d.current.unwrap_or(0).max(0) as u64;
                    layer.1 = d.total.unwrap_or(0).max(0) as u64;
                }
            }
            "Download complete" => layer.0 = layer.1,
            "Pull complete" | "Already exists" => {
                layer.0 = layer.1;
                layer.2 = true;
            }
            _ => {}
        }
    }

    /// Layers done, layers seen, bytes downloaded, bytes known in all.
    pub(crate) fn summary(&self) -> (usize, usize, u64, u64) {
        let done = self.layers.values().filter(|l| l.2).count();
        let bytes = self.layers.values().map(|l| l.0).sum();
        let total = self.layers.values().map(|l| l.1).sum();
        (done, self.layers.len(), bytes, total)
    }
}

impl Progress {
    /// The public view of this progress.
    fn view(&self) -> PullProgress {
        let (layers_done, layers, bytes, total_bytes) = self.summary();
        PullProgress {
            queued: false,
            layers_done,
            layers,
            bytes,
            total_bytes,
        }
    }
}

/// How often a pull's progress is logged at most.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// A pull in flight: its outcome, shared, and its progress.
#[derive(Clone)]
struct Flight {
    outcome: Shared<BoxFuture<'static, Result<(), PullFailure>>>,
    progress: tokio::sync::watch::Receiver<PullProgress>,
    started: Instant,
}

/// What every pull of one daemon shares: how long one may take, how many
/// may run at once, where the registries' credentials are.
#[derive(Debug, Clone)]
pub(crate) struct PullConfig {
    pub(crate) timeout: Duration,
    pub(crate) limit: usize,
    pub(crate) auth_file: Option<PathBuf>,
}

/// The pulls in flight, by image reference.
pub(crate) struct Pulls {
    flights: Arc<Mutex<HashMap<String, Flight>>>,
    slots: Arc<Semaphore>,
    config: PullConfig,
}

impl Pulls {
    pub(crate) fn new(config: PullConfig) -> Pulls {
        Pulls {
            flights: Arc::default(),
            slots: Arc::new(Semaphore::new(config.limit.max(1))),
            config,
        }
    }

    /// The pulls under way (queued or pulling), oldest first.
    pub(crate) fn in_flight(&self) -> Vec<PullStatus> {
        let flights = self.flights.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<PullStatus> = flights
            .iter()
            .map(|(image, f)| PullStatus {
                image: image.clone(),
                progress: *f.progress.borrow(),
                elapsed: f.started.elapsed(),
            })
            .collect();
        out.sort_by_key(|p| std::cmp::Reverse(p.elapsed));
        out
    }

    /// Makes sure `image` is present: joins the pull of it in flight, or
    /// starts one (which first looks again: a pull that ended between the
    /// caller's look and now left the image there). The pull runs as its
    /// own task, so a caller that gives up does not cancel it for the
    /// others.
    pub(crate) async fn ensure(
        &self,
        docker: &Docker,
        image: &str,
        mut on_progress: impl FnMut(PullProgress),
    ) -> Result<(), PullFailure> {
        let flight = {
            let mut flights = self.flights.lock().unwrap_or_else(|p| p.into_inner());
            match flights.get(image) {
                Some(f) => f.clone(),
                None => {
                    let (tx, progress) = tokio::sync::watch::channel(PullProgress {
                        queued: true,
                        ..Default::default()
                    });
                    let task = tokio::spawn(pull_once(
                        docker.clone(),
                        image.to_string(),
                        self.config.clone(),
                        self.slots.clone(),
                        self.flights.clone(),
                        tx,
                    ));
                    let outcome = async move {
                        task.await.unwrap_or_else(|e| {
                            Err(PullFailure::Unavailable(format!(
                                "the pull task ended: {e}"
                            )))
                        })
                    }
                    .boxed()
                    .shared();
                    let f = Flight {
                        outcome,
                        progress,
                        started: Instant::now(),
                    };
                    flights.insert(image.to_string(), f.clone());
                    f
                }
            }
        };
        let Flight {
            outcome,
            mut progress,
            ..
        } = flight;
        let mut outcome = std::pin::pin!(outcome);
        loop {
            tokio::select! {
                res = &mut outcome => return res,
                changed = progress.changed() => match changed {
                    Ok(()) => on_progress(*progress.borrow_and_update()),
                    // The pull is over; its outcome is the next thing.
                    Err(_) => return outcome.await,
                },
            }
        }
    }
}

/// One pull of `image` (unless it is present by now), then its entry is
/// taken out of `flights` so a later start looks at the daemon afresh.
/// It waits for a pull slot first (queued); the time bound runs from the
/// slot on, so a queued pull is bounded by the pulls ahead of it.
async fn pull_once(
    docker: Docker,
    image: String,
    config: PullConfig,
    slots: Arc<Semaphore>,
    flights: Arc<Mutex<HashMap<String, Flight>>>,
    progress: tokio::sync::watch::Sender<PullProgress>,
) -> Result<(), PullFailure> {
    let slot = match slots.clone().try_acquire_owned() {
        Ok(slot) => Ok(slot),
        Err(_) => {
            tracing::info!(
                image,
                limit = config.limit,
                "pull queued: daemon.pull_limit pulls are running"
            );
            slots.acquire_owned().await
        }
    };
    // The slot is held until the entry is out of `flights`: released
    // earlier, the next pull would show as pulling beside this one and the
    // table would report more pulls at once than daemon.pull_limit.
    let (outcome, _slot) = match slot {
        Err(_) => (
            Err(PullFailure::Unavailable("the pull slots are closed".into())),
            None,
        ),
        Ok(slot) => {
            progress.send_modify(|p| p.queued = false);
            let pulling = pull(&docker, &image, config.auth_file.as_deref(), &progress);
            let res = match tokio::time::timeout(config.timeout, pulling).await {
                Ok(res) => res,
                Err(_) => Err(PullFailure::Unavailable(format!(
                    "the pull did not finish within {} ms (daemon.pull_timeout_ms)",
                    config.timeout.as_millis()
                ))),
            };
            (res, Some(slot))
        }
    };
    flights
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&image);
    outcome
}

async fn pull(
    docker: &Docker,
    image: &str,
    auth_file: Option<&std::path::Path>,
    watchers: &tokio::sync::watch::Sender<PullProgress>,
) -> Result<(), PullFailure> {
    match docker.inspect_image(image).await {
        Ok(_) => return Ok(()),
        Err(e) if is_not_found(&e) => {}
        Err(e) => return Err(classify(&e)),
    }
    // Read at each pull: a rotated secret applies without a restart. A
    // file that cannot be used stops the pull as the registry's refusal
    // would (fixing the file, not retrying, helps).
    let credentials = match auth_file {
        Some(file) => {
            crate::registry_auth::credentials_for(file, image).map_err(PullFailure::NotFound)?
        }
        None => None,
    };
    let (from, tag) = split_tag(image);
    let opts = CreateImageOptionsBuilder::default()
        .from_image(from)
        .tag(tag)
        .build();
    let started = Instant::now();
    tracing::info!(
        image,
        registry = %crate::registry_auth::registry_of(image),
        credentials = credentials.is_some(),
        "pulling image"
    );
    let mut progress = Progress::default();
    let mut logged = Instant::now();
    let mut stream = docker.create_image(Some(opts), None, credentials);
    while let Some(item) = stream.next().await {
        let info = item.map_err(|e| classify(&e))?;
        if let Some(detail) = info.error_detail.as_ref().and_then(|d| d.message.clone()) {
            return Err(classify_text(None, &detail));
        }
        progress.update(&info);
        watchers.send_if_modified(|p| {
            let now = progress.view();
            std::mem::replace(p, now) != now
        });
        if logged.elapsed() >= PROGRESS_EVERY {
            logged = Instant::now();
            let (done, layers, bytes, total) = progress.summary();
            tracing::info!(image, done, layers, bytes, total, "pull progress");
        }
    }
    // Some daemons end a failed pull's stream without an error item.
    match docker.inspect_image(image).await {
        Ok(_) => {}
        Err(e) if is_not_found(&e) => {
            return Err(PullFailure::NotFound(
                "the pull finished but the image is still missing".into(),
            ))
        }
        Err(e) => return Err(classify(&e)),
    }
    let (_, layers, bytes, _) = progress.summary();
    tracing::info!(
        image,
        layers,
        bytes,
        ms = started.elapsed().as_millis() as u64,
        "pulled image"
    );
    Ok(())
}

/// Splits `repo[:tag]` (digests stay whole); the tag defaults to `latest`, so
/// a pull never fetches every tag of a repository.
pub(crate) fn split_tag(image: &str) -> (&str, &str) {
    if image.contains('@') {
        return (image, "");
    }
    let last_slash = image.rfind('/').map_or(0, |i| i + 1);
    match image[last_slash..].rfind(':') {
        Some(i) => (&image[..last_slash + i], &image[last_slash + i + 1..]),
        None => (image, "latest"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bollard::models::ProgressDetail;

    #[test]
    fn splits_tags_not_registry_ports() {
        assert_eq!(split_tag("debian"), ("debian", "latest"));
        assert_eq!(split_tag("debian:12"), ("debian", "12"));
        assert_eq!(split_tag("reg:5000/x/y"), ("reg:5000/x/y", "latest"));
        assert_eq!(split_tag("reg:5000/x/y:1"), ("reg:5000/x/y", "1"));
        assert_eq!(split_tag("x@sha256:ab"), ("x@sha256:ab", ""));
    }

    #[test]
    fn a_missing_name_or_tag_is_not_found_an_unreachable_registry_retryable() {
        // As Docker 20.10 answers them.
        let nf = |s, m: &str| matches!(classify_text(s, m), PullFailure::NotFound(_));
        assert!(nf(
            Some(404),
            "manifest for 127.0.0.1:5000/x:nope not found: manifest unknown: manifest unknown"
        ));
        assert!(nf(Some(404), "pull access denied for nosuch, repository does not exist or may require 'docker login': denied: requested access to the resource is denied"));
        assert!(nf(Some(400), "invalid reference format"));
        assert!(nf(
            None,
            "name unknown: repository name not known to registry"
        ));
        let un = |s, m: &str| matches!(classify_text(s, m), PullFailure::Unavailable(_));
        assert!(un(Some(500), "Get \"http://127.0.0.1:5000/v2/\": dial tcp 127.0.0.1:5000: connect: connection refused"));
        assert!(un(Some(500), "Get \"https://registry-1.docker.io/v2/\": net/http: request canceled while waiting for connection (Client.Timeout exceeded while awaiting headers)"));
        assert!(un(
            Some(500),
            "received unexpected HTTP status: 503 Service Unavailable"
        ));
        assert!(un(None, "unexpected EOF"));
        // A host that does not resolve names no image (no registry there).
        assert!(nf(Some(500), "Get \"https://registry-1.docker.io/v2/\": dial tcp: lookup registry-1.docker.io on 10.255.255.53:53: no such host"));
        assert!(un(Some(500), "something else went wrong"));
        // Each becomes the runtime's typed error.
        let e = PullFailure::NotFound("x".into()).into_error("a:b");
        assert_eq!(e.kind(), FailureKind::ImageNotFound);
        assert!(!e.retryable());
        let e = PullFailure::Unavailable("x".into()).into_error("a:b");
        assert_eq!(e.kind(), FailureKind::DaemonUnavailable);
        assert!(e.retryable());
        assert!(e.to_string().contains("pull image a:b"), "{e}");
    }

    #[test]
    fn progress_counts_layers_and_bytes() {
        let item = |id: &str, status: &str, cur: Option<i64>, total: Option<i64>| CreateImageInfo {
            id: Some(id.into()),
            status: Some(status.into()),
            progress_detail: Some(ProgressDetail {
                current: cur,
                total,
            }),
            ..Default::default()
        };
        let mut p = Progress::default();
        p.update(&item("1", "Pulling from x", None, None));
        p.update(&item("a", "Pulling fs layer", None, None));
        p.update(&item("b", "Already exists", None, None));
        p.update(&item("a", "Downloading", Some(10), Some(100)));
        assert_eq!(p.summary(), (1, 2, 10, 100));
        p.update(&item("a", "Download complete", None, None));
        p.update(&item("a", "Pull complete", None, None));
        assert_eq!(p.summary(), (2, 2, 100, 100));
    }
}
