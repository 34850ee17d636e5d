//! Turns a validated [`SandboxSpec`] into the daemon's container-create body.
//!
//! Pure: no daemon calls, so the hardening it applies is unit-tested here
//! and checked for real (inside a container) by the integration tests.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bollard::models::{
    ContainerCreateBody, HostConfig, HostConfigLogConfig, Mount, MountType, MountVolumeOptions,
    MountVolumeOptionsDriverConfig,
};
use corral_core::labels;
use corral_core::protocol::{AGENT_DIR, AGENT_PATH};
use corral_core::spec::{GVISOR_LIVE_RUNTIME, GVISOR_RUNTIME};
use corral_core::{Isolation, Network, SandboxSpec, SpecError};

/// Everything besides the spec that goes into a container.
pub struct CreateParams<'a> {
    /// The sandbox id (label value and name suffix).
    pub sandbox_id: &'a str,
    /// The runtime's labels: sandbox id, owner, and for a persistent
    /// sandbox its session, spec digest and seal.
    pub labels: &'a HashMap<String, String>,
    /// Variables PID 1 is started with besides the image's (the request's
    /// `agent_env`). Never the spec's environment: whatever is here shows in
    /// `docker inspect` and is copied into a snapshot image.
    pub env: Vec<(String, String)>,
    /// The volume holding the agent binary.
    pub agent_volume: &'a str,
    /// Whether the daemon honours `--storage-opt size=`.
    pub storage_opt_supported: bool,
    /// The network a sandbox with network access joins (corral's isolated
    /// bridge, by id, or its own internal egress network); unused for
    /// `network: none`.
    pub network: &'a str,
    /// The resolver the sandbox uses (its egress gateway's address), for a
    /// sandbox with an egress policy.
    pub dns: Option<&'a str>,
    /// The host directory of shared deltas ([`corral_core::Backend::shared_deltas`]),
    /// mounted read-only into a sandbox that resets in place.
    pub shared_deltas: Option<&'a std::path::Path>,
    /// The `pid_max` of the host the daemon runs on (or
    /// [`corral_core::spec::DEFAULT_HOST_PID_MAX`] when not known), which
    /// bounds a gVisor sandbox's pids limit.
    pub host_pid_max: i64,
    /// Whether the daemon has [`GVISOR_LIVE_RUNTIME`], which gVisor
    /// sandboxes without network then run under.
    pub live_runtime: bool,
}

/// The host-side helper directories of a `nosuid` mount of `host`: an
/// empty lower layer and the overlay's work directory, in
/// `.corral-overlay` beside it (the work directory must be on the same
/// filesystem as the upper layer, and outside it).
pub fn overlay_dirs(host: &str) -> (PathBuf, PathBuf) {
    let path = Path::new(host.trim_end_matches('/'));
    let parent = path.parent().unwrap_or(Path::new("/"));
    let base = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "root".into());
    let helper = parent.join(".corral-overlay");
    (helper.join("empty"), helper.join(format!("{base}.work")))
}

/// A bind mount whose setuid bits and device files have no effect: a
/// `local`-driver volume mounting an overlay with `nosuid,nodev` whose upper
/// layer is the host directory (a `type=none,o=bind,nosuid` volume does
/// not work: the kernel ignores those flags on a bind, and Docker only
/// remounts read-only binds). Anonymous, so removing the container
/// (`v=true`) removes the volume; the host directory is untouched.
fn nosuid_mount(m: &corral_core::Mount, sandbox_id: &str) -> Mount {
    let (lower, work) = overlay_dirs(&m.host);
    let host = match m.host.trim_end_matches('/') {
        "" => "/",
        h => h,
    };
    let o = if m.read_only {
        // Two lower layers and no upper: a read-only overlay.
        format!("lowerdir={host}:{},nosuid,nodev,ro", lower.display())
    } else {
        format!(
            "lowerdir={},upperdir={host},workdir={},nosuid,nodev",
            lower.display(),
            work.display()
        )
    };
    Mount {
        target: Some(m.container.clone()),
        typ: Some(MountType::VOLUME),
        // Docker refuses read-only anonymous volumes; a read-only nosuid
        // mount is read-only by its overlay's own `ro` option.
        read_only: Some(false),
        volume_options: Some(MountVolumeOptions {
            // Never copy the image's files at the target into the host dir.
            no_copy: Some(true),
            labels: Some(HashMap::from([
                (labels::SANDBOX.to_string(), sandbox_id.to_string()),
                (labels::VOLUME.to_string(), "mount".to_string()),
            ])),
            driver_config: Some(MountVolumeOptionsDriverConfig {
                name: Some("local".into()),
                options: Some(HashMap::from([
                    ("type".to_string(), "overlay".to_string()),
                    ("device".to_string(), "overlay".to_string()),
                    ("o".to_string(), o),
                ])),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The container name for a sandbox.
pub fn container_name(sandbox_id: &str) -> String {
    format!("corral-{sandbox_id}")
}

/// The prefix of the name of a sandbox's container while its session is
/// paused to disk (`Backend::mark_paused`): what every corral on the host
/// reads as "keep it".
pub const PAUSED_NAME_PREFIX: &str = "corral-paused-";

/// The container name for a sandbox of a session paused to disk.
pub fn paused_container_name(sandbox_id: &str) -> String {
    format!("{PAUSED_NAME_PREFIX}{sandbox_id}")
}

/// What the agent of a sandbox that resets in place needs on top.
pub const PRISTINE_CAPS: [&str; 3] = corral_core::spec::PRISTINE_AGENT_CAPS;

/// What PID 1 needs to split into a door and an agent in a PID namespace
/// of its own ([`SandboxSpec::agent_pid_namespace`]); dropped by the agent
/// before anything runs.
pub const PID_NAMESPACE_CAP: &str = "SYS_ADMIN";

/// PID 1's command line.
fn entrypoint(spec: &SandboxSpec, pristine: bool) -> Vec<String> {
    let mut args = vec![
        AGENT_PATH.to_string(),
        "init".to_string(),
        "--grace-ms".to_string(),
        // A persistent sandbox outlives its owner: no dead-man switch.
        spec.effective_grace_ms().to_string(),
    ];
    let own = spec.security.agent_only_caps();
    if !own.is_empty() {
        args.extend(["--agent-caps".into(), own.join(",")]);
    }
    if let Some(n) = spec.command_nproc() {
        args.extend(["--nproc".into(), n.to_string()]);
    }
    if spec.agent_pid_namespace() {
        args.push("--pid-ns".into());
    }
    if pristine {
        args.push("--pristine".into());
        if let Some(size) = spec.pristine_state_size() {
            args.extend(["--pristine-size".into(), size.to_string()]);
        }
    }
    args
}

/// The create body for `spec`; refused naming `limits.pids` when the
/// host cannot give the tier its pids limit
/// ([`SandboxSpec::engine_pids_limit`]).
pub fn create_body(
    spec: &SandboxSpec,
    p: &CreateParams<'_>,
) -> Result<ContainerCreateBody, SpecError> {
    let pids_limit = spec.engine_pids_limit(p.host_pid_max)?;
    let mut labels: HashMap<String, String> = spec
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.extend(p.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    labels.insert(labels::SANDBOX.into(), p.sandbox_id.into());
    labels.insert(labels::VERSION.into(), env!("CARGO_PKG_VERSION").into());

    // A sandbox that could make the mount writable gets its own copy
    // (`agent_volume::private_volume_name`), filled before the start and
    // removed with the container: it only ever reaches its own agent.
    let agent_source = if crate::agent_volume::needs_private_copy(spec) {
        crate::agent_volume::private_volume_name(p.sandbox_id)
    } else {
        p.agent_volume.to_string()
    };
    let mut mounts = vec![Mount {
        target: Some(AGENT_DIR.into()),
        source: Some(agent_source),
        typ: Some(MountType::VOLUME),
        read_only: Some(true),
        ..Default::default()
    }];
    // Deltas are shared only with a sandbox that resets in place (its
    // agent takes the mount from its commands at start) and that no
    // capability lets reach a read-only mount's writable side.
    if let Some(dir) = p
        .shared_deltas
        .filter(|_| spec.in_place_reset().is_ok() && !crate::agent_volume::needs_private_copy(spec))
    {
        mounts.push(Mount {
            target: Some(corral_core::protocol::SHARED_DELTAS_DIR.into()),
            source: Some(dir.display().to_string()),
            typ: Some(MountType::BIND),
            read_only: Some(true),
            ..Default::default()
        });
    }
    mounts.extend(spec.mounts.iter().map(|m| {
        if m.nosuid {
            return nosuid_mount(m, p.sandbox_id);
        }
        Mount {
            target: Some(m.container.clone()),
            source: Some(m.host.clone()),
            typ: Some(MountType::BIND),
            read_only: Some(m.read_only),
            ..Default::default()
        }
    }));

    let tmpfs: HashMap<String, String> = spec
        .tmpfs
        .iter()
        .map(|t| {
            let mut opts = format!("size={}", t.size);
            if !t.options.is_empty() {
                opts = format!("{},{opts}", t.options);
            }
            // Docker mounts tmpfs noexec unless told otherwise; a mount
            // whose options do not ask for noexec is meant to run programs.
            if !t.options.split(',').any(|o| o.trim() == "noexec") {
                opts = format!("exec,{opts}");
            }
            (t.path.clone(), opts)
        })
        .collect();

    let sec = &spec.security;
    let pristine = spec.in_place_reset().is_ok();
    let mut security_opt = Vec::new();
    if sec.no_new_privileges {
        security_opt.push("no-new-privileges:true".to_string());
    }

    let memory = spec.limits.memory.map(|m| m as i64);
    let storage_opt = match spec.limits.disk {
        Some(d) if p.storage_opt_supported => {
            Some(HashMap::from([("size".to_string(), d.to_string())]))
        }
        _ => None,
    };

    let host_config = HostConfig {
        memory,
        // Swap equal to memory: no swap, so exceeding the limit is an OOM.
        memory_swap: memory,
        nano_cpus: spec.limits.cpus.map(|c| (c * 1e9) as i64),
        pids_limit,
        cap_drop: sec.drop_all_caps.then(|| vec!["ALL".to_string()]),
        cap_add: {
            // Commands' and the agent's own (which commands drop:
            // `--agent-caps`, corral-agent's `caps`); with every one of
            // the daemon's defaults when not all are dropped.
            let mut caps = if sec.drop_all_caps {
                sec.container_caps()
            } else {
                Vec::new()
            };
            if pristine {
                // The agent's alone: commands drop them (corral-agent's
                // `pristine` and `confine`).
                caps.extend(PRISTINE_CAPS.iter().map(|c| c.to_string()));
            }
            if spec.agent_pid_namespace() {
                // To mount the commands' /proc; the agent drops it from
                // every set, the bounding set included, before anything
                // runs (corral-agent's `door`).
                caps.push(PID_NAMESPACE_CAP.to_string());
            }
            caps.sort();
            caps.dedup();
            (sec.drop_all_caps || !caps.is_empty()).then_some(caps)
        },
        security_opt: (!security_opt.is_empty()).then_some(security_opt),
        readonly_rootfs: Some(sec.read_only_root),
        tmpfs: (!tmpfs.is_empty()).then_some(tmpfs),
        mounts: Some(mounts),
        network_mode: Some(match spec.network {
            Network::None => "none".to_string(),
            // Never the daemon's default bridge: there sandboxes reach each other.
            Network::Bridge => p.network.to_string(),
            // Its own internal network: no route out but the gateway.
            Network::Egress(_) => p.network.to_string(),
        }),
        dns: p.dns.map(|d| vec![d.to_string()]),
        runtime: match spec.isolation {
            Isolation::Container => spec.runtime.clone(),
            Isolation::Gvisor if p.live_runtime && spec.network == Network::None => {
                Some(GVISOR_LIVE_RUNTIME.to_string())
            }
            Isolation::Gvisor => Some(GVISOR_RUNTIME.to_string()),
        },
        storage_opt,
        // Never auto-remove: it destroys the state that tells an OOM of PID 1.
        auto_remove: Some(false),
        // PID 1's stdout is the control stream: logging it would write every
        // frame to disk.
        log_config: Some(HostConfigLogConfig {
            typ: Some("none".into()),
            config: None,
        }),
        init: Some(false),
        ..Default::default()
    };

    Ok(ContainerCreateBody {
        image: Some(spec.image.clone()),
        entrypoint: Some(entrypoint(spec, pristine)),
        cmd: Some(Vec::new()),
        env: Some(p.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
        working_dir: spec.workdir.clone(),
        user: sec.user.clone(),
        labels: Some(labels),
        network_disabled: Some(false),
        attach_stdin: Some(false),
        attach_stdout: Some(false),
        attach_stderr: Some(false),
        tty: Some(false),
        // PID 1's stdin is the control stream, kept open across attaches.
        open_stdin: Some(true),
        stdin_once: Some(false),
        stop_signal: Some("SIGTERM".into()),
        // The agent forwards SIGTERM to every process but never stops on a
        // signal (a command could forge one); the daemon's SIGKILL ends the
        // sandbox this long after `docker stop`.
        stop_timeout: Some(2),
        host_config: Some(host_config),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_core::labels::Owner;
    use corral_core::Mount as SpecMount;

    /// The labels the runtime passes: sandbox id and owner.
    fn owner_labels(owner: &Owner) -> HashMap<String, String> {
        [(labels::SANDBOX.to_string(), "sb-1".to_string())]
            .into_iter()
            .chain(owner.labels())
            .collect()
    }

    fn params<'a>(labels: &'a HashMap<String, String>) -> CreateParams<'a> {
        CreateParams {
            sandbox_id: "sb-1",
            labels,
            env: vec![("A".into(), "1".into())],
            agent_volume: "corral-agent-x",
            storage_opt_supported: false,
            network: "net-id",
            dns: None,
            shared_deltas: None,
            host_pid_max: corral_core::spec::DEFAULT_HOST_PID_MAX,
            live_runtime: false,
        }
    }

    #[test]
    fn gvisor_without_network_runs_where_it_can_be_checkpointed() {
        let owner = owner_labels(&Owner {
            host: "h".into(),
            pid: 1,
            start: 1,
        });
        let runtime = |network: Network, live_runtime: bool| {
            let mut spec = SandboxSpec::new("img");
            spec.isolation = Isolation::Gvisor;
            spec.network = network;
            let p = CreateParams {
                live_runtime,
                ..params(&owner)
            };
            create_body(&spec, &p)
                .expect("body")
                .host_config
                .and_then(|h| h.runtime)
        };
        assert_eq!(
            runtime(Network::None, true).as_deref(),
            Some(GVISOR_LIVE_RUNTIME)
        );
        // Without the runtime, or with network (the host stack), plain runsc.
        assert_eq!(
            runtime(Network::None, false).as_deref(),
            Some(GVISOR_RUNTIME)
        );
        assert_eq!(
            runtime(Network::Bridge, true).as_deref(),
            Some(GVISOR_RUNTIME)
        );
    }

    #[test]
    fn a_gvisor_sandbox_that_starts_as_root_splits_pid1_behind_a_door() {
        let owner = owner_labels(&Owner {
            host: "h".into(),
            pid: 1,
            start: 2,
        });
        let split = |spec: &SandboxSpec| {
            let body = create_body(spec, &params(&owner)).expect("body");
            let entry = body.entrypoint.expect("entrypoint");
            let caps = body.host_config.and_then(|h| h.cap_add);
            (entry.contains(&"--pid-ns".to_string()), caps)
        };
        let mut spec = SandboxSpec::new("img");
        let (door, caps) = split(&spec);
        assert!(!door, "runc keeps its uids alone");
        assert!(!caps.expect("caps").contains(&PID_NAMESPACE_CAP.to_string()));
        spec.isolation = Isolation::Gvisor;
        let (door, caps) = split(&spec);
        assert!(door);
        assert!(caps.expect("caps").contains(&PID_NAMESPACE_CAP.to_string()));
        // With the daemon's default capabilities, it alone is added.
        spec.security.drop_all_caps = false;
        let (door, caps) = split(&spec);
        assert!(door);
        assert_eq!(caps, Some(vec![PID_NAMESPACE_CAP.to_string()]));
        // A sandbox that starts as a user cannot split (and says so in
        // its result_integrity).
        spec.security.drop_all_caps = true;
        spec.security.user = Some("1000:1000".into());
        let (door, caps) = split(&spec);
        assert!(!door);
        assert!(!caps.expect("caps").contains(&PID_NAMESPACE_CAP.to_string()));
        assert!(spec.result_integrity().is_err());
    }

    #[test]
    fn a_pristine_sandbox_gives_its_agent_the_reset_capabilities() {
        let owner = owner_labels(&Owner {
            host: "h".into(),
            pid: 1,
            start: 2,
        });
        let mut spec = SandboxSpec::new("img");
        spec.limits.memory = Some(64 << 20);
        let plain = create_body(&spec, &params(&owner)).expect("body");
        spec.pristine = true;
        let body = create_body(&spec, &params(&owner)).expect("body");
        let caps = body.host_config.and_then(|h| h.cap_add).expect("caps");
        for cap in PRISTINE_CAPS {
            assert!(caps.contains(&cap.to_string()), "{caps:?}");
        }
        let entry = body.entrypoint.expect("entrypoint");
        assert!(entry.ends_with(&[
            "--pristine".to_string(),
            "--pristine-size".to_string(),
            (64u64 << 20).to_string()
        ]));
        assert!(!plain
            .entrypoint
            .expect("entrypoint")
            .contains(&"--pristine".to_string()));
        // A spec that cannot reset in place gets nothing extra.
        spec.security.read_only_root = true;
        let body = create_body(&spec, &params(&owner)).expect("body");
        let caps = body.host_config.and_then(|h| h.cap_add).expect("caps");
        assert!(!caps.contains(&"SYS_ADMIN".to_string()), "{caps:?}");
        assert!(!body
            .entrypoint
            .expect("entrypoint")
            .contains(&"--pristine".to_string()));
    }

    #[test]
    fn shared_deltas_are_mounted_read_only_into_pristine_sandboxes_alone() {
        let owner = owner_labels(&Owner {
            host: "h".into(),
            pid: 1,
            start: 2,
        });
        let dir = std::path::Path::new("/run/c/deltas");
        let shared = |spec: &SandboxSpec| {
            let body = create_body(
                spec,
                &CreateParams {
                    shared_deltas: Some(dir),
                    ..params(&owner)
                },
            )
            .expect("body");
            body.host_config
                .and_then(|h| h.mounts)
                .unwrap_or_default()
                .into_iter()
                .filter(|m| m.target.as_deref() == Some(corral_core::protocol::SHARED_DELTAS_DIR))
                .collect::<Vec<_>>()
        };
        let mut spec = SandboxSpec::new("img");
        assert!(shared(&spec).is_empty(), "not pristine");
        spec.pristine = true;
        let mounts = shared(&spec);
        assert_eq!(mounts.len(), 1, "{mounts:?}");
        assert_eq!(mounts[0].source.as_deref(), Some("/run/c/deltas"));
        assert_eq!(mounts[0].read_only, Some(true));
        assert_eq!(mounts[0].typ, Some(MountType::BIND));
        // A capability that could reach a read-only mount's writable side.
        spec.security.cap_add = vec!["DAC_READ_SEARCH".into()];
        assert!(shared(&spec).is_empty(), "granted DAC_READ_SEARCH");
    }

    #[test]
    fn the_agent_alone_holds_what_it_needs_to_run_commands_under_other_uids() {
        let owner = owner_labels(&Owner {
            host: "h".into(),
            pid: 1,
            start: 2,
        });
        let mut spec = SandboxSpec::new("img");
        let plain = create_body(&spec, &params(&owner)).expect("body");
        let entry = plain.entrypoint.expect("entrypoint");
        let at = entry
            .iter()
            .position(|a| a == "--agent-caps")
            .expect("--agent-caps");
        assert_eq!(entry[at + 1], "KILL,SETGID,SETPCAP,SETUID");
        let caps = plain.host_config.and_then(|h| h.cap_add).expect("caps");
        for cap in ["KILL", "SETPCAP", "SETUID", "SETGID"] {
            assert!(caps.contains(&cap.to_string()), "{caps:?}");
        }
        // With setuid_caps commands keep SETUID and SETGID: the agent
        // alone keeps only KILL and SETPCAP.
        spec.security.setuid_caps = true;
        let body = create_body(&spec, &params(&owner)).expect("body");
        let caps = body.host_config.and_then(|h| h.cap_add).expect("caps");
        for cap in ["KILL", "SETPCAP", "SETUID", "SETGID"] {
            assert!(caps.contains(&cap.to_string()), "{caps:?}");
        }
        let entry = body.entrypoint.expect("entrypoint");
        let at = entry
            .iter()
            .position(|a| a == "--agent-caps")
            .expect("--agent-caps");
        assert_eq!(entry[at + 1], "KILL,SETPCAP");
    }

    #[test]
    fn under_gvisor_the_process_limit_moves_inside_the_sandbox() {
        let owner = owner_labels(&Owner {
            host: "h".into(),
            pid: 1,
            start: 2,
        });
        let mut spec = SandboxSpec::new("img");
        let runc = create_body(&spec, &params(&owner)).expect("body");
        assert_eq!(runc.host_config.expect("hc").pids_limit, Some(256));
        assert!(!runc
            .entrypoint
            .expect("entrypoint")
            .contains(&"--nproc".to_string()));

        spec.isolation = corral_core::Isolation::Gvisor;
        let body = create_body(&spec, &params(&owner)).expect("body");
        let hc = body.host_config.expect("hc");
        assert_eq!(hc.runtime.as_deref(), Some(GVISOR_RUNTIME));
        // gVisor's own host tasks fit: it stops when it cannot make one.
        assert_eq!(
            hc.pids_limit,
            Some(
                256 * corral_core::spec::GVISOR_HOST_TASKS_PER_PROCESS
                    + corral_core::spec::GVISOR_KERNEL_TASKS
            )
        );
        let entry = body.entrypoint.expect("entrypoint");
        let at = entry.iter().position(|a| a == "--nproc").expect("--nproc");
        assert_eq!(entry[at + 1], "256");

        // A limit gVisor cannot be given within the host's pids, or none,
        // is refused naming the field.
        for pids in [Some(4096), None] {
            spec.limits.pids = pids;
            let e = create_body(&spec, &params(&owner)).expect_err("refused");
            assert_eq!(e.field, "limits.pids", "{e}");
        }
        let roomy = CreateParams {
            host_pid_max: 1 << 22,
            ..params(&owner)
        };
        spec.limits.pids = Some(4096);
        let hc = create_body(&spec, &roomy).expect("body").host_config;
        assert_eq!(hc.expect("hc").pids_limit, Some(4096 * 16 + 128));
    }

    #[test]
    fn hardened_defaults_reach_the_daemon() {
        let owner = Owner {
            host: "h".into(),
            pid: 1,
            start: 2,
        };
        let owner = owner_labels(&owner);
        let mut spec = SandboxSpec::new("img");
        spec.limits.memory = Some(64 << 20);
        spec.limits.disk = Some(1 << 30);
        spec.network = Network::None;
        spec.mounts.push(SpecMount {
            host: "/srv".into(),
            container: "/data".into(),
            read_only: true,
            nosuid: false,
        });
        let body = create_body(&spec, &params(&owner)).expect("body");
        let hc = body.host_config.expect("host config");
        assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
        // The commands' three, and the agent's own four (which commands
        // drop: `--agent-caps`).
        assert_eq!(
            hc.cap_add,
            Some(
                [
                    "CHOWN",
                    "DAC_OVERRIDE",
                    "FOWNER",
                    "KILL",
                    "SETGID",
                    "SETPCAP",
                    "SETUID"
                ]
                .map(String::from)
                .to_vec()
            )
        );
        assert_eq!(
            hc.security_opt,
            Some(vec!["no-new-privileges:true".to_string()])
        );
        assert_eq!(hc.memory, Some(64 << 20));
        assert_eq!(hc.memory_swap, hc.memory);
        assert_eq!(hc.pids_limit, Some(256));
        assert_eq!(hc.nano_cpus, Some(1_000_000_000));
        assert_eq!(hc.network_mode.as_deref(), Some("none"));
        spec.network = Network::Bridge;
        let bridged = create_body(&spec, &params(&owner))
            .expect("body")
            .host_config
            .expect("hc");
        assert_eq!(
            bridged.network_mode.as_deref(),
            Some("net-id"),
            "corral's isolated network, never the default bridge"
        );
        assert_eq!(hc.auto_remove, Some(false));
        // Unsupported disk limits never reach the daemon silently.
        assert_eq!(hc.storage_opt, None);
        let tmpfs = hc.tmpfs.expect("tmpfs");
        assert_eq!(
            tmpfs["/run"],
            format!("noexec,nosuid,nodev,size={}", 64 << 20)
        );
        // /tmp runs programs (Docker's tmpfs default would be noexec).
        assert_eq!(
            tmpfs["/tmp"],
            format!("exec,nosuid,nodev,size={}", 512 << 20)
        );
        let mounts = hc.mounts.expect("mounts");
        assert_eq!(mounts[1].typ, Some(MountType::BIND));
        assert_eq!(mounts[0].target.as_deref(), Some(AGENT_DIR));
        assert_eq!(mounts[0].read_only, Some(true));
        assert_eq!(mounts[1].source.as_deref(), Some("/srv"));
        let labels = body.labels.expect("labels");
        assert_eq!(labels[labels::SANDBOX], "sb-1");
        assert_eq!(labels[labels::OWNER_PID], "1");
        assert_eq!(body.env, Some(vec!["A=1".to_string()]));
        assert_eq!(body.entrypoint.expect("entrypoint")[0], AGENT_PATH);
    }

    #[test]
    fn nosuid_mounts_are_overlays_with_the_host_dir_as_upper_layer() {
        let owner = Owner {
            host: "h".into(),
            pid: 1,
            start: 2,
        };
        let owner = owner_labels(&owner);
        let mut spec = SandboxSpec::new("img");
        spec.mounts.push(SpecMount {
            host: "/srv/s/workspace".into(),
            container: "/workspace".into(),
            read_only: false,
            nosuid: true,
        });
        spec.mounts.push(SpecMount {
            host: "/srv/ro/".into(),
            container: "/ro".into(),
            read_only: true,
            nosuid: true,
        });
        let mut sealed = owner.clone();
        sealed.insert(labels::SPEC_DIGEST.into(), "digest".into());
        sealed.insert(labels::SEAL.into(), "seal".into());
        let p = params(&sealed);
        let body = create_body(&spec, &p).expect("body");
        let labels = body.labels.expect("labels");
        assert_eq!(labels[labels::SEAL], "seal");
        assert_eq!(labels[labels::SPEC_DIGEST], "digest");
        let mounts = body.host_config.expect("hc").mounts.expect("mounts");
        let rw = &mounts[1];
        assert_eq!(rw.typ, Some(MountType::VOLUME));
        assert_eq!(rw.source, None, "anonymous: removed with the container");
        let vo = rw.volume_options.as_ref().expect("volume options");
        assert_eq!(vo.no_copy, Some(true));
        assert_eq!(vo.labels.as_ref().expect("labels")[labels::SANDBOX], "sb-1");
        let opts = vo
            .driver_config
            .as_ref()
            .and_then(|d| d.options.clone())
            .expect("driver options");
        assert_eq!(opts["type"], "overlay");
        assert_eq!(
            opts["o"],
            "lowerdir=/srv/s/.corral-overlay/empty,upperdir=/srv/s/workspace,\
             workdir=/srv/s/.corral-overlay/workspace.work,nosuid,nodev"
        );
        let ro = mounts[2]
            .volume_options
            .as_ref()
            .and_then(|v| v.driver_config.as_ref())
            .and_then(|d| d.options.clone())
            .expect("driver options");
        assert_eq!(
            ro["o"],
            "lowerdir=/srv/ro:/srv/.corral-overlay/empty,nosuid,nodev,ro"
        );
    }

    #[test]
    fn capabilities_that_can_remount_get_a_private_agent() {
        let owner = Owner {
            host: "h".into(),
            pid: 1,
            start: 2,
        };
        let owner = owner_labels(&owner);
        let mut spec = SandboxSpec::new("img");
        let shared = create_body(&spec, &params(&owner))
            .expect("body")
            .host_config
            .expect("hc");
        let m = &shared.mounts.expect("mounts")[0];
        assert_eq!(m.source.as_deref(), Some("corral-agent-x"));
        for cap in ["SYS_ADMIN", "cap_dac_read_search", "ALL"] {
            spec.security.cap_add = vec![cap.into()];
            let hc = create_body(&spec, &params(&owner))
                .expect("body")
                .host_config
                .expect("hc");
            let m = &hc.mounts.expect("mounts")[0];
            assert_eq!(
                m.source.as_deref(),
                Some("corral-agent-sb-1"),
                "{cap}: a volume of its own"
            );
            assert_eq!(m.read_only, Some(true));
        }
    }
}
