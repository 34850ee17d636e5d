//! Pause and resume on the real daemon (`Sandbox::pause`, the cgroup
//! freezer): a paused sandbox's container is `paused` to the engine and
//! its processes stop; resumed, the same processes go on with their
//! memory, and commands run again.

mod common;

use std::time::Duration;

use common::{backend, docker, Guard, BUSYBOX};
use corral_core::CommandSpec;

fn sh(script: &str) -> CommandSpec {
    CommandSpec::shell(script).timeout(Duration::from_secs(60))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_sandbox_is_frozen_and_resumes_with_its_processes() {
    let g = Guard::new("pause");
    let rt = backend().await;
    let sb = rt.create(&g.spec(BUSYBOX)).await.expect("create");
    // A process whose only state is in memory: a counter it keeps in a
    // shell variable and writes out on each tick.
    let r = sb
        .run(&sh("(n=0; while true; do n=$((n+1)); echo $n > /tmp/n; sleep 0.05; done) >/dev/null 2>&1 & echo $!"))
        .await;
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let pid = String::from_utf8_lossy(&r.stdout).trim().to_string();

    sb.pause().await.expect("pause");
    let id = sb.container_id();
    assert_eq!(
        docker(&["inspect", "-f", "{{.State.Paused}}", &id]).trim(),
        "true"
    );

    sb.resume().await.expect("resume");
    let r = sb
        .run(&sh(&format!(
            "a=$(cat /tmp/n); sleep 0.3; b=$(cat /tmp/n); kill -0 {pid} && [ \"$b\" -gt \"$a\" ] && echo counting"
        )))
        .await;
    assert_eq!(
        String::from_utf8_lossy(&r.stdout),
        "counting\n",
        "the counter kept its memory and went on: {r:?}"
    );
    assert_eq!(
        docker(&["inspect", "-f", "{{.State.Paused}}", &id]).trim(),
        "false"
    );
    sb.destroy().await.expect("destroy");
}
