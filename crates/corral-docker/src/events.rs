//! Watching the daemon's container events, so a sandbox learns that its
//! container died even when its control stream does not end (seen with
//! gVisor, whose exec streams can outlive a killed sandbox).
//!
//! One events subscription per backend, filtered to corral's containers,
//! routes `die`/`destroy` events to the watcher of the container (the
//! runtime closes the sandbox's control stream: every command in flight
//! then ends with a typed failure from the container's state instead of
//! waiting forever).
//! `oom` events are remembered per container, so an OOM kill of PID 1 is
//! told even when the daemon's `OOMKilled` flag lost its race.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bollard::query_parameters::EventsOptionsBuilder;
use bollard::Docker;
use corral_core::labels;
use futures_util::StreamExt;

use corral_core::backend::OnDeath;

/// Routes container events to sandboxes.
#[derive(Default)]
pub(crate) struct EventRouter {
    watched: Mutex<HashMap<String, OnDeath>>,
    /// When the daemon last reported an OOM kill in a watched container.
    ooms: Mutex<HashMap<String, Instant>>,
    started: std::sync::OnceLock<()>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every critical section is a single map operation: a panic cannot leave
    // the map half-updated.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl EventRouter {
    /// Starts watching `container`; the subscription starts with the first watch.
    pub fn watch(self: &Arc<Self>, docker: &Docker, container: &str, on_death: OnDeath) {
        lock(&self.watched).insert(container.to_string(), on_death);
        self.started.get_or_init(|| {
            tokio::spawn(subscribe(Arc::downgrade(self), docker.clone()));
        });
    }

    /// Stops watching `container`.
    pub fn unwatch(&self, container: &str) {
        lock(&self.watched).remove(container);
        lock(&self.ooms).remove(container);
    }

    /// When the daemon last reported an OOM kill inside `container`.
    ///
    /// The daemon sets `State.OOMKilled` only when its OOM event arrives
    /// before the exit event; when they race the other way the container
    /// reads as merely stopped, and this event is what tells the OOM.
    pub fn last_oom(&self, container: &str) -> Option<Instant> {
        lock(&self.ooms).get(container).copied()
    }

    fn deliver(&self, container: &str, reason: String) {
        let watcher = lock(&self.watched).get(container).cloned();
        if let Some(on_death) = watcher {
            on_death(reason);
        }
    }
}

async fn subscribe(router: Weak<EventRouter>, docker: Docker) {
    let filters = HashMap::from([
        ("type".to_string(), vec!["container".to_string()]),
        ("label".to_string(), vec![labels::SANDBOX.to_string()]),
        (
            "event".to_string(),
            vec!["die".to_string(), "destroy".to_string(), "oom".to_string()],
        ),
    ]);
    loop {
        let opts = EventsOptionsBuilder::default().filters(&filters).build();
        let mut events = docker.events(Some(opts));
        while let Some(item) = events.next().await {
            let Some(router) = router.upgrade() else {
                return;
            };
            let Ok(event) = item else { break };
            let Some(actor) = event.actor else { continue };
            let Some(id) = actor.id else { continue };
            let action = event.action.unwrap_or_default();
            if action == "oom" {
                if lock(&router.watched).contains_key(&id) {
                    lock(&router.ooms).insert(id, Instant::now());
                }
                continue;
            }
            let code = actor
                .attributes
                .as_ref()
                .and_then(|a| a.get("exitCode"))
                .map(|c| format!(" with exit code {c}"))
                .unwrap_or_default();
            router.deliver(
                &id,
                format!("the daemon reported the container {action}{code}"),
            );
        }
        if router.strong_count() == 0 {
            return;
        }
        // The daemon went away or restarted: subscribe again shortly.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
