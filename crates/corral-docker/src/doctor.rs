//! `corral doctor`: what the daemon offers and which protections are in force.
//!
//! The daemon's own answers (version, runtimes, cgroup version, storage
//! driver) say what is possible; a probe sandbox says what actually holds, by
//! reading capabilities, no-new-privileges, cgroup limits and mounts from
//! inside a container made with the hardened defaults.

use std::time::Duration;

use corral_core::{CommandSpec, SandboxSpec};

use crate::error::DockerError;
use crate::DockerBackend;

/// One protection, checked from inside a sandbox.
#[derive(Debug, Clone, Default)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Whether it holds.
    pub ok: bool,
    /// What was seen.
    pub detail: String,
}

/// Everything `corral doctor` reports.
#[derive(Debug, Clone, Default)]
pub struct DoctorReport {
    /// Endpoint in use.
    pub endpoint: String,
    /// Daemon version.
    pub server_version: String,
    /// Daemon's API version.
    pub api_version: String,
    /// Daemon's operating system.
    pub os: String,
    /// Kernel version.
    pub kernel: String,
    /// cgroup version ("1" or "2").
    pub cgroup_version: String,
    /// cgroup driver.
    pub cgroup_driver: String,
    /// Storage driver.
    pub storage_driver: String,
    /// OCI runtimes the daemon knows.
    pub runtimes: Vec<String>,
    /// The default runtime.
    pub default_runtime: String,
    /// Daemon security options (seccomp, apparmor, userns, rootless...).
    pub security_options: Vec<String>,
    /// Whether `--storage-opt size=` works; `None` when not probed.
    pub storage_opt: Option<bool>,
    /// Size of the embedded agent binary.
    pub agent_bytes: usize,
    /// corral's sandbox network: present, made by corral, inter-container
    /// communication off.
    pub network: Check,
    /// Checks run inside a probe sandbox; empty when no image was given.
    pub protections: Vec<Check>,
}

const PROBE_SCRIPT: &str = r#"
grep -E '^(CapEff|NoNewPrivs):' /proc/self/status
echo "pids.max: $(cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max 2>/dev/null)"
echo "memory.max: $(cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max 2>/dev/null)"
echo "memsw.max: $(cat /sys/fs/cgroup/memory/memory.memsw.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.swap.max 2>/dev/null)"
grep -E '^[^ ]+ /(tmp|var/tmp|run) tmpfs ' /proc/mounts | sed 's/^/mount: /'
"#;

impl DockerBackend {
    /// Gathers the report; with `image`, also probes storage-opt support and
    /// the protections in force inside a default sandbox (the image needs
    /// `/bin/sh`).
    pub async fn doctor(&self, image: Option<&str>) -> Result<DoctorReport, DockerError> {
        let docker = self.docker();
        let version = docker
            .version()
            .await
            .map_err(|e| DockerError::api("daemon version", e))?;
        let info = docker
            .info()
            .await
            .map_err(|e| DockerError::api("daemon info", e))?;
        let mut runtimes: Vec<String> = info.runtimes.unwrap_or_default().into_keys().collect();
        runtimes.sort();
        let mut report = DoctorReport {
            endpoint: self.endpoint().to_string(),
            server_version: version.version.unwrap_or_default(),
            api_version: version.api_version.unwrap_or_default(),
            os: info.operating_system.unwrap_or_default(),
            kernel: info.kernel_version.unwrap_or_default(),
            cgroup_version: info
                .cgroup_version
                .map(|v| v.to_string())
                .unwrap_or_default(),
            cgroup_driver: info
                .cgroup_driver
                .map(|v| v.to_string())
                .unwrap_or_default(),
            storage_driver: info.driver.unwrap_or_default(),
            runtimes,
            default_runtime: info.default_runtime.unwrap_or_default(),
            security_options: info.security_options.unwrap_or_default(),
            storage_opt: None,
            agent_bytes: crate::agent_volume::AGENT_BINARY.len(),
            network: Check::default(),
            protections: Vec::new(),
        };
        let Some(image) = image else {
            report.network = self.network_check().await?;
            return Ok(report);
        };
        self.ensure_image(image).await?;
        report.storage_opt = Some(self.storage_opt_supported(image).await?);

        let spec = SandboxSpec::new(image);
        let sandbox = self.create(&spec).await?;
        let result = sandbox
            .run(&CommandSpec::shell(PROBE_SCRIPT).timeout(Duration::from_secs(30)))
            .await;
        if let Err(e) = sandbox.destroy().await {
            tracing::warn!(sandbox = sandbox.id(), error = %e, "removing the doctor's probe sandbox failed");
        }
        report.network = self.network_check().await?;
        if let Some(f) = result.failure {
            report.protections.push(Check {
                name: "probe sandbox".into(),
                ok: false,
                detail: f.to_string(),
            });
            return Ok(report);
        }
        report.protections = evaluate(&spec, &String::from_utf8_lossy(&result.stdout));
        Ok(report)
    }
}

impl DockerBackend {
    /// The state of corral's sandbox network, without creating it.
    async fn network_check(&self) -> Result<Check, DockerError> {
        use crate::network::{find, ICC_OPTION, NETWORK_NAME};
        let name = format!("network {NETWORK_NAME}");
        Ok(match find(self.docker()).await {
            Ok(Some(n)) => Check {
                name,
                ok: true,
                detail: format!(
                    "bridge {}, {ICC_OPTION}=false: sandboxes reach outside, not each other",
                    n.subnets.join(",")
                ),
            },
            Ok(None) => Check {
                name,
                ok: true,
                detail: "not made yet: created for the first sandbox with network".into(),
            },
            Err(DockerError::Network { reason, .. }) => Check {
                name,
                ok: false,
                detail: reason,
            },
            Err(e) => return Err(e),
        })
    }
}

fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .map(str::trim)
}

/// Capability bit numbers of the names corral adds back.
fn cap_bit(name: &str) -> Option<u32> {
    Some(match name {
        "CHOWN" => 0,
        "DAC_OVERRIDE" => 1,
        "DAC_READ_SEARCH" => 2,
        "FOWNER" => 3,
        "FSETID" => 4,
        "KILL" => 5,
        "SETGID" => 6,
        "SETUID" => 7,
        "SETPCAP" => 8,
        "NET_BIND_SERVICE" => 10,
        "NET_RAW" => 13,
        "SYS_CHROOT" => 18,
        "SYS_PTRACE" => 19,
        "SYS_ADMIN" => 21,
        "MKNOD" => 27,
        "AUDIT_WRITE" => 29,
        "SETFCAP" => 31,
        _ => return None,
    })
}

/// Judges the probe's output against what `spec` asked for.
pub fn evaluate(spec: &SandboxSpec, out: &str) -> Vec<Check> {
    let mut checks = Vec::new();
    let mut push = |name: &str, ok: bool, detail: String| {
        checks.push(Check {
            name: name.into(),
            ok,
            detail,
        })
    };
    let cap_eff = field(out, "CapEff:").and_then(|h| u64::from_str_radix(h, 16).ok());
    let expected: u64 = spec
        .security
        .effective_cap_add()
        .iter()
        .filter_map(|c| cap_bit(c))
        .fold(0, |m, b| m | (1 << b));
    push(
        "capabilities dropped",
        cap_eff.is_some_and(|c| c & !expected == 0),
        match cap_eff {
            Some(c) => format!(
                "effective set {c:#x}, allowed {expected:#x} ({})",
                spec.security.effective_cap_add().join(",")
            ),
            None => "CapEff not readable".into(),
        },
    );
    let nnp = field(out, "NoNewPrivs:");
    push(
        "no-new-privileges",
        nnp == Some("1"),
        format!("NoNewPrivs={}", nnp.unwrap_or("?")),
    );
    let pids = field(out, "pids.max:").unwrap_or("");
    let want_pids = spec
        .limits
        .pids
        .map(|p| p.to_string())
        .unwrap_or_else(|| "max".into());
    push(
        "pids limit",
        pids == want_pids,
        format!("pids.max={pids}, wanted {want_pids}"),
    );
    let mem = field(out, "memory.max:").and_then(|m| m.parse::<u64>().ok());
    push(
        "memory limit",
        spec.limits.memory.is_none() || mem == spec.limits.memory,
        format!("limit {mem:?}, wanted {:?}", spec.limits.memory),
    );
    let memsw = field(out, "memsw.max:").unwrap_or("");
    push(
        "no swap beyond memory",
        spec.limits.memory.is_none()
            || memsw.parse::<u64>().ok() == spec.limits.memory
            || memsw == "0",
        format!("memory+swap limit {memsw}"),
    );
    for t in &spec.tmpfs {
        let line = out
            .lines()
            .filter_map(|l| l.strip_prefix("mount: "))
            .find(|l| l.split_whitespace().nth(1) == Some(t.path.as_str()));
        let opts = line.and_then(|l| l.split_whitespace().nth(3)).unwrap_or("");
        let wanted: Vec<&str> = t.options.split(',').filter(|o| !o.is_empty()).collect();
        let ok = line.is_some() && wanted.iter().all(|w| opts.split(',').any(|o| o == *w));
        push(
            &format!("tmpfs {}", t.path),
            ok,
            if line.is_some() {
                format!("options {opts}")
            } else {
                "not mounted".into()
            },
        );
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judges_probe_output() {
        let spec = SandboxSpec::new("img");
        let out = "CapEff:\t000000000000000b\nNoNewPrivs:\t1\npids.max: 256\nmemory.max: 1073741824\nmemsw.max: 1073741824\n\
            mount: tmpfs /tmp tmpfs rw,nosuid,nodev,size=524288k 0 0\n\
            mount: tmpfs /var/tmp tmpfs rw,nosuid,nodev,noexec,size=262144k 0 0\n\
            mount: tmpfs /run tmpfs rw,nosuid,nodev,noexec,size=65536k 0 0\n";
        let checks = evaluate(&spec, out);
        assert!(checks.iter().all(|c| c.ok), "{checks:?}");
        let bad = out
            .replace("000000000000000b", "00000000a80425fb")
            .replace("NoNewPrivs:\t1", "NoNewPrivs:\t0");
        let checks = evaluate(&spec, &bad);
        let failed: Vec<_> = checks
            .iter()
            .filter(|c| !c.ok)
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(failed, ["capabilities dropped", "no-new-privileges"]);
    }
}
