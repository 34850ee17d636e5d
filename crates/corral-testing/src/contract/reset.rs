//! Contract cases for resetting a pristine sandbox in place: a reset
//! sandbox is indistinguishable from a new one of the same spec (every
//! process killed, every file change undone, IPC objects, `/dev`, what
//! an episode wrote to `/sys` and to PID 1's tunables), the agent's extra
//! capabilities never reach a command (each attack runs inside the
//! sandbox), a pristine pool hands out sandboxes reset in place, and a
//! spec that cannot reset in place is replaced and says why.
//!
//! An engine where the agent cannot hold what in-place reset needs (a
//! namespace's Pod Security level, an AppArmor profile) fails these cases
//! with the reason the runtime gives: run them where it can.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

use corral::pool::{PoolConfig, ProviderConfig};
use corral::{FileOptions, Provider, ResetMode, Sandbox, SandboxSpec};

use super::{sh, text, Case};

/// What a shell prints for `script`, which must succeed and exit 0.
async fn ok(sb: &Sandbox, script: &str) -> String {
    let r = sb.run(&sh(script)).await;
    assert_eq!(r.failure, None, "{script}: {r:?}");
    assert_eq!(r.exit_code, Some(0), "{script}: {}", text(&r.stderr));
    text(&r.stdout)
}

/// The lines only one side has, for failure messages.
fn diff(a: &str, b: &str) -> String {
    let only = |x: &str, y: &str| {
        x.lines()
            .filter(|l| !y.lines().any(|m| m == *l))
            .map(|l| format!("  {l}\n"))
            .collect::<String>()
    };
    format!("only before:\n{}only after:\n{}", only(a, b), only(b, a))
}

/// The case's spec, pristine, with start-up commands whose effects every
/// reset must keep.
fn pristine_spec(c: &Case) -> SandboxSpec {
    let mut spec = c.spec();
    spec.pristine = true;
    spec.startup = vec![
        "echo from-startup > /etc/startup-marker && chmod 640 /etc/startup-marker".into(),
        "mkdir -p /tmp/seeded && echo seed > /tmp/seeded/file".into(),
    ];
    spec
}

/// A sandbox that resets in place, or a failure naming why it cannot.
async fn pristine(c: &Case, spec: &SandboxSpec) -> Sandbox {
    let sb = c.create(spec).await;
    if let Err(why) = sb.resets_in_place() {
        let _ = sb.destroy().await;
        panic!("{}: the sandbox cannot reset in place: {why}", c.engine());
    }
    sb
}

/// Everything a command can see of the sandbox's state, without
/// timestamps (nor this script's own processes: those carrying its marker,
/// `ps`, zombies, and a subshell caught between fork and exec, which `ps`
/// shows as `[sh]`): every path outside /proc, /sys and /dev with its
/// type, mode, owner, size (files) and content digest or link target;
/// /dev; the processes; the mount table (points and types).
const FINGERPRINT: &str = r#"# fp-marker
find / \( -path /proc -o -path /sys -o -path /dev \) -prune -o -print | sort | while read -r f; do
  line="$f $(stat -c '%F %a %u:%g' "$f")"
  if [ -L "$f" ]; then line="$line -> $(readlink "$f")"
  elif [ -f "$f" ]; then line="$line $(stat -c %s "$f") $(md5sum < "$f" | cut -c1-32)"; fi
  echo "$line"
done
echo "-- /dev"; find /dev | sort
# A process running with no command line yet ([sh], [exe]) is one being
# spawned or exec'd right now (seen under load), not a survivor.
echo "-- processes"; ps -o stat,args | grep -v -e fp-marker -e ' ps' -e '^STAT' -e '^Z' -e ' \[sh\]$' -e '^R  *\[[^] ]*\]$' | sort
echo "-- mounts"; awk '{print $5, $9}' /proc/self/mountinfo | sort
"#;

/// Leaves a mess everywhere a rollout could.
const MESS: &str = r#"
echo tampered >> /etc/passwd
rm -f /etc/group /etc/startup-marker
chmod 700 /home/user /bin
chown 1000 /root
mkdir -p /opt/new/deep && echo x > /opt/new/deep/file
ln -s /etc/passwd /root/link
rm -rf /tmp/seeded
echo junk > /tmp/junk; echo junk > /dev/shm/junk; echo junk > /var/tmp/junk; echo junk > /dev/junk
echo '10.0.0.1 evil' >> /etc/hosts
mv /bin/ls /bin/ls.moved
(setsid sleep 1000 >/dev/null 2>&1 &)
(sleep 1000 >/dev/null 2>&1 &)
"#;

/// Two rounds of a mess and a reset: each time the sandbox reads exactly
/// as it did after its start, shells included; a new sandbox of the same
/// spec reads the same but for its own identity (hostname, address).
pub async fn reset_in_place_is_indistinguishable_from_a_new_sandbox(c: &Case) {
    let spec = pristine_spec(c);
    let sb = pristine(c, &spec).await;
    let fresh = ok(&sb, FINGERPRINT).await;
    assert!(
        fresh.contains("/etc/startup-marker regular file 640"),
        "{fresh}"
    );
    assert!(fresh.contains("/tmp/seeded/file"), "{fresh}");

    let shell = sb.shell("main");
    let r = shell.run("export EPISODE=1; cd /var", None, 1 << 20).await;
    assert_eq!(r.result.exit_code, Some(0), "{r:?}");
    for round in 0..2 {
        ok(&sb, MESS).await;
        let messy = ok(&sb, FINGERPRINT).await;
        assert!(messy != fresh, "the mess changed nothing");
        assert!(messy.contains("sleep 1000"), "{messy}");

        let outcome = sb.reset().await.expect("reset");
        assert_eq!(outcome.mode, ResetMode::InPlace, "{outcome:?}");
        assert!(outcome.killed >= 2, "round {round}: {outcome:?}");
        let after = ok(&sb, FINGERPRINT).await;
        assert!(
            after == fresh,
            "{}: round {round}: a reset sandbox differs from its fresh self: {}",
            c.engine(),
            diff(&fresh, &after)
        );
    }
    let shell = sb.shell("main");
    let r = shell.run("echo \"[$EPISODE]\"; pwd", None, 1 << 20).await;
    assert_eq!(text(&r.result.stdout), "[]\n/\n", "{r:?}");

    // A new sandbox has an identity of its own: its hostname and address,
    // and where a cluster mounts one although corral's pods ask for none
    // (rusternetes' kubelet does), its service account token.
    let other = c.create(&spec).await;
    let identity = |print: &str| {
        print
            .lines()
            .filter(|l| {
                !l.starts_with("/etc/hostname ")
                    && !l.starts_with("/etc/hosts ")
                    && !l.starts_with("/var/run/secrets/kubernetes.io/serviceaccount/token ")
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let (new, fresh) = (identity(&ok(&other, FINGERPRINT).await), identity(&fresh));
    assert!(
        new == fresh,
        "{}: a new sandbox differs: {}",
        c.engine(),
        diff(&fresh, &new)
    );
    sb.destroy().await.expect("destroy");
    other.destroy().await.expect("destroy");
}

/// The attack helper (`attacks/privs.c`), built static once per process.
fn privs_binary() -> &'static [u8] {
    static BIN: OnceLock<Vec<u8>> = OnceLock::new();
    BIN.get_or_init(|| {
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/attacks/privs.c");
        let out = std::env::temp_dir().join(format!("corral-privs-{}", std::process::id()));
        let built = std::process::Command::new("gcc")
            .args(["-static", "-O1", "-o"])
            .arg(&out)
            .arg(src)
            .status()
            .expect("gcc runs");
        assert!(built.success(), "building {src} failed");
        let bin = std::fs::read(&out).expect("the attack helper");
        let _ = std::fs::remove_file(&out);
        bin
    })
}

/// Where the attack helper goes: the root file system, because a
/// cluster may mount memory-backed `emptyDir`s (`/tmp`) `noexec`
/// (rusternetes' kubelet does).
const PRIVS: &str = "/privs";

async fn install_privs(sb: &Sandbox) {
    let opts = FileOptions {
        mode: Some(0o755),
        ..Default::default()
    };
    sb.write_file(PRIVS, privs_binary(), &opts)
        .await
        .expect("write the attack helper");
}

/// The agent of a pristine sandbox holds CAP_SYS_ADMIN; its commands (and
/// shells, before and after a reset) hold exactly what a plain sandbox's
/// do, and every namespace, mount, chroot and other call the capability
/// would open is refused with the very error a plain sandbox gets.
pub async fn reset_in_place_commands_get_none_of_the_agents_privileges(c: &Case) {
    let plain_spec = c.spec();
    let mut pristine_spec = c.spec();
    pristine_spec.pristine = true;
    let (plain, pristine) = tokio::join!(c.create(&plain_spec), pristine(c, &pristine_spec));

    let agent = ok(&pristine, "grep CapEff /proc/1/status").await;
    let eff =
        u64::from_str_radix(agent.split_whitespace().nth(1).unwrap_or(""), 16).expect("CapEff");
    assert_ne!(eff & (1 << 21), 0, "the agent lacks CAP_SYS_ADMIN: {agent}");
    let caps = "grep -E '^(Cap|NoNewPrivs|Seccomp:)' /proc/self/status";
    for round in 0..2 {
        let p = ok(&plain, caps).await;
        let q = ok(&pristine, caps).await;
        assert_eq!(q, p, "round {round}: a command's privileges differ");
        let shell = pristine.shell("s");
        let r = shell.run(caps, None, 1 << 20).await;
        assert_eq!(text(&r.result.stdout), p, "shell: {r:?}");
        pristine.reset().await.expect("reset");
    }

    for attack in [
        "unshare -U true",
        "unshare -r true",
        "unshare -m true",
        "unshare -n true",
        "mount -t tmpfs x /mnt",
        "umount -l /proc",
        "chroot / true",
        "nsenter -t 1 -m true",
        "ls /proc/1/root/dev/shm/.corral-state",
        "hostname evil",
    ] {
        for (name, sb) in [("plain", &plain), ("pristine", &pristine)] {
            let r = sb.run(&sh(attack)).await;
            assert_eq!(r.failure, None, "{attack}: {r:?}");
            assert_ne!(
                r.exit_code,
                Some(0),
                "{}: {name}: `{attack}` succeeded: {}",
                c.engine(),
                text(&r.stdout)
            );
        }
    }

    let mut reports = Vec::new();
    for (name, sb) in [("plain", &plain), ("pristine", &pristine)] {
        install_privs(sb).await;
        let report = ok(sb, PRIVS).await;
        let lines: Vec<&str> = report.lines().collect();
        assert_eq!(lines.len(), 19, "{name}: {report}");
        for line in lines {
            assert!(line.contains(" refused "), "{name}: {line}\n{report}");
        }
        reports.push(report);
    }
    assert_eq!(
        reports[1], reports[0],
        "pristine refuses differently from plain"
    );
    plain.destroy().await.expect("destroy");
    pristine.destroy().await.expect("destroy");
}

/// System V objects, POSIX message queues and files left in `/dev` are
/// gone after a reset; the devices still work.
pub async fn reset_in_place_clears_ipc_objects_and_dev(c: &Case) {
    let mut spec = c.spec();
    spec.pristine = true;
    let sb = pristine(c, &spec).await;
    install_privs(&sb).await;
    ok(
        &sb,
        "/privs ipc && cp /privs /root/privs && echo x > /dev/junk && mkdir /dev/dir",
    )
    .await;
    assert_eq!(ok(&sb, "/privs ipc-count").await, "2\n");
    let outcome = sb.reset().await.expect("reset");
    assert_eq!(outcome.mode, ResetMode::InPlace, "{outcome:?}");
    // The helper went with the reset too.
    assert_eq!(
        ok(&sb, "ls /root; ls /dev/junk /dev/dir /privs 2>&1 | wc -l").await,
        "3\n"
    );
    install_privs(&sb).await;
    assert_eq!(ok(&sb, "/privs ipc-count").await, "0\n");
    assert_eq!(
        ok(
            &sb,
            "head -c 3 /dev/zero | wc -c; echo hi > /dev/null && echo ok"
        )
        .await,
        "3\nok\n"
    );
    sb.destroy().await.expect("destroy");
}

/// What a command can read of PID 1's tunables and of the engine's
/// writable mounts under /sys.
const TUNABLES: &str = "cat /proc/1/oom_score_adj /proc/1/coredump_filter; \
    sed 's/-[0-9]*//' /proc/1/autogroup; ls -a /sys/fs/cgroup; \
    stat -c '%n %a %u:%g %Y' /proc /dev/pts /dev/pts/ptmx /dev/mqueue /dev/null /proc/keys";

/// Writes what a command can to the same: a file (and a directory) on the
/// tmpfs an engine mounts at /sys/fs/cgroup on cgroup v1; PID 1's OOM
/// score, core-dump filter and autogroup niceness; and the mode, owner or
/// times of what every world shares. Each write is tried and its outcome
/// printed; the autogroup's is retried (the kernel refuses more than one
/// change per 100 ms host-wide).
const CHANNEL: &str = r#"
w() { if eval "$1" 2>/dev/null; then echo "$2 written"; else echo "$2 refused"; fi; }
w 'echo episode-1 > /sys/fs/cgroup/leak' cgroup-file
w 'mkdir /sys/fs/cgroup/leakdir' cgroup-dir
w 'echo 1000 > /proc/1/oom_score_adj' oom_score_adj
w 'echo 0x7f > /proc/1/coredump_filter' coredump_filter
w 'chmod 700 /proc' proc-mode
w 'chown 1000 /dev/pts && chmod 600 /dev/pts/ptmx' pts
w 'chmod 777 /dev/mqueue && touch -d "2001-01-01 00:00" /dev/mqueue' mqueue
w 'chmod 600 /dev/null' dev-null
w 'chmod 600 /proc/keys' proc-keys
i=0; until echo 19 > /proc/1/autogroup 2>/dev/null || [ $i -ge 50 ]; do i=$((i+1)); sleep 0.05; done
grep -q 'nice 19' /proc/1/autogroup && echo 'autogroup written' || echo 'autogroup refused'
"#;

/// Nothing an episode wrote where every world reads (PID 1's tunables,
/// the engine's tmpfs under /sys, the roots of /proc, /dev/pts and
/// /dev/mqueue) survives a reset; the agent keeps its own OOM score.
pub async fn reset_in_place_undoes_writes_to_sys_and_pid1(c: &Case) {
    let mut spec = c.spec();
    spec.pristine = true;
    let sb = pristine(c, &spec).await;
    let fresh = ok(&sb, TUNABLES).await;
    let tried = ok(&sb, CHANNEL).await;
    assert!(tried.contains("oom_score_adj written"), "{tried}");
    assert!(tried.contains("autogroup written"), "{tried}");
    assert!(tried.contains("proc-mode written"), "{tried}");
    assert!(tried.contains("mqueue written"), "{tried}");
    let messy = ok(&sb, TUNABLES).await;
    assert!(messy != fresh, "the episode changed nothing: {tried}");

    let outcome = sb.reset().await.expect("reset");
    assert_eq!(outcome.mode, ResetMode::InPlace, "{outcome:?}");
    let after = ok(&sb, TUNABLES).await;
    assert!(
        after == fresh,
        "{}: the next episode reads what the last one wrote ({tried}): {}",
        c.engine(),
        diff(&fresh, &after)
    );
    assert_eq!(fresh.lines().next(), Some("0"), "{fresh}");
    sb.destroy().await.expect("destroy");
}

/// A pristine pool hands the next session the same sandbox, reset in
/// place in the background (no new container or pod), with nothing of
/// the last session left.
pub async fn reset_in_place_serves_a_pristine_pool(c: &Case) {
    let cfg = ProviderConfig {
        max_live: 2,
        pools: BTreeMap::from([(
            "episodes".to_string(),
            PoolConfig {
                // The pool turns `pristine` on for its spec itself.
                spec: c.spec(),
                warm: 1,
                pristine: true,
                ..PoolConfig::default()
            },
        )]),
        ..ProviderConfig::default()
    };
    let p = Provider::new(c.runtime().clone(), cfg);
    assert!(
        p.wait_warm("episodes", Duration::from_secs(120)).await,
        "pool never filled"
    );
    let lease = p.acquire("episode-1", "episodes").await.expect("acquire");
    let first = lease.container_id();
    lease
        .resets_in_place()
        .unwrap_or_else(|why| panic!("{}: cannot reset in place: {why}", c.engine()));
    ok(
        &lease,
        "echo leaked > /etc/leak; (sleep 1000 >/dev/null 2>&1 &) ; echo x > /tmp/x",
    )
    .await;
    lease.release().await.expect("release");
    p.settled(Duration::from_secs(60)).await;
    // Both pool sandboxes are clean: whichever comes next.
    let mut seen = Vec::new();
    for key in ["episode-2", "episode-3"] {
        let lease = p.acquire(key, "episodes").await.expect("acquire");
        let state = ok(
            &lease,
            "ls /etc/leak /tmp/x 2>&1 | wc -l; ps -o args | grep -c '[s]leep 1000' || true",
        )
        .await;
        assert_eq!(state, "2\n0\n", "{}: leftovers: {state}", c.engine());
        seen.push(lease.container_id());
        drop(lease);
    }
    assert!(
        seen.contains(&first),
        "the released sandbox went back to the pool: {first} not in {seen:?}"
    );
    let metrics = c.runtime().metrics();
    assert!(metrics.resets_in_place >= 1, "{metrics:?}");
    assert_eq!(metrics.resets_replaced, 0, "{metrics:?}");
    let left = c.leftovers().await;
    assert_eq!(left.len(), 2, "no replacement was started: {left:?}");
    p.shutdown().await;
}

/// A spec that cannot reset in place (a read-only root) resets by
/// replacement: a new container or pod, nothing of the old one, and the
/// outcome names the field that prevented it.
pub async fn reset_replaces_what_cannot_reset_in_place_and_says_why(c: &Case) {
    let mut spec = c.spec();
    spec.pristine = true;
    spec.security.read_only_root = true;
    let sb = c.create(&spec).await;
    let why = sb.resets_in_place().expect_err("a read-only root cannot");
    assert!(why.contains("security.read_only_root"), "{why}");
    let before = sb.container_id();
    ok(&sb, "echo x > /tmp/x; (sleep 1000 >/dev/null 2>&1 &)").await;
    let outcome = sb.reset().await.expect("reset");
    assert_eq!(outcome.mode, ResetMode::Replaced);
    assert!(
        outcome
            .fallback_reason
            .as_deref()
            .is_some_and(|r| r.contains("read_only_root")),
        "{outcome:?}"
    );
    assert_ne!(sb.container_id(), before, "not replaced");
    assert_eq!(
        ok(
            &sb,
            "ls /tmp | wc -l; ps -o args | grep -c '[s]leep 1000' || true"
        )
        .await,
        "0\n0\n"
    );
    assert!(c.runtime().metrics().resets_replaced >= 1);
    sb.destroy().await.expect("destroy");
}
