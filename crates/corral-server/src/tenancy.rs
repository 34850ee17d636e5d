//! The service's books of who owns each sandbox it hands out (REST
//! sessions, forks and MCP sessions alike, by provider key), the tenants'
//! quotas, and the operator's shared snapshots.
//!
//! Who may do what is decided by `corral_core::principal`; this module
//! only remembers owners and counts against quotas. A start reserves its
//! keys first ([`Tenancy::reserve`]), so concurrent requests of one tenant
//! cannot overshoot `max_sandboxes`; a reservation that is not committed
//! (the start failed) gives the keys back when dropped. A key whose
//! sandbox the provider no longer holds (released, evicted, expired) stops
//! counting by itself.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use corral::Provider;
use corral_core::config::ServerConfig;
use corral_core::principal::{Principal, Quota, QuotaExceeded, Sharing};

/// The books; cheap to clone.
#[derive(Clone)]
pub struct Tenancy {
    inner: Arc<Inner>,
}

struct Inner {
    provider: Provider,
    quotas: BTreeMap<String, Quota>,
    sharing: Sharing,
    owners: Mutex<HashMap<String, Owned>>,
    /// Owners of keys seen, kept after their sessions end (the events of a
    /// removed sandbox still belong to someone), the oldest forgotten past
    /// [`HISTORY`].
    history: Mutex<(
        HashMap<String, Principal>,
        std::collections::VecDeque<String>,
    )>,
}

/// Keys whose owners are remembered after their sessions end.
const HISTORY: usize = 100_000;

struct Owned {
    owner: Principal,
    /// A start for this key is in flight.
    pending: bool,
}

/// Keys reserved for a start; given back when dropped uncommitted.
pub struct Reservation {
    tenancy: Tenancy,
    keys: Vec<String>,
    committed: bool,
}

impl Tenancy {
    /// Books for the sandboxes `provider` hands out, under `server`'s
    /// tenants and sharing.
    pub fn new(server: &ServerConfig, provider: Provider) -> Tenancy {
        Tenancy {
            inner: Arc::new(Inner {
                provider,
                quotas: server
                    .tenants
                    .iter()
                    .map(|(name, t)| (name.clone(), t.quota()))
                    .collect(),
                sharing: server.sharing(),
                owners: Mutex::new(HashMap::new()),
                history: Mutex::new(Default::default()),
            }),
        }
    }

    fn owners(&self) -> MutexGuard<'_, HashMap<String, Owned>> {
        // Plain map updates: a panic cannot leave one half-done.
        self.inner.owners.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The operator's snapshots shared read-only.
    pub fn sharing(&self) -> &Sharing {
        &self.inner.sharing
    }

    /// The quotas of `principal`'s tenant (none for the operator).
    pub fn quota(&self, principal: &Principal) -> Option<(String, Quota)> {
        let tenant = principal.tenant()?;
        Some((
            tenant.to_string(),
            self.inner.quotas.get(tenant).copied().unwrap_or_default(),
        ))
    }

    /// Who owns the sandbox of provider key `key`, if the service made it.
    pub fn owner(&self, key: &str) -> Option<Principal> {
        self.owners().get(key).map(|o| o.owner.clone())
    }

    /// Who owned provider key `key` last, also after its session ended
    /// (for events).
    pub fn owner_ever(&self, key: &str) -> Option<Principal> {
        if let Some(o) = self.owner(key) {
            return Some(o);
        }
        let h = self.inner.history.lock().unwrap_or_else(|p| p.into_inner());
        h.0.get(key).cloned()
    }

    fn remember(&self, key: &str, owner: &Principal) {
        let mut h = self.inner.history.lock().unwrap_or_else(|p| p.into_inner());
        if h.0.insert(key.to_string(), owner.clone()).is_none() {
            h.1.push_back(key.to_string());
            if h.1.len() > HISTORY {
                if let Some(old) = h.1.pop_front() {
                    h.0.remove(&old);
                }
            }
        }
    }

    /// Reserves `keys` for sandboxes `owner` is about to start, refused
    /// when its tenant would exceed `max_sandboxes`. A key already held
    /// (an existing session) is not counted twice.
    pub fn reserve(
        &self,
        owner: &Principal,
        keys: &[String],
    ) -> Result<Reservation, QuotaExceeded> {
        let provider = &self.inner.provider;
        let mut owners = self.owners();
        owners.retain(|k, o| o.pending || provider.has_session(k));
        if let Some((tenant, quota)) = self.quota(owner) {
            let live = owners
                .iter()
                .filter(|(k, o)| o.owner.tenant() == Some(tenant.as_str()) && !keys.contains(k))
                .count() as u64;
            quota.sandboxes(&tenant, live, keys.len() as u64)?;
        }
        for key in keys {
            owners.insert(
                key.clone(),
                Owned {
                    owner: owner.clone(),
                    pending: true,
                },
            );
        }
        drop(owners);
        for key in keys {
            self.remember(key, owner);
        }
        Ok(Reservation {
            tenancy: self.clone(),
            keys: keys.to_vec(),
            committed: false,
        })
    }

    /// Books `key` as `owner`'s without a quota check: a sandbox an
    /// earlier process started under the quota, served again.
    pub fn adopt(&self, key: &str, owner: &Principal) {
        self.owners().insert(
            key.to_string(),
            Owned {
                owner: owner.clone(),
                pending: false,
            },
        );
        self.remember(key, owner);
    }

    /// Forgets `key` (its sandbox was released).
    pub fn forget(&self, key: &str) {
        self.owners().remove(key);
    }
}

impl Reservation {
    /// The starts succeeded: the keys are owned from now on.
    pub fn commit(mut self) {
        let mut owners = self.tenancy.owners();
        for key in &self.keys {
            if let Some(o) = owners.get_mut(key) {
                o.pending = false;
            }
        }
        drop(owners);
        self.committed = true;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        let mut owners = self.tenancy.owners();
        for key in &self.keys {
            // Still ours only if nothing replaced the pending entry.
            if owners.get(key).is_some_and(|o| o.pending) {
                owners.remove(key);
            }
        }
    }
}
