//! The protections in force inside a sandbox, checked from inside one: a
//! probe sandbox made with the hardened defaults reads its capabilities,
//! no-new-privileges, cgroup limits and mounts, and [`evaluate`] judges
//! them against the spec. Whatever the backend, this says what holds.

use std::time::Duration;

use corral_core::backend::Check;
use corral_core::{CommandSpec, Error, SandboxSpec};

use crate::Runtime;

const PROBE_SCRIPT: &str = r#"
grep -E '^(CapEff|NoNewPrivs):' /proc/self/status
echo "pids.max: $(cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max 2>/dev/null)"
echo "memory.max: $(cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max 2>/dev/null)"
echo "memsw.max: $(cat /sys/fs/cgroup/memory/memory.memsw.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.swap.max 2>/dev/null)"
grep -E '^[^ ]+ /(tmp|var/tmp|run) tmpfs ' /proc/mounts | sed 's/^/mount: /'
"#;

/// Starts a sandbox of `spec` (its image needs `/bin/sh`; Docker's doctor
/// probes the hardened default, Kubernetes' the configured defaults, which
/// a pod can express), reads what holds inside it, removes it, and judges
/// what it read against `spec`.
pub async fn probe(runtime: &Runtime, spec: &SandboxSpec) -> Result<Vec<Check>, Error> {
    let sandbox = runtime.create(spec).await?;
    let result = sandbox
        .run(&CommandSpec::shell(PROBE_SCRIPT).timeout(Duration::from_secs(30)))
        .await;
    if let Err(e) = sandbox.destroy().await {
        tracing::warn!(sandbox = sandbox.id(), error = %e, "removing the doctor's probe sandbox failed");
    }
    if let Some(f) = result.failure {
        return Ok(vec![Check {
            name: "probe sandbox".into(),
            ok: false,
            detail: f.to_string(),
        }]);
    }
    Ok(evaluate(spec, &String::from_utf8_lossy(&result.stdout)))
}

/// Whether sandboxes of `spec` reset in place here: starts one with
/// `pristine` on, changes a file and leaves a process behind, resets it
/// and checks both are gone. Not a protection: `ok` false (with the
/// reason the runtime gives, such as a namespace's Pod Security level or
/// an AppArmor profile refusing the agent's mounts) means pristine
/// sandboxes are replaced at each reset instead.
pub async fn reset_probe(runtime: &Runtime, spec: &SandboxSpec) -> Check {
    let check = |ok: bool, detail: String| Check {
        name: "in-place reset".into(),
        ok,
        detail,
    };
    let mut spec = spec.clone();
    spec.pristine = true;
    if let Err(why) = spec.in_place_reset() {
        return check(false, format!("not for this spec: {why}"));
    }
    let sandbox = match runtime.create(&spec).await {
        Ok(sb) => sb,
        Err(e) => return check(false, format!("the probe sandbox did not start: {e}")),
    };
    let verdict = match sandbox.resets_in_place() {
        Err(why) => check(false, format!("unavailable: {why}")),
        Ok(()) => reset_once(&sandbox).await,
    };
    if let Err(e) = sandbox.destroy().await {
        tracing::warn!(sandbox = sandbox.id(), error = %e, "removing the doctor's reset probe failed");
    }
    verdict
}

async fn reset_once(sandbox: &crate::Sandbox) -> Check {
    let check = |ok: bool, detail: String| Check {
        name: "in-place reset".into(),
        ok,
        detail,
    };
    let cmd = |script: &str| CommandSpec::shell(script).timeout(Duration::from_secs(30));
    let mess = sandbox
        .run(&cmd(
            "echo probe > /etc/corral-doctor && (sleep 1000 >/dev/null 2>&1 &)",
        ))
        .await;
    if mess.failure.is_some() || mess.exit_code != Some(0) {
        return check(false, format!("the probe's command failed: {mess:?}"));
    }
    let outcome = match sandbox.reset().await {
        Ok(o) => o,
        Err(e) => return check(false, format!("the reset failed: {e}")),
    };
    let after = sandbox
        .run(&cmd(
            "ls /etc/corral-doctor 2>/dev/null; ps -o args | grep -c '[s]leep 1000'",
        ))
        .await;
    let clean = String::from_utf8_lossy(&after.stdout).trim() == "0";
    match (outcome.mode, clean) {
        (crate::ResetMode::InPlace, true) => check(
            true,
            format!(
                "available: {:.1} ms, {} process(es) killed, the file change undone",
                outcome.elapsed_ms, outcome.killed
            ),
        ),
        (crate::ResetMode::InPlace, false) => check(
            false,
            format!(
                "reset in place but not clean: {}",
                String::from_utf8_lossy(&after.stdout).trim()
            ),
        ),
        (crate::ResetMode::Replaced, _) => check(
            false,
            format!(
                "the sandbox was replaced: {}",
                outcome.fallback_reason.unwrap_or_default()
            ),
        ),
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
    match spec.limits.pids {
        Some(want) => push(
            "pids limit",
            pids == want.to_string(),
            format!("pids.max={pids}, wanted {want}"),
        ),
        // None asked (on Kubernetes the node's podPidsLimit decides):
        // say what holds.
        None => push(
            "pids limit",
            true,
            format!("none asked; pids.max={pids} (the engine's or node's setting)"),
        ),
    }
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
