//! Reading a container's state from the daemon into [`ContainerState`].

use bollard::query_parameters::InspectContainerOptions;
use bollard::Docker;
use corral_core::{ContainerState, ContainerStatus};

use corral_core::RetryPolicy;

use crate::error::is_not_found;
use crate::retry::retry;
use corral_core::Error;

/// The container's state; a container that no longer exists is reported with
/// status `removed`, not as an error.
pub async fn container_state(
    docker: &Docker,
    container: &str,
    policy: &RetryPolicy,
    retries: &std::sync::atomic::AtomicU64,
) -> Result<ContainerState, Error> {
    let what = format!("inspect container {container}");
    let inspect = retry(policy, retries, &what, || {
        docker.inspect_container(container, None::<InspectContainerOptions>)
    });
    match inspect.await {
        Ok(info) => {
            let s = info.state.unwrap_or_default();
            Ok(ContainerState {
                id: info.id.unwrap_or_else(|| container.to_string()),
                status: s
                    .status
                    .map(|st| ContainerStatus::parse(st.as_ref()))
                    .unwrap_or_default(),
                exit_code: if s.running == Some(true) {
                    None
                } else {
                    s.exit_code
                },
                oom_killed: s.oom_killed.unwrap_or(false),
                error: s.error.filter(|e| !e.is_empty()),
                restart_count: info.restart_count,
                log_tail: Vec::new(),
            })
        }
        Err(e) if is_not_found(&e) => Ok(ContainerState {
            id: container.to_string(),
            status: ContainerStatus::Removed,
            ..ContainerState::default()
        }),
        Err(e) => Err(crate::error::api(
            format!("inspect container {container}"),
            e,
        )),
    }
}

/// The last `lines` lines a container logged (stdout and stderr), best
/// effort: empty when the container is gone or the daemon says nothing.
pub async fn log_tail(docker: &Docker, container: &str, lines: usize) -> Vec<String> {
    use futures_util::StreamExt;
    let opts = bollard::query_parameters::LogsOptionsBuilder::default()
        .stdout(true)
        .stderr(true)
        .tail(&lines.to_string())
        .build();
    let mut stream = docker.logs(container, Some(opts));
    let mut text = String::new();
    let read = async {
        while let Some(Ok(chunk)) = stream.next().await {
            text.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
            if text.len() > 64 * 1024 {
                break;
            }
        }
    };
    // Never let diagnostics hold up the failure they decorate.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), read).await;
    text.lines()
        .map(|l| l.trim_end().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}
