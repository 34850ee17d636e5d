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
        if let Some(name) = pod.metadata.name.as_deref() {
            self.died(name, how);
        }
    }

    /// Calls pod `name`'s callback now, if it has one: its deletion was
    /// accepted by the API server, which this process knows before any
    /// watch event can say so (a command sent meanwhile must not reach the
    /// dying pod's agent, which runs until the kubelet kills it).
    pub fn died(&self, name: &str, how: String) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn a_deletion_told_directly_fires_the_route_once_and_only_its_own() {
        let watch = PodWatch::default();
        let fired = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(String::new()));
        for name in ["corral-a-1", "corral-b-1"] {
            let (fired, seen) = (fired.clone(), seen.clone());
            let key = name.to_string();
            let callback: OnDeath = Arc::new(move |how: String| {
                fired.fetch_add(1, Ordering::SeqCst);
                if let Ok(mut s) = seen.lock() {
                    *s = format!("{name}: {how}");
                }
            });
            if let Ok(mut routes) = watch.routes.lock() {
                routes.insert(key, callback);
            }
        }
        watch.died("corral-a-1", "pod corral-a-1 is being deleted".into());
        assert_eq!(fired.load(Ordering::SeqCst), 1);
        assert_eq!(
            seen.lock().map(|s| s.clone()).unwrap_or_default(),
            "corral-a-1: pod corral-a-1 is being deleted"
        );
        // Once: the watch's own event for it later finds no route.
        watch.died("corral-a-1", "pod corral-a-1 was deleted".into());
        assert_eq!(fired.load(Ordering::SeqCst), 1);
        // Unwatched (the runtime removing it itself): nothing fires.
        watch.unwatch("corral-b-1");
        watch.died("corral-b-1", "gone".into());
        assert_eq!(fired.load(Ordering::SeqCst), 1);
    }
}
