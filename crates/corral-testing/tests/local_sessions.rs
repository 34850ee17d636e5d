//! Persistent sessions when the backend keeps their files
//! (`SessionStorage::Backend`, as on Kubernetes), over the real agent as a
//! local process: the provider makes no host directories, adopts only the
//! sandbox the backend recorded for the session, and replaces one it did
//! not record.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{spec, within, TempDir};
use corral::pool::ProviderConfig;
use corral::{CommandSpec, Provider, Runtime, RuntimeConfig};
use corral_core::backend::{
    AgentStream, Backend, BoxFuture, ImagePresence, OnDeath, Placement, Prepared, SandboxInfo,
    SessionStorage, StartRequest,
};
use corral_core::{ContainerState, ContainerStatus, Error};
use corral_testing::{LocalConfig, LocalProcessBackend};

const T: Duration = Duration::from_secs(20);

/// The local backend, keeping sessions' "volumes" itself: it records the
/// sandbox it made for each session, as the Kubernetes backend records
/// the pod on the session's claim.
#[derive(Clone)]
struct VolumeSessions {
    local: LocalProcessBackend,
    /// Session key -> the placement made for it.
    recorded: Arc<Mutex<HashMap<String, Placement>>>,
    /// Whether `create` records (off: a backend that lost its record).
    record: Arc<Mutex<bool>>,
}

impl Backend for VolumeSessions {
    fn name(&self) -> &'static str {
        "local (volume sessions)"
    }
    fn endpoint(&self) -> &str {
        self.local.endpoint()
    }
    fn ping(&self) -> BoxFuture<'_, Result<(), Error>> {
        self.local.ping()
    }
    fn prepare<'a>(&'a self, req: &'a StartRequest<'a>) -> BoxFuture<'a, Result<Prepared, Error>> {
        self.local.prepare(req)
    }
    fn create<'a>(&'a self, req: &'a StartRequest<'a>) -> BoxFuture<'a, Result<Placement, Error>> {
        Box::pin(async move {
            let placement = self.local.create(req).await?;
            if let Some(key) = &req.spec.persistent {
                if *self.record.lock().expect("lock") {
                    self.recorded
                        .lock()
                        .expect("lock")
                        .insert(key.clone(), placement.clone());
                }
            }
            Ok(placement)
        })
    }
    fn start<'a>(
        &'a self,
        req: &'a StartRequest<'a>,
        placement: &'a Placement,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.local.start(req, placement)
    }
    fn connect<'a>(
        &'a self,
        placement: &'a Placement,
        sandbox_id: &'a str,
    ) -> BoxFuture<'a, Result<AgentStream, Error>> {
        self.local.connect(placement, sandbox_id)
    }
    fn state<'a>(
        &'a self,
        placement: &'a Placement,
    ) -> BoxFuture<'a, Result<ContainerState, Error>> {
        self.local.state(placement)
    }
    fn watch(&self, placement: &Placement, on_death: OnDeath) {
        self.local.watch(placement, on_death)
    }
    fn unwatch(&self, placement: &Placement) {
        self.local.unwatch(placement)
    }
    fn remove<'a>(
        &'a self,
        placement: &'a Placement,
        sandbox_id: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.local.remove(placement, sandbox_id)
    }
    fn list(&self) -> BoxFuture<'_, Result<Vec<SandboxInfo>, Error>> {
        self.local.list()
    }
    fn image_present<'a>(&'a self, image: &'a str) -> BoxFuture<'a, Result<ImagePresence, Error>> {
        self.local.image_present(image)
    }
    fn session_storage(&self) -> SessionStorage {
        SessionStorage::Backend
    }
    fn session_placement<'a>(
        &'a self,
        session: &'a str,
    ) -> BoxFuture<'a, Result<Option<Placement>, Error>> {
        Box::pin(async move {
            let recorded = self.recorded.lock().expect("lock").get(session).cloned();
            let Some(placement) = recorded else {
                return Ok(None);
            };
            let state = self.local.state(&placement).await?;
            Ok((state.status != ContainerStatus::Removed).then_some(placement))
        })
    }
}

struct Harness {
    backend: VolumeSessions,
    runtime: Runtime,
    root: std::path::PathBuf,
    _dirs: Vec<TempDir>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.backend.local.kill_all();
    }
}

fn harness(test: &str) -> Harness {
    let base = std::env::temp_dir().join(format!("corral-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&base).expect("test dir");
    let backend = VolumeSessions {
        local: LocalProcessBackend::new(LocalConfig::default()),
        recorded: Arc::default(),
        record: Arc::new(Mutex::new(true)),
    };
    let runtime = Runtime::new(
        Arc::new(backend.clone()),
        RuntimeConfig {
            shared_slots: false,
            reap_orphans: false,
            seal_key_file: Some(base.join("seal.key")),
            ..RuntimeConfig::default()
        },
    );
    Harness {
        backend,
        runtime,
        root: base.join("workspaces"),
        _dirs: vec![TempDir(base)],
    }
}

fn provider(h: &Harness) -> Provider {
    Provider::with_persistence_root(h.runtime.clone(), ProviderConfig::default(), h.root.clone())
}

/// The session's base spec: the local backend runs commands on this host,
/// where `/workspace` does not exist, so the working directory is given.
fn session_spec() -> corral::SandboxSpec {
    let mut s = spec();
    s.workdir = Some("/".into());
    s
}

#[tokio::test(flavor = "multi_thread")]
async fn the_recorded_sandbox_is_adopted_and_no_host_directory_is_made() {
    let h = harness("sessions-adopt");
    within(T, async {
        let p1 = provider(&h);
        let lease = p1
            .acquire_persistent("user/42", &session_spec())
            .await
            .expect("acquire");
        let r = lease.run(&CommandSpec::shell("echo $HOME; pwd")).await;
        assert_eq!(r.exit_code, Some(0), "{r:?}");
        let out = String::from_utf8_lossy(&r.stdout).to_string();
        assert_eq!(
            out, "/home/corral\n/\n",
            "HOME is the session's, cwd as given"
        );
        assert_eq!(lease.spec().persistent.as_deref(), Some("user/42"));
        assert!(
            lease.spec().mounts.is_empty(),
            "no host directories are mounted: {:?}",
            lease.spec().mounts
        );
        let id = lease.id().to_string();
        drop(lease);
        // A persistent sandbox outlives its provider.
        p1.shutdown().await;
        assert_eq!(h.backend.local.count(), 1);

        let p2 = provider(&h);
        let again = p2
            .acquire_persistent("user/42", &session_spec())
            .await
            .expect("adopt");
        assert_eq!(again.id(), id, "the recorded sandbox was adopted");
        assert_eq!(h.backend.local.count(), 1);
        let r = again.run(&CommandSpec::shell("echo adopted")).await;
        assert_eq!(r.stdout, b"adopted\n");
        drop(again);
        // Releasing removes the sandbox; the backend keeps the files.
        p2.release_and_wait("user/42").await.expect("release");
        assert_eq!(h.backend.local.count(), 0);
        p2.shutdown().await;
        assert!(
            !h.root.exists(),
            "the provider made host directories under {}",
            h.root.display()
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_the_backend_did_not_record_is_replaced_not_adopted() {
    let h = harness("sessions-replace");
    within(T, async {
        *h.backend.record.lock().expect("lock") = false;
        let p1 = provider(&h);
        let lease = p1
            .acquire_persistent("user/43", &session_spec())
            .await
            .expect("acquire");
        let id = lease.id().to_string();
        drop(lease);
        p1.shutdown().await;
        assert_eq!(h.backend.local.count(), 1);

        // Sealed by this user for this key and spec, running, but not the
        // one the backend recorded: removed and replaced.
        *h.backend.record.lock().expect("lock") = true;
        let p2 = provider(&h);
        let fresh = p2
            .acquire_persistent("user/43", &session_spec())
            .await
            .expect("acquire");
        assert_ne!(fresh.id(), id, "an unrecorded sandbox was adopted");
        let listed = h.runtime.list_sandboxes().await.expect("list");
        assert_eq!(
            listed
                .iter()
                .map(|i| i.sandbox_id.as_str())
                .collect::<Vec<_>>(),
            [fresh.id()],
            "the unrecorded sandbox is gone"
        );
        drop(fresh);
        p2.release_and_wait("user/43").await.expect("release");
        p2.shutdown().await;
        assert_eq!(h.backend.local.count(), 0);
    })
    .await;
}
