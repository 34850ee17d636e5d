//! Template builds on the real daemon: a Dockerfile with its context
//! becomes a template whose sandboxes have its files, environment,
//! directory and user; an unchanged build runs nothing again, a changed
//! step reruns from there on; a failing step is typed with its line and
//! output; steps run in hardened corral sandboxes, never the daemon's
//! builder; a namespace reaches only its own templates.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{backend, Guard, BUSYBOX};
use corral::template::Recipe;
use corral::{BuildEvent, BuildRequest, Runtime, Sandbox};
use corral_core::{Error, Network};

async fn out(sb: &Sandbox, script: &str) -> String {
    corral_testing::contract::out(sb, script).await
}

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        corral::host::random_hex(4)
    )
}

fn context(files: &[(&str, &str, u32)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, text, mode) in files {
        let mut h = tar::Header::new_gnu();
        h.set_mode(*mode);
        h.set_size(text.len() as u64);
        b.append_data(&mut h, path, text.as_bytes())
            .expect("append");
    }
    b.into_inner().expect("tar")
}

/// A namespace of this test's own: its templates and cached steps are
/// nobody else's, and go at its end.
fn namespace(test: &str) -> String {
    format!("t{}-{test}", std::process::id())
}

fn request(guard: &Guard, name: &str, dockerfile: &str, ctx: Vec<u8>) -> BuildRequest {
    let recipe = Recipe::from_dockerfile(dockerfile, &BTreeMap::new()).expect("a recipe");
    let mut spec = guard.spec(BUSYBOX);
    spec.network = Network::None;
    let mut req = BuildRequest::new(name, recipe, spec);
    req.context = Some(ctx);
    req.step_timeout = Duration::from_secs(120);
    req
}

/// Builds, collecting the events.
async fn build(
    runtime: &Runtime,
    req: &BuildRequest,
) -> (Result<corral::TemplateInfo, Error>, Vec<BuildEvent>) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let r = runtime
        .build_template(req, &move |e| seen.lock().expect("events").push(e))
        .await;
    let events = events.lock().expect("events").clone();
    (r, events)
}

fn steps(events: &[BuildEvent]) -> Vec<(usize, bool)> {
    events
        .iter()
        .filter_map(|e| match e {
            BuildEvent::Step { index, cached, .. } => Some((*index, *cached)),
            _ => None,
        })
        .collect()
}

/// A Dockerfile whose layers are this run's own (`RUN_ID` is in every
/// later step's cache key).
fn dockerfile(run: &str) -> String {
    format!("FROM corral-test/busybox\nENV RUN_ID={run}\n{DOCKERFILE_REST}")
}

const DOCKERFILE_REST: &str = "ENV GREETING=hello PATH=/opt/tools:/usr/bin:/bin\n\
WORKDIR /opt/app\n\
COPY run.sh tools/ ./\n\
RUN chmod 755 run.sh && echo built > stamp && echo kept > /var/left\n\
RUN echo 'builder:x:1234:1234::/home/builder:/bin/sh' >> /etc/passwd && mkdir -p /home/builder && chown 1234 /home/builder\n\
USER builder\n\
RUN id -u > /home/builder/uid-of-build\n";

#[tokio::test(flavor = "multi_thread")]
async fn a_dockerfile_builds_a_template_whose_sandboxes_have_what_it_made() {
    let guard = Guard::new("template_build");
    let runtime = backend().await;
    let name = unique("tpl");
    let ns = namespace("build");
    let ctx = context(&[
        ("run.sh", "echo ran $GREETING\n", 0o644),
        ("tools/t", "T", 0o600),
    ]);
    let mut req = request(&guard, &name, &dockerfile(&name), ctx.clone());
    req.namespace = Some(ns.clone());
    let (built, events) = build(&runtime, &req).await;
    let t = built.expect("the build");
    assert_eq!(t.build.expect("a summary").cached, 0, "{events:?}");
    assert!(events
        .iter()
        .any(|e| matches!(e, BuildEvent::Step { line: Some(6), .. })));

    let mut spec = guard.spec(BUSYBOX);
    t.apply(&mut spec);
    let sb = runtime
        .create(&spec)
        .await
        .expect("a sandbox of the template");
    let seen = out(
        &sb,
        "pwd; id -u; echo $GREETING; cat stamp /var/left /home/builder/uid-of-build; ./run.sh; stat -c '%a %u' t",
    )
    .await;
    // `t` kept its mode and, copied before USER, is root's (as Docker copies).
    assert_eq!(
        seen,
        "/opt/app\n1234\nhello\nbuilt\nkept\n1234\nran hello\n600 0\n"
    );
    sb.destroy().await.expect("destroy");

    // The same build again: every step from the cache, nothing run.
    let (again, events) = build(&runtime, &req).await;
    let again = again.expect("the cached build");
    let cached: Vec<bool> = steps(&events).iter().map(|(_, c)| *c).collect();
    assert_eq!(again.build.expect("summary").cached, 5, "{events:?}");
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, BuildEvent::Output { .. })),
        "a cached build ran something: {events:?}"
    );
    assert_eq!(cached.iter().filter(|c| **c).count(), 5, "{cached:?}");

    // A changed file reruns the copy and everything after it, not before.
    let changed = context(&[
        ("run.sh", "echo ran again\n", 0o644),
        ("tools/t", "T", 0o600),
    ]);
    let mut req2 = request(&guard, &name, &dockerfile(&name), changed);
    req2.namespace = Some(ns.clone());
    let (third, events) = build(&runtime, &req2).await;
    third.expect("the rebuild");
    let by_index: BTreeMap<usize, bool> = steps(&events).into_iter().collect();
    assert!(by_index[&4], "WORKDIR was rebuilt: {events:?}");
    assert!(
        !by_index[&5] && !by_index[&6],
        "the copy was cached: {events:?}"
    );

    // skip_cache runs every step.
    let mut forced = req2.clone();
    forced.skip_cache = true;
    let (forced, _) = build(&runtime, &forced).await;
    assert_eq!(forced.expect("forced").build.expect("summary").cached, 0);

    assert!(runtime
        .templates(Some(&ns))
        .await
        .expect("list")
        .iter()
        .any(|x| x.name == name));
    assert!(!runtime
        .templates(None)
        .await
        .expect("list")
        .iter()
        .any(|x| x.name == name));
    assert!(runtime
        .delete_template(Some(&ns), &name)
        .await
        .expect("delete"));
    assert!(runtime
        .template(Some(&ns), &name)
        .await
        .expect("get")
        .is_none());
    assert!(
        runtime
            .prune_template_cache(Some(&ns))
            .await
            .expect("prune")
            >= 5
    );
    guard.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_step_is_typed_with_its_line_and_output() {
    let guard = Guard::new("template_fail");
    let runtime = backend().await;
    let name = unique("tpl-fail");
    let ns = namespace("fail");
    let mut req = request(
        &guard,
        &name,
        "FROM corral-test/busybox\nRUN echo first\nRUN echo broken-step-output >&2; exit 7\nRUN echo never\n",
        context(&[]),
    );
    req.namespace = Some(ns.clone());
    let (r, events) = build(&runtime, &req).await;
    match r {
        Err(Error::Build(b)) => {
            assert_eq!((b.step, b.line), (2, Some(3)));
            assert!(b.output.contains("broken-step-output"), "{}", b.output);
            assert!(b.detail.contains("exit code 7"), "{}", b.detail);
        }
        other => panic!("not a typed build failure: {other:?}"),
    }
    assert!(!steps(&events).iter().any(|(i, _)| *i == 3), "{events:?}");
    assert!(runtime
        .template(Some(&ns), &name)
        .await
        .expect("get")
        .is_none());
    runtime
        .prune_template_cache(Some(&ns))
        .await
        .expect("prune");
    guard.assert_clean();
}

/// The attack: a RUN step that tries what the daemon's own builder would
/// allow (making a device node, finding the daemon's socket, reaching the
/// host) gets a hardened corral sandbox instead: its agent is PID 1, its
/// capabilities are the hardened few, and with `network: none` nothing
/// is reachable.
#[tokio::test(flavor = "multi_thread")]
async fn a_build_step_runs_in_a_hardened_sandbox_not_the_daemons_builder() {
    let guard = Guard::new("template_attack");
    let runtime = backend().await;
    let name = unique("tpl-attack");
    let ns = namespace("attack");
    let mut req = request(
        &guard,
        &name,
        "FROM corral-test/busybox\n\
         RUN if mknod /tmp/dev c 1 3 2>/dev/null; then echo MKNOD; fi; \
             if [ -e /var/run/docker.sock ]; then echo SOCKET; fi; \
             if wget -q -T 2 -O- http://172.17.0.1/ 2>/dev/null; then echo HOST; fi; \
             tr '\\0' ' ' < /proc/1/cmdline > /pid1; grep CapEff /proc/self/status > /caps\n",
        context(&[]),
    );
    req.namespace = Some(ns.clone());
    let (r, events) = build(&runtime, &req).await;
    let t = r.expect("the build");
    let printed: String = events
        .iter()
        .filter_map(|e| match e {
            BuildEvent::Output { text, .. } => Some(text.clone()),
            _ => None,
        })
        .collect();
    assert!(
        !printed.contains("MKNOD") && !printed.contains("SOCKET") && !printed.contains("HOST"),
        "{printed}"
    );
    let mut spec = guard.spec(BUSYBOX);
    t.apply(&mut spec);
    let sb = runtime.create(&spec).await.expect("sandbox");
    let seen = out(&sb, "cat /pid1; echo; cat /caps").await;
    assert!(
        seen.contains("corral-agent"),
        "PID 1 of the step was not corral's agent: {seen}"
    );
    assert!(!seen.contains("CapEff:\t000001ffffffffff"), "{seen}");
    sb.destroy().await.expect("destroy");

    // Another namespace finds nothing of it, by name or by image.
    let mut theirs = request(&guard, &unique("tpl-b"), "FROM x\n", context(&[]));
    let bob = namespace("attack-bob");
    theirs.namespace = Some(bob.clone());
    theirs.recipe.from = format!("template:{name}");
    let (r, _) = build(&runtime, &theirs).await;
    assert!(
        matches!(r, Err(Error::InvalidSpec(ref e)) if e.reason.contains("no such template")),
        "{r:?}"
    );
    theirs.recipe.from = t.image.clone();
    let (r, _) = build(&runtime, &theirs).await;
    assert!(
        matches!(r, Err(Error::InvalidSpec(ref e)) if e.field == "from"),
        "{r:?}"
    );
    assert!(runtime
        .template(Some(&bob), &name)
        .await
        .expect("get")
        .is_none());
    assert!(!runtime
        .delete_template(Some(&bob), &name)
        .await
        .expect("delete"));
    assert!(runtime
        .template(Some(&ns), &name)
        .await
        .expect("get")
        .is_some());
    assert!(runtime
        .delete_template(Some(&ns), &name)
        .await
        .expect("delete"));
    runtime
        .prune_template_cache(Some(&ns))
        .await
        .expect("prune");
    guard.assert_clean();
}
