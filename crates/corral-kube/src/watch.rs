//! One watch of corral's pods per backend (not one per sandbox: the API
//! server keeps a watch per connection), routing a pod's death to the
//! callback the runtime registered for it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use corral_core::backend::OnDeath;
use corral_core::labels;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;

/// Death callbacks by pod name, and the watch task feeding them.
#[derive(Default)]
pub struct PodWatch {
    routes: Mutex<HashMap<String, OnDeath>>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl PodWatch {
    /// Calls `on_death` once when pod `name` dies or goes; starts the
    /// watch on first use.
    pub fn watch(self: &Arc<Self>, api: &Api<Pod>, name: &str, on_death: OnDeath) {
        if let Ok(mut routes) = self.routes.lock() {
            routes.insert(name.to_string(), on_death);
        }
        let Ok(mut task) = self.task.lock() else {
            return;
        };
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let me = Arc::downgrade(self);
        let config = watcher::Config::default().labels(labels::SANDBOX);
        let stream = watcher::watcher(api.clone(), config).default_backoff();
        *task = Some(tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let Some(me) = me.upgrade() else {
                    return;
                };
                match event {
                    Ok(Event::Apply(pod) | Event::InitApply(pod)) => {
                        if let Some(how) = crate::state::death(&pod) {
                            me.fire(&pod, how);
                        }
                    }
                    Ok(Event::Delete(pod)) => {
                        let name = pod.metadata.name.clone().unwrap_or_default();
                        me.fire(&pod, format!("pod {name} was deleted"));
                    }
                    Ok(Event::Init | Event::InitDone) => {}
                    // The watcher re-lists after its backoff; a death
                    // missed meanwhile shows in that list.
                    Err(e) => tracing::warn!(error = %e, "watch of corral's pods broke; resuming"),
                }
            }
        }));
    }

    fn fire(&self, pod: &Pod, how: String) {
        let Some(name) = pod.metadata.name.as_deref() else {
            return;
        };
        let callback = self.routes.lock().ok().and_then(|mut r| r.remove(name));
        if let Some(callback) = callback {
            callback(how);
        }
    }

    /// Stops calling back for pod `name`.
    pub fn unwatch(&self, name: &str) {
        if let Ok(mut routes) = self.routes.lock() {
            routes.remove(name);
        }
    }
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        if let Ok(task) = self.task.get_mut() {
            if let Some(task) = task.take() {
                task.abort();
            }
        }
    }
}
