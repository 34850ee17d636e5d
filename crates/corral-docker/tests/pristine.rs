//! In-place reset in real sandboxes: a reset sandbox is indistinguishable
//! from a new one of the same spec, and the agent's extra capabilities
//! never reach a command (each attack runs inside the sandbox); a pristine
//! pool never hands a sandbox a snapshot changed to the next session.

mod common;

use std::time::Duration;

use common::{backend, Guard, BUSYBOX};
use corral::{ResetMode, Sandbox};
use corral_core::{CommandSpec, SandboxSpec};

fn sh(script: &str) -> CommandSpec {
    CommandSpec::shell(script).timeout(Duration::from_secs(60))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

async fn out(sb: &Sandbox, script: &str) -> String {
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

fn pristine_spec(g: &Guard) -> SandboxSpec {
    let mut spec = g.spec(BUSYBOX);
    spec.pristine = true;
    spec.startup = vec![
        "echo from-startup > /etc/startup-marker && chmod 640 /etc/startup-marker".into(),
        "mkdir -p /tmp/seeded && echo seed > /tmp/seeded/file".into(),
    ];
    spec
}

/// Everything a command can see of the sandbox's state, without
/// timestamps (nor this script's own processes: those carrying its marker,
/// `ps`, zombies, and a subshell caught between fork and exec, which `ps`
/// shows as `[sh]`): every path outside /proc, /sys and /dev with its type, mode,
/// owner, size (files) and content digest or link target; /dev/shm; the
/// processes; the mount table (points and types).
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

#[tokio::test(flavor = "multi_thread")]
async fn a_reset_sandbox_is_indistinguishable_from_a_new_one() {
    let g = Guard::new("pristine-equal");
    let b = backend().await;
    let spec = pristine_spec(&g);
    let sb = b.create(&spec).await.expect("create");
    sb.resets_in_place().expect("in place");
    let fresh_print = out(&sb, FINGERPRINT).await;
    assert!(
        fresh_print.contains("/etc/startup-marker regular file 640"),
        "{fresh_print}"
    );
    assert!(fresh_print.contains("/tmp/seeded/file"), "{fresh_print}");

    // A shell session changes its environment and directory.
    let shell = sb.shell("main");
    let r = shell.run("export EPISODE=1; cd /var", None, 1 << 20).await;
    assert_eq!(r.result.exit_code, Some(0), "{r:?}");
    for round in 0..2 {
        out(&sb, MESS).await;
        let messy = out(&sb, FINGERPRINT).await;
        assert!(messy != fresh_print, "the mess changed nothing");
        assert!(messy.contains("sleep 1000"), "{messy}");

        let outcome = sb.reset().await.expect("reset");
        assert_eq!(outcome.mode, ResetMode::InPlace, "{outcome:?}");
        assert!(outcome.killed >= 2, "round {round}: {outcome:?}");
        let after = out(&sb, FINGERPRINT).await;
        assert!(
            after == fresh_print,
            "round {round}: a reset sandbox differs from its fresh self: {}",
            diff(&fresh_print, &after)
        );
    }
    // Shells are gone with their state: a new one starts clean.
    let shell = sb.shell("main");
    let r = shell.run("echo \"[$EPISODE]\"; pwd", None, 1 << 20).await;
    assert_eq!(text(&r.result.stdout), "[]\n/\n", "{r:?}");

    // A new sandbox of the same spec sees the same, but for its own
    // identity: its hostname (the container id) and address in /etc/hosts.
    let other = b.create(&spec).await.expect("create");
    let identity = |print: &str| {
        print
            .lines()
            .filter(|l| !l.starts_with("/etc/hostname ") && !l.starts_with("/etc/hosts "))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let (new_print, fresh_print) = (
        identity(&out(&other, FINGERPRINT).await),
        identity(&fresh_print),
    );
    assert!(
        new_print == fresh_print,
        "a new sandbox differs: {}",
        diff(&fresh_print, &new_print)
    );
    sb.destroy().await.expect("destroy");
    other.destroy().await.expect("destroy");
    g.assert_clean();
}

/// The attack helper (`attacks/privs.c`), built static once per test run.
fn privs_binary() -> Vec<u8> {
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("corral-privs");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/attacks/privs.c");
    let built = std::process::Command::new("gcc")
        .args(["-static", "-O1", "-o"])
        .arg(&out)
        .arg(src)
        .status()
        .expect("gcc runs");
    assert!(built.success(), "building {src} failed");
    std::fs::read(&out).expect("the attack helper")
}

async fn install_privs(sb: &Sandbox, bin: &[u8]) {
    let opts = corral::FileOptions {
        mode: Some(0o755),
        ..Default::default()
    };
    sb.write_file("/tmp/privs", bin, &opts)
        .await
        .expect("write helper");
}

#[tokio::test(flavor = "multi_thread")]
async fn commands_get_none_of_the_agents_extra_privileges() {
    let g = Guard::new("pristine-privs");
    let b = backend().await;
    let bin = privs_binary();
    let plain = b.create(&g.spec(BUSYBOX)).await.expect("create plain");
    let mut spec = g.spec(BUSYBOX);
    spec.pristine = true;
    let pristine = b.create(&spec).await.expect("create pristine");
    pristine.resets_in_place().expect("in place");

    // The agent holds the extra capabilities; commands do not.
    let agent_caps = out(&pristine, "grep CapEff /proc/1/status").await;
    let agent_eff = u64::from_str_radix(agent_caps.split_whitespace().nth(1).unwrap_or(""), 16)
        .expect("CapEff");
    assert_ne!(
        agent_eff & (1 << 21),
        0,
        "the agent lacks CAP_SYS_ADMIN: {agent_caps}"
    );
    let caps = "grep -E '^(Cap|NoNewPrivs)' /proc/self/status";
    for round in 0..2 {
        let p = out(&plain, caps).await;
        let q = out(&pristine, caps).await;
        assert_eq!(q, p, "round {round}: a command's privileges differ");
        // Also in a shell, and after a reset.
        let shell = pristine.shell("s");
        let r = shell.run(caps, None, 1 << 20).await;
        assert_eq!(text(&r.result.stdout), p, "shell: {r:?}");
        pristine.reset().await.expect("reset");
    }

    // Busybox's own tools: each must fail in both sandboxes alike.
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
                "{name}: `{attack}` succeeded: {}",
                text(&r.stdout)
            );
        }
    }

    // The raw system calls, clone and clone3 included: refused, and with
    // the very errors a sandbox without the agent's capabilities gets.
    let mut reports = Vec::new();
    for (name, sb) in [("plain", &plain), ("pristine", &pristine)] {
        install_privs(sb, &bin).await;
        let report = out(sb, "/tmp/privs").await;
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
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reset_clears_ipc_objects_and_dev() {
    let g = Guard::new("pristine-ipc");
    let b = backend().await;
    let bin = privs_binary();
    let mut spec = g.spec(BUSYBOX);
    spec.pristine = true;
    let sb = b.create(&spec).await.expect("create");
    install_privs(&sb, &bin).await;
    out(
        &sb,
        "/tmp/privs ipc && cp /tmp/privs /root/privs && echo x > /dev/junk && mkdir /dev/dir",
    )
    .await;
    assert_eq!(out(&sb, "/tmp/privs ipc-count").await, "2\n");
    let outcome = sb.reset().await.expect("reset");
    assert_eq!(outcome.mode, ResetMode::InPlace);
    // /tmp is fresh, so the helper comes back; /root/privs is gone too.
    assert_eq!(
        out(&sb, "ls /root; ls /dev/junk /dev/dir 2>&1 | wc -l").await,
        "2\n"
    );
    install_privs(&sb, &bin).await;
    assert_eq!(out(&sb, "/tmp/privs ipc-count").await, "0\n");
    // The devices still work.
    assert_eq!(
        out(
            &sb,
            "head -c 3 /dev/zero | wc -c; echo hi > /dev/null && echo ok"
        )
        .await,
        "3\nok\n"
    );
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

fn pristine_pool(spec: SandboxSpec, warm: usize) -> corral_core::pool::ProviderConfig {
    use corral_core::pool::{PoolConfig, ProviderConfig};
    ProviderConfig {
        max_live: warm + 1,
        pools: std::collections::BTreeMap::from([(
            "episodes".to_string(),
            PoolConfig {
                spec,
                warm,
                pristine: true,
                ..PoolConfig::default()
            },
        )]),
        ..ProviderConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pristine_pool_hands_out_reset_sandboxes() {
    let g = Guard::new("pristine-pool");
    let runtime = backend().await;
    // The pool turns `pristine` on for its spec itself.
    let p = corral::Provider::new(runtime.clone(), pristine_pool(g.spec(BUSYBOX), 1));
    let lease = p.acquire("episode-1", "episodes").await.expect("acquire");
    let first = lease.container_id();
    out(
        &lease,
        "echo leaked > /etc/leak; (sleep 1000 &) ; echo x > /tmp/x",
    )
    .await;
    lease.release().await.expect("release");
    p.settled(Duration::from_secs(60)).await;
    let lease = p.acquire("episode-2", "episodes").await.expect("acquire");
    // The same container, reset in place (the pool holds one warm sandbox
    // and the released one; both are clean).
    let state = out(
        &lease,
        "ls /etc/leak /tmp/x 2>&1 | wc -l; ps -o args | grep -c '[s]leep 1000' || true",
    )
    .await;
    assert_eq!(state, "2\n0\n", "leftovers: {state}");
    let metrics = runtime.metrics();
    assert!(metrics.resets_in_place >= 1, "{metrics:?}");
    assert_eq!(metrics.resets_replaced, 0, "{metrics:?}");
    lease.release().await.expect("release");
    p.settled(Duration::from_secs(60)).await;
    // Released sandboxes went back to the pool: nothing was replaced, so
    // the first container is still among the pool's.
    assert!(
        g.remaining().iter().any(|c| first.starts_with(c.as_str())),
        "{first} {:?}",
        g.remaining()
    );
    p.shutdown().await;
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_spec_that_cannot_reset_in_place_is_replaced_and_says_why() {
    let g = Guard::new("pristine-fallback");
    let runtime = backend().await;
    let mut spec = g.spec(BUSYBOX);
    spec.pristine = true;
    spec.security.read_only_root = true;
    let sb = runtime.create(&spec).await.expect("create");
    let why = sb.resets_in_place().expect_err("read-only root cannot");
    assert!(why.contains("security.read_only_root"), "{why}");
    let before = sb.container_id();
    out(&sb, "echo x > /tmp/x; (sleep 1000 &)").await;
    let outcome = sb.reset().await.expect("reset");
    assert_eq!(outcome.mode, ResetMode::Replaced);
    assert!(
        outcome
            .fallback_reason
            .as_deref()
            .is_some_and(|r| r.contains("read_only_root")),
        "{outcome:?}"
    );
    assert_ne!(sb.container_id(), before, "the container was not replaced");
    assert_eq!(
        out(
            &sb,
            "ls /tmp | wc -l; ps -o args | grep -c '[s]leep 1000' || true"
        )
        .await,
        "0\n0\n"
    );
    assert!(runtime.metrics().resets_replaced >= 1);
    // The old container is gone, the new one is the sandbox's.
    assert_eq!(g.remaining().len(), 1, "{:?}", g.remaining());
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

/// What a command can read of PID 1's tunables and of the engine's
/// writable mounts under /sys.
const TUNABLES: &str = "cat /proc/1/oom_score_adj /proc/1/coredump_filter; \
    sed 's/-[0-9]*//' /proc/1/autogroup; ls -a /sys/fs/cgroup; \
    stat -c '%n %a %u:%g %Y' /proc /dev/pts /dev/pts/ptmx /dev/mqueue /dev/null /proc/keys";

/// Writes what a command can to the same: a file (and a directory) on the
/// tmpfs Docker mounts at /sys/fs/cgroup on cgroup v1; PID 1's OOM score,
/// core-dump filter and autogroup niceness (root with DAC_OVERRIDE may,
/// PID 1 running as the same uid); and the mode, owner or times of what
/// every world shares (the roots of /proc, /dev/pts and /dev/mqueue, the
/// device nodes, the mask over /proc/keys). Each write is tried and its
/// outcome printed; the autogroup's is retried (the kernel refuses more
/// than one change per 100 ms host-wide).
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

#[tokio::test(flavor = "multi_thread")]
async fn nothing_an_episode_writes_to_sys_or_pid1_survives_a_reset() {
    let g = Guard::new("pristine-channel");
    let b = backend().await;
    let mut spec = g.spec(BUSYBOX);
    spec.pristine = true;
    let sb = b.create(&spec).await.expect("create");
    sb.resets_in_place().expect("in place");
    let fresh = out(&sb, TUNABLES).await;
    let tried = out(&sb, CHANNEL).await;
    // The episode got through where the kernel lets it: PID 1's tunables
    // change (the agent takes them back at the reset).
    assert!(tried.contains("oom_score_adj written"), "{tried}");
    assert!(tried.contains("autogroup written"), "{tried}");
    assert!(tried.contains("proc-mode written"), "{tried}");
    assert!(tried.contains("mqueue written"), "{tried}");
    let messy = out(&sb, TUNABLES).await;
    assert!(messy != fresh, "the episode changed nothing: {tried}");

    let outcome = sb.reset().await.expect("reset");
    assert_eq!(outcome.mode, ResetMode::InPlace, "{outcome:?}");
    let after = out(&sb, TUNABLES).await;
    assert!(
        after == fresh,
        "the next episode reads what the last one wrote ({tried}): {}",
        diff(&fresh, &after)
    );
    // The agent's own OOM score is the one it started with, so commands
    // (at 500) remain the OOM killer's choice.
    assert_eq!(fresh.lines().next(), Some("0"), "{fresh}");
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

/// What session B sees of a planted file and of `/bin/sh`, as the exit
/// codes of `sh -c 'exit 3'` (plain and exclusive) and one line.
async fn poison_seen(sb: &Sandbox) -> (Option<i32>, Option<i32>, String) {
    let plain = sb.run(&sh("exit 3")).await;
    let exclusive = sb.run(&sh("exit 3").exclusive()).await;
    let planted = sb
        .run(&sh("test -e /etc/planted && echo present || echo absent"))
        .await;
    (plain.exit_code, exclusive.exit_code, text(&planted.stdout))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_never_poisons_a_pristine_pool() {
    let g = Guard::new("pristine-poison");
    let runtime = backend().await;
    let mut config = pristine_pool(g.spec(BUSYBOX), 1);
    // One sandbox at most: once released, the attacker's is the only one
    // the pool could hand out next.
    config.max_live = 1;
    let p = corral::Provider::new(runtime.clone(), config);
    assert!(p.wait_warm("episodes", Duration::from_secs(120)).await);
    let a = p.acquire("attacker", "episodes").await.expect("acquire");
    let poisoned = a.container_id();
    out(&a, common::POISON).await;
    let r = a.run(&sh("exit 3")).await;
    assert_eq!(r.exit_code, Some(0), "the attack took: {r:?}");
    // The snapshot folds the planted files into the container's root.
    let name = format!(
        "poison-{}-{}",
        std::process::id(),
        corral::host::random_hex(6)
    );
    a.snapshot(&name, corral::SnapshotOptions::default())
        .await
        .expect("snapshot");
    a.release().await.expect("release");
    p.settled(Duration::from_secs(60)).await;

    let b = p.acquire("victim", "episodes").await.expect("acquire");
    assert_eq!(
        poison_seen(&b).await,
        (Some(3), Some(3), "absent\n".to_string()),
        "the next session inherited the attacker's sandbox"
    );
    assert_ne!(
        b.container_id(),
        poisoned,
        "handed out the folded container"
    );
    let reset = b.reset().await.expect("reset");
    assert_eq!(reset.mode, ResetMode::InPlace, "{reset:?}");
    assert_eq!(
        poison_seen(&b).await,
        (Some(3), Some(3), "absent\n".to_string()),
        "after an explicit reset"
    );
    let stats = p.stats();
    assert_eq!(stats.discarded_changed, 1, "{stats:?}");
    assert!(
        !g.remaining()
            .iter()
            .any(|c| poisoned.starts_with(c.as_str())),
        "the folded container is gone: {:?}",
        g.remaining()
    );
    b.release().await.expect("release");
    p.shutdown().await;
    runtime
        .delete_snapshot(&name)
        .await
        .expect("delete the snapshot");
    g.assert_clean();
}
