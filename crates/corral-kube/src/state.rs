//! What a pod's status means for corral: its sandbox's [`ContainerState`],
//! whether a start is done, still under way or failed (typed), and whether
//! a watched sandbox died.
//!
//! Pure: read from the pod object alone, so every outcome is unit-tested
//! with the status the kubelet and the scheduler write.

use corral_core::{ContainerState, ContainerStatus, Error};
use k8s_openapi::api::core::v1::{ContainerStatus as K8sContainerStatus, Pod};

use crate::pod::{AGENT_INIT_CONTAINER, SANDBOX_CONTAINER};

/// Waiting reasons that mean the image cannot be had.
pub(crate) const IMAGE_REASONS: [&str; 5] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "ImageInspectError",
];

/// Waiting reasons that mean the container will never be made as asked.
const CONFIG_REASONS: [&str; 3] = [
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

fn container_status<'a>(pod: &'a Pod, name: &str, init: bool) -> Option<&'a K8sContainerStatus> {
    let status = pod.status.as_ref()?;
    let list = if init {
        status.init_container_statuses.as_ref()
    } else {
        status.container_statuses.as_ref()
    };
    list?.iter().find(|c| c.name == name)
}

/// The pod's own reason for failing (`Evicted`, `Preempting`, `NodeLost`,
/// `DeadlineExceeded`) with its message.
fn pod_reason(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    let reason = status.reason.as_deref().filter(|r| !r.is_empty())?;
    Some(match status.message.as_deref().filter(|m| !m.is_empty()) {
        Some(m) => format!("{reason}: {m}"),
        None => reason.to_string(),
    })
}

/// The sandbox's state as the pod tells it; `None` (no such pod) is
/// `removed`.
pub fn container_state(name: &str, pod: Option<&Pod>) -> ContainerState {
    let mut state = ContainerState {
        id: name.to_string(),
        ..Default::default()
    };
    let Some(pod) = pod else {
        state.status = ContainerStatus::Removed;
        return state;
    };
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("");
    let sandbox = container_status(pod, SANDBOX_CONTAINER, false);
    state.restart_count = sandbox.map(|c| i64::from(c.restart_count));
    let cs = sandbox.and_then(|c| c.state.as_ref());
    state.status = if let Some(t) = cs.and_then(|s| s.terminated.as_ref()) {
        state.exit_code = Some(i64::from(t.exit_code));
        state.oom_killed = t.reason.as_deref() == Some("OOMKilled");
        state.error =
            t.reason
                .clone()
                .map(|r| match t.message.as_deref().filter(|m| !m.is_empty()) {
                    Some(m) => format!("{r}: {m}"),
                    None => r,
                });
        ContainerStatus::Exited
    } else if cs.and_then(|s| s.running.as_ref()).is_some() {
        ContainerStatus::Running
    } else if let Some(w) = cs.and_then(|s| s.waiting.as_ref()) {
        state.error = w.reason.clone();
        ContainerStatus::Created
    } else {
        match phase {
            "Pending" | "" => ContainerStatus::Created,
            "Running" => ContainerStatus::Running,
            "Succeeded" | "Failed" => ContainerStatus::Exited,
            _ => ContainerStatus::Unknown,
        }
    };
    // Evicted, preempted, node lost: the pod failed whatever its
    // container last said (a lost node never reports the container).
    if phase == "Failed" {
        if let Some(reason) = pod_reason(pod) {
            state.error = Some(reason);
            state.status = ContainerStatus::Exited;
        }
    }
    if pod.metadata.deletion_timestamp.is_some() && state.status.is_running() {
        state.status = ContainerStatus::Removing;
    }
    state
}

/// Where a start stands.
#[derive(Debug)]
pub enum Progress {
    /// The agent runs as PID 1.
    Running,
    /// Not yet: scheduling, pulling, the init container.
    Pending,
    /// It will not run; the pod should be removed.
    Failed(Error),
}

/// The kubelet's back-off after a failed pull says only that it waits
/// (`Back-off pulling image "x"`); the cause is in the pod's events.
pub(crate) const PULL_BACKOFF: &str = "ImagePullBackOff";

/// A pull that failed on the node, typed as a Docker pull is
/// ([`corral_core::image_pull`]): a name or tag the registry lacks (or
/// refuses) is `image_not_found`; an unreachable or failing registry is
/// retryable. `message` is the waiting message or, for a back-off, the
/// pod event that gave the cause.
pub fn image_error(image: &str, reason: &str, message: &str) -> Error {
    use corral_core::image_pull::{classify, PullCause};
    let unusable = matches!(
        reason,
        "InvalidImageName" | "ErrImageNeverPull" | "ImageInspectError"
    );
    if unusable || classify(None, message) == PullCause::NotFound {
        return Error::ImageNotFound {
            image: image.to_string(),
            reason: format!("{reason}: {message}"),
        };
    }
    Error::Engine {
        op: format!("pull image {image} on the node"),
        kind: corral_core::FailureKind::DaemonUnavailable,
        source: format!("{reason}: {message}").into(),
    }
}

/// The waiting reason of the container that pulls `image` in `pod`, when
/// it is the kubelet's pull back-off.
pub fn pull_backoff(pod: &Pod) -> bool {
    [(AGENT_INIT_CONTAINER, true), (SANDBOX_CONTAINER, false)]
        .iter()
        .filter_map(|(name, init)| container_status(pod, name, *init))
        .filter_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.as_deref())
        .any(|r| r == PULL_BACKOFF)
}

/// Where the start of `sandbox` (pod `name` from image `image`, agent from
/// `agent_image`) stands, from its pod.
pub fn start_progress(sandbox: &str, image: &str, agent_image: &str, pod: &Pod) -> Progress {
    let lost = |pod: &Pod| {
        Progress::Failed(Error::ContainerLost {
            sandbox: sandbox.to_string(),
            state: Box::new(container_state(
                pod.metadata.name.as_deref().unwrap_or_default(),
                Some(pod),
            )),
        })
    };
    if pod.metadata.deletion_timestamp.is_some() {
        return lost(pod);
    }
    for (container, init, img) in [
        (AGENT_INIT_CONTAINER, true, agent_image),
        (SANDBOX_CONTAINER, false, image),
    ] {
        let Some(state) = container_status(pod, container, init).and_then(|c| c.state.as_ref())
        else {
            continue;
        };
        if let Some(w) = &state.waiting {
            let reason = w.reason.as_deref().unwrap_or_default();
            let message = w.message.clone().unwrap_or_default();
            if IMAGE_REASONS.contains(&reason) {
                return Progress::Failed(image_error(img, reason, &message));
            }
            if CONFIG_REASONS.contains(&reason) {
                return Progress::Failed(Error::Unsupported {
                    what: format!(
                        "container {container} of sandbox {sandbox} cannot be made: {reason}: {message}"
                    ),
                });
            }
        }
        if let Some(t) = &state.terminated {
            if !init || t.exit_code != 0 {
                if init {
                    return Progress::Failed(Error::Agent {
                        sandbox: sandbox.to_string(),
                        message: format!(
                            "the init container copying the agent from {agent_image} exited with {}: {}",
                            t.exit_code,
                            t.message.as_deref().or(t.reason.as_deref()).unwrap_or("no message")
                        ),
                    });
                }
                return lost(pod);
            }
        }
        if !init && state.running.is_some() {
            return Progress::Running;
        }
    }
    let status = pod.status.as_ref();
    if let Some(cond) = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"))
    {
        if cond.status == "False" && cond.reason.as_deref() == Some("Unschedulable") {
            return Progress::Failed(Error::Capacity {
                sandbox: sandbox.to_string(),
                message: cond
                    .message
                    .clone()
                    .unwrap_or_else(|| "unschedulable".into()),
            });
        }
    }
    match status.and_then(|s| s.phase.as_deref()) {
        Some("Failed" | "Succeeded") => lost(pod),
        _ => Progress::Pending,
    }
}

/// How a watched sandbox died, when its pod says it did: PID 1 exited,
/// the pod failed or is being deleted. `None` while it lives.
pub fn death(pod: &Pod) -> Option<String> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    if pod.metadata.deletion_timestamp.is_some() {
        return Some(format!("pod {name} is being deleted"));
    }
    let state = container_state(name, Some(pod));
    if state.status == ContainerStatus::Exited {
        return Some(format!("pod {name}: {state}"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState as K8sState, ContainerStateRunning, ContainerStateTerminated,
        ContainerStateWaiting, PodCondition, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn pod_with(status: PodStatus) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("corral-sb-1-x".into()),
                ..Default::default()
            },
            spec: None,
            status: Some(status),
        }
    }

    fn cs(name: &str, state: K8sState) -> K8sContainerStatus {
        K8sContainerStatus {
            name: name.into(),
            state: Some(state),
            restart_count: 0,
            ..Default::default()
        }
    }

    fn terminated(code: i32, reason: &str) -> K8sState {
        K8sState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                reason: Some(reason.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn waiting(reason: &str, message: &str) -> K8sState {
        K8sState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.into()),
                message: Some(message.into()),
            }),
            ..Default::default()
        }
    }

    fn running() -> K8sState {
        K8sState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        }
    }

    fn sandbox_pod(phase: &str, state: K8sState) -> Pod {
        pod_with(PodStatus {
            phase: Some(phase.into()),
            container_statuses: Some(vec![cs(SANDBOX_CONTAINER, state)]),
            ..Default::default()
        })
    }

    fn progress(pod: &Pod) -> Progress {
        start_progress("sb-1", "img:1", "corral-agent:1", pod)
    }

    #[test]
    fn oom_comes_from_the_terminated_reason() {
        let s = container_state(
            "p",
            Some(&sandbox_pod("Failed", terminated(137, "OOMKilled"))),
        );
        assert_eq!(s.status, ContainerStatus::Exited);
        assert_eq!(s.exit_code, Some(137));
        assert!(s.oom_killed);
        // A plain SIGKILL is not an OOM, whatever its exit code.
        let s = container_state("p", Some(&sandbox_pod("Failed", terminated(137, "Error"))));
        assert!(!s.oom_killed);
        assert_eq!(s.error.as_deref(), Some("Error"));
    }

    #[test]
    fn states_follow_the_sandbox_container() {
        assert_eq!(container_state("p", None).status, ContainerStatus::Removed);
        let r = container_state("p", Some(&sandbox_pod("Running", running())));
        assert_eq!((r.status, r.id.as_str()), (ContainerStatus::Running, "p"));
        let w = container_state(
            "p",
            Some(&sandbox_pod("Pending", waiting("ContainerCreating", ""))),
        );
        assert_eq!(w.status, ContainerStatus::Created);
        assert_eq!(w.error.as_deref(), Some("ContainerCreating"));
        let bare = pod_with(PodStatus {
            phase: Some("Pending".into()),
            ..Default::default()
        });
        assert_eq!(
            container_state("p", Some(&bare)).status,
            ContainerStatus::Created
        );
        let mut deleting = sandbox_pod("Running", running());
        deleting.metadata.deletion_timestamp = Some(Time(Default::default()));
        assert_eq!(
            container_state("p", Some(&deleting)).status,
            ContainerStatus::Removing
        );
        assert!(death(&deleting).is_some());
        assert!(death(&sandbox_pod("Running", running())).is_none());
        assert!(death(&sandbox_pod("Failed", terminated(1, "Error"))).is_some());
    }

    #[test]
    fn eviction_and_node_loss_are_a_lost_container_with_the_reason() {
        let evicted = pod_with(PodStatus {
            phase: Some("Failed".into()),
            reason: Some("Evicted".into()),
            message: Some("The node was low on resource: memory.".into()),
            ..Default::default()
        });
        let s = container_state("p", Some(&evicted));
        assert_eq!(s.status, ContainerStatus::Exited);
        assert!(!s.oom_killed);
        assert_eq!(
            s.error.as_deref(),
            Some("Evicted: The node was low on resource: memory.")
        );
        let lost = Error::ContainerLost {
            sandbox: "sb".into(),
            state: Box::new(s),
        };
        assert_eq!(lost.kind(), corral_core::FailureKind::ContainerLost);
        assert!(lost.to_string().contains("Evicted"));
        assert!(death(&evicted).is_some_and(|d| d.contains("Evicted")));
    }

    #[test]
    fn a_pull_that_cannot_reach_its_registry_is_retryable() {
        let pod = sandbox_pod(
            "Pending",
            waiting(
                "ErrImagePull",
                "failed to pull and unpack image \"r:5000/x:1\": failed to do request: Head \"http://r:5000/v2/x/manifests/1\": dial tcp 10.0.0.9:5000: connect: connection refused",
            ),
        );
        match progress(&pod) {
            Progress::Failed(e) => {
                assert_eq!(e.kind(), corral_core::FailureKind::DaemonUnavailable, "{e}");
                assert!(e.retryable() && e.to_string().contains("img:1"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        // The back-off alone says nothing of the cause: the event does.
        let backoff = sandbox_pod(
            "Pending",
            waiting("ImagePullBackOff", "Back-off pulling image \"img:1\""),
        );
        assert!(pull_backoff(&backoff));
        let e = image_error("img:1", "ImagePullBackOff", "Failed to pull image \"img:1\": rpc error: code = NotFound desc = failed to pull and unpack image \"docker.io/library/img:1\": failed to resolve reference: docker.io/library/img:1: not found");
        assert_eq!(e.kind(), corral_core::FailureKind::ImageNotFound, "{e}");
        assert!(!pull_backoff(&sandbox_pod(
            "Pending",
            waiting("ErrImagePull", "x")
        )));
    }

    #[test]
    fn image_pull_failures_are_image_not_found() {
        for reason in ["ErrImagePull", "ImagePullBackOff"] {
            let pod = sandbox_pod("Pending", waiting(reason, "pull access denied"));
            match progress(&pod) {
                Progress::Failed(e @ Error::ImageNotFound { .. }) => {
                    let text = e.to_string();
                    assert!(text.contains("img:1") && text.contains(reason), "{text}");
                }
                other => panic!("{reason}: {other:?}"),
            }
        }
        // The agent's image missing names the agent's image.
        let pod = pod_with(PodStatus {
            phase: Some("Pending".into()),
            init_container_statuses: Some(vec![cs(
                AGENT_INIT_CONTAINER,
                waiting("ImagePullBackOff", "not found"),
            )]),
            ..Default::default()
        });
        match progress(&pod) {
            Progress::Failed(Error::ImageNotFound { image, .. }) => {
                assert_eq!(image, "corral-agent:1")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unschedulable_is_a_retryable_capacity_failure_with_the_message() {
        let pod = pod_with(PodStatus {
            phase: Some("Pending".into()),
            conditions: Some(vec![PodCondition {
                type_: "PodScheduled".into(),
                status: "False".into(),
                reason: Some("Unschedulable".into()),
                message: Some("0/3 nodes are available: 3 Insufficient memory.".into()),
                ..Default::default()
            }]),
            ..Default::default()
        });
        match progress(&pod) {
            Progress::Failed(e @ Error::Capacity { .. }) => {
                assert!(e.retryable());
                assert!(e.to_string().contains("3 Insufficient memory"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn starts_wait_run_or_fail_typed() {
        assert!(matches!(
            progress(&sandbox_pod("Running", running())),
            Progress::Running
        ));
        assert!(matches!(
            progress(&sandbox_pod("Pending", waiting("ContainerCreating", ""))),
            Progress::Pending
        ));
        assert!(matches!(
            progress(&pod_with(PodStatus::default())),
            Progress::Pending
        ));
        match progress(&sandbox_pod("Failed", terminated(137, "OOMKilled"))) {
            Progress::Failed(e) => assert_eq!(e.kind(), corral_core::FailureKind::OomKilled),
            other => panic!("{other:?}"),
        }
        match progress(&sandbox_pod(
            "Pending",
            waiting("CreateContainerConfigError", "runAsNonRoot"),
        )) {
            Progress::Failed(e @ Error::Unsupported { .. }) => {
                assert!(e.to_string().contains("runAsNonRoot"))
            }
            other => panic!("{other:?}"),
        }
        let init_failed = pod_with(PodStatus {
            phase: Some("Failed".into()),
            init_container_statuses: Some(vec![cs(AGENT_INIT_CONTAINER, terminated(2, "Error"))]),
            ..Default::default()
        });
        match progress(&init_failed) {
            Progress::Failed(e @ Error::Agent { .. }) => {
                assert!(e.to_string().contains("corral-agent:1"))
            }
            other => panic!("{other:?}"),
        }
        // A finished init container is progress, not failure.
        let init_done = pod_with(PodStatus {
            phase: Some("Pending".into()),
            init_container_statuses: Some(vec![cs(
                AGENT_INIT_CONTAINER,
                terminated(0, "Completed"),
            )]),
            ..Default::default()
        });
        assert!(matches!(progress(&init_done), Progress::Pending));
    }
}
