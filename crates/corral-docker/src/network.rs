//! The network sandboxes with network access join: corral's own bridge,
//! `corral`, with inter-container communication off.
//!
//! On Docker's default `bridge` network every container can open
//! connections to every other one, so one sandbox could reach a server
//! another sandbox runs. corral's network is a bridge created with
//! `com.docker.network.bridge.enable_icc=false`: the daemon drops traffic
//! between containers on it, while traffic to the outside (through the
//! gateway's NAT) and to the gateway address itself still flows. Docker's
//! isolation rules already drop traffic between different bridge networks,
//! so sandboxes cannot reach containers on `bridge` either.
//!
//! The network is made once per daemon and then left in place, like the
//! agent volume: it holds nothing of its own and every corral process of
//! every user shares it. It carries the label `corral.network`; a network
//! of that name that corral did not make, or one with other options, is an
//! error naming the option and its value rather than something corral
//! removes or reuses: other containers may be attached to it, and reusing
//! it would silently give up the isolation.
//!
//! Docker (before API 1.44) does not refuse a second network of the same
//! name, so creation is serialised across the user's corral processes with
//! a lock file; should duplicates exist anyway (another user raced us), the
//! one with the smallest id is used by everyone.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bollard::models::{Network, NetworkCreateRequest};
use bollard::query_parameters::ListNetworksOptionsBuilder;
use bollard::Docker;

use corral_core::Error;

/// The name of corral's sandbox network.
pub const NETWORK_NAME: &str = "corral";

/// Label on the network corral made; the value is the layout version.
pub const NETWORK_LABEL: &str = "corral.network";

/// The bridge driver's option that turns inter-container traffic on or off.
pub const ICC_OPTION: &str = "com.docker.network.bridge.enable_icc";

const LAYOUT: &str = "1";

/// Longest wait for another corral process creating the network.
const LOCK_WAIT: Duration = Duration::from_secs(60);

/// What corral found about its network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkInfo {
    /// The network's id (what containers join).
    pub id: String,
    /// Its subnets, e.g. `172.18.0.0/16`.
    pub subnets: Vec<String>,
    /// Its gateways (the host side), e.g. `172.18.0.1`.
    pub gateways: Vec<String>,
}

/// Makes sure corral's network exists with inter-container communication
/// off and returns it. Errors name the network, the option and its value.
pub async fn ensure(docker: &Docker) -> Result<NetworkInfo, Error> {
    if let Some(info) = find(docker).await? {
        return Ok(info);
    }
    let lock = tokio::task::spawn_blocking(lock_file)
        .await
        .map_err(|e| net_error(format!("waiting for the creation lock failed: {e}")))?;
    // Another process may have made it while we waited for the lock.
    if let Some(info) = find(docker).await? {
        drop(lock);
        return Ok(info);
    }
    let created = docker
        .create_network(NetworkCreateRequest {
            name: NETWORK_NAME.to_string(),
            driver: Some("bridge".into()),
            internal: Some(false),
            attachable: Some(false),
            options: Some(HashMap::from([(
                ICC_OPTION.to_string(),
                "false".to_string(),
            )])),
            labels: Some(HashMap::from([(
                NETWORK_LABEL.to_string(),
                LAYOUT.to_string(),
            )])),
            ..Default::default()
        })
        .await;
    let created = match created {
        Ok(c) => c,
        Err(e) => {
            drop(lock);
            if crate::error::is_connection_error(&e) {
                return Err(crate::error::api(
                    format!("create network {NETWORK_NAME}"),
                    e,
                ));
            }
            // A daemon that cannot make such a bridge (a network plugin)
            // cannot isolate sandboxes from each other.
            return Err(net_error(format!(
                "this daemon cannot create a bridge network with {ICC_OPTION}=false ({e}); \
                 without it sandboxes could reach each other: use network none"
            )));
        }
    };
    // Some daemons (Podman) create the network but drop the option, with
    // only a warning: such a network would not isolate anything.
    let made = docker
        .inspect_network(
            &created.id,
            None::<bollard::query_parameters::InspectNetworkOptions>,
        )
        .await
        .map_err(|e| crate::error::api(format!("inspect network {NETWORK_NAME}"), e))?;
    let honoured = made
        .options
        .as_ref()
        .and_then(|o| o.get(ICC_OPTION))
        .map(String::as_str)
        == Some("false");
    if !honoured {
        if let Err(e) = docker.remove_network(&created.id).await {
            tracing::warn!(network = %created.id, error = %e, "removing the network this daemon made without isolation failed");
        }
        drop(lock);
        return Err(net_error(format!(
            "this daemon does not honour {ICC_OPTION}=false{} (Podman does not); \
             sandboxes with network would reach each other, so corral makes none: \
             use network none on this daemon",
            if created.warning.is_empty() {
                String::new()
            } else {
                format!(": it answered \"{}\"", created.warning)
            }
        )));
    }
    tracing::info!(
        network = NETWORK_NAME,
        "created the sandbox network (inter-container communication off)"
    );
    let found = find(docker).await;
    drop(lock);
    found?.ok_or_else(|| net_error("created, but the daemon does not list it".into()))
}

fn net_error(reason: String) -> Error {
    Error::Network {
        network: NETWORK_NAME.to_string(),
        reason,
    }
}

/// corral's network when it exists and is fit for use, `None` when it does
/// not exist yet (it is made for the first sandbox with network); an error
/// when a network of that name exists but is not corral's or not isolated.
pub async fn find(docker: &Docker) -> Result<Option<NetworkInfo>, Error> {
    let filters = HashMap::from([("name".to_string(), vec![NETWORK_NAME.to_string()])]);
    let opts = ListNetworksOptionsBuilder::default()
        .filters(&filters)
        .build();
    let list = docker
        .list_networks(Some(opts))
        .await
        .map_err(|e| crate::error::api(format!("list networks named {NETWORK_NAME}"), e))?;
    // The daemon's name filter matches substrings.
    let mut named: Vec<Network> = list
        .into_iter()
        .filter(|n| n.name.as_deref() == Some(NETWORK_NAME))
        .collect();
    if named.is_empty() {
        return Ok(None);
    }
    named.sort_by(|a, b| a.id.cmp(&b.id));
    for n in &named {
        check(n).map_err(net_error)?;
    }
    if named.len() > 1 {
        tracing::debug!(
            count = named.len(),
            "several networks named {NETWORK_NAME}; using the one with the smallest id"
        );
    }
    let n = &named[0];
    let configs = n
        .ipam
        .as_ref()
        .and_then(|i| i.config.clone())
        .unwrap_or_default();
    Ok(Some(NetworkInfo {
        id: n.id.clone().unwrap_or_default(),
        subnets: configs.iter().filter_map(|c| c.subnet.clone()).collect(),
        gateways: configs.iter().filter_map(|c| c.gateway.clone()).collect(),
    }))
}

/// Why `n` (named like corral's network) cannot be used, if it cannot.
pub fn check(n: &Network) -> Result<(), String> {
    let id = n.id.as_deref().unwrap_or("?");
    let short = &id[..id.len().min(12)];
    let labels = n.labels.clone().unwrap_or_default();
    if !labels.contains_key(NETWORK_LABEL) {
        return Err(format!(
            "a network of this name (id {short}) exists but corral did not make it \
             (no {NETWORK_LABEL} label); corral will not use or remove it: \
             rename or remove it (`docker network rm {NETWORK_NAME}`)"
        ));
    }
    let driver = n.driver.as_deref().unwrap_or("");
    if driver != "bridge" {
        return Err(format!(
            "network {short} has driver '{driver}', corral needs 'bridge'"
        ));
    }
    let icc = n
        .options
        .as_ref()
        .and_then(|o| o.get(ICC_OPTION))
        .map(String::as_str);
    if icc != Some("false") {
        return Err(format!(
            "network {short} has option {ICC_OPTION}={}, corral needs 'false' so sandboxes \
             cannot reach each other; remove it (`docker network rm {NETWORK_NAME}`) and \
             corral makes a new one",
            icc.unwrap_or("(unset)")
        ));
    }
    if n.internal == Some(true) {
        return Err(format!(
            "network {short} is internal (no route outside), corral needs a network that \
             reaches outside"
        ));
    }
    Ok(())
}

/// This process's per-user runtime directory
/// (`corral_core::paths::user_runtime_dir`).
pub(crate) fn user_runtime_dir() -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(0);
    corral_core::paths::user_runtime_dir(
        std::env::var_os("XDG_RUNTIME_DIR")
            .as_deref()
            .map(std::path::Path::new),
        &std::env::temp_dir(),
        uid,
    )
}

/// This process's per-user runtime directory, made 0700 when missing and
/// checked when it exists ([`owned_dir`]). Its name in a shared `/tmp`
/// (`/tmp/corral-<uid>`, when `XDG_RUNTIME_DIR` is unset) can be taken
/// first by another user, and what corral keeps there (the network lock,
/// the deltas forks mount) must be its own.
pub(crate) fn owned_runtime_dir() -> std::io::Result<PathBuf> {
    let dir = user_runtime_dir();
    owned_dir(&dir)?;
    Ok(dir)
}

/// Makes `dir` 0700 when missing; one that exists must be a directory (not
/// a symlink) of this user's that no one else may write to. Refused,
/// never changed: corral does not chmod what it did not make.
fn owned_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    let me = std::fs::metadata("/proc/self")?.uid();
    let why = if !meta.is_dir() {
        "is not a directory (a symlink?)".to_string()
    } else if meta.uid() != me {
        format!("belongs to uid {}, not to this user (uid {me})", meta.uid())
    } else if meta.mode() & 0o022 != 0 {
        format!(
            "has mode {:04o}: others may write to it",
            meta.mode() & 0o7777
        )
    } else {
        return Ok(());
    };
    Err(std::io::Error::new(
        std::io::ErrorKind::PermissionDenied,
        format!(
            "the per-user runtime directory {} {why}: corral keeps nothing there (set \
             XDG_RUNTIME_DIR to a directory of this user's)",
            dir.display()
        ),
    ))
}

/// Takes the per-user lock that serialises creating the network; `None`
/// when no lock file can be had (creation then just goes ahead).
fn lock_file() -> Option<std::fs::File> {
    let dir = match owned_runtime_dir() {
        Ok(dir) => dir,
        Err(e) => {
            tracing::warn!(error = %e, "no network lock: concurrent corral processes may race to create the network");
            return None;
        }
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("network.lock"))
        .ok()?;
    let until = Instant::now() + LOCK_WAIT;
    loop {
        match file.try_lock() {
            Ok(()) => return Some(file),
            Err(std::fs::TryLockError::WouldBlock) if Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(_) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A runtime directory another user made first (or one others may
    /// write to, or a symlink) is refused and left as it is.
    #[test]
    fn a_runtime_directory_not_this_users_own_is_refused_and_left_alone() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let root =
            std::env::temp_dir().join(format!("corral-owned-{}-{nanos}", std::process::id()));
        let fresh = root.join("a/b");
        owned_dir(&fresh).expect("made");
        assert_eq!(
            std::fs::metadata(&fresh).expect("dir").mode() & 0o777,
            0o700
        );
        let open = root.join("open");
        std::fs::create_dir(&open).expect("mkdir");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        let e = owned_dir(&open).expect_err("writable by others");
        assert!(e.to_string().contains("mode 1777"), "{e}");
        assert_eq!(
            std::fs::metadata(&open).expect("dir").mode() & 0o7777,
            0o1777
        );
        let link = root.join("link");
        std::os::unix::fs::symlink(&fresh, &link).expect("symlink");
        assert!(owned_dir(&link)
            .expect_err("a symlink")
            .to_string()
            .contains("symlink"));
        let me = std::fs::metadata("/proc/self").expect("self").uid();
        if me == 0 {
            let theirs = root.join("theirs");
            std::fs::create_dir(&theirs).expect("mkdir");
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).expect("chown");
            let e = owned_dir(&theirs).expect_err("another user's");
            assert!(e.to_string().contains("uid 65534"), "{e}");
            assert_eq!(std::fs::metadata(&theirs).expect("dir").uid(), 65534);
        }
        std::fs::remove_dir_all(&root).expect("cleanup");
    }

    fn net(labels: &[(&str, &str)], driver: &str, icc: Option<&str>) -> Network {
        Network {
            id: Some("0123456789abcdef".into()),
            name: Some(NETWORK_NAME.into()),
            driver: Some(driver.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            options: icc.map(|v| HashMap::from([(ICC_OPTION.to_string(), v.to_string())])),
            ..Default::default()
        }
    }

    #[test]
    fn only_corrals_isolated_bridge_passes() {
        let ours = [(NETWORK_LABEL, "1")];
        assert_eq!(check(&net(&ours, "bridge", Some("false"))), Ok(()));
        let e = check(&net(&[], "bridge", Some("false"))).expect_err("not ours");
        assert!(e.contains("did not make it"), "{e}");
        let e = check(&net(&ours, "bridge", Some("true"))).expect_err("icc on");
        assert!(e.contains(&format!("{ICC_OPTION}=true")), "{e}");
        let e = check(&net(&ours, "bridge", None)).expect_err("icc default");
        assert!(e.contains("(unset)"), "{e}");
        let e = check(&net(&ours, "macvlan", Some("false"))).expect_err("driver");
        assert!(e.contains("'macvlan'"), "{e}");
        let mut internal = net(&ours, "bridge", Some("false"));
        internal.internal = Some(true);
        assert!(check(&internal).is_err());
    }
}
