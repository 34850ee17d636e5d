//! Finding and reaching a daemon: explicit endpoint, `DOCKER_HOST`, the
//! default socket, then Podman's well-known sockets.

use std::time::Duration;

use bollard::Docker;

use corral_core::Error;

/// How long a preflight ping may take before the endpoint counts as dead.
const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// Bound on every daemon request's wait for response headers. Streams (exec
/// output) are bounded by corral's own deadlines instead.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// The endpoints to try, in order: `explicit` if given (only it), else
/// `DOCKER_HOST`, else Docker's default socket and Podman's sockets.
pub fn candidate_endpoints(explicit: Option<&str>) -> Vec<String> {
    if let Some(e) = explicit.filter(|e| !e.is_empty()) {
        return vec![normalize(e)];
    }
    if let Ok(h) = std::env::var("DOCKER_HOST") {
        if !h.is_empty() {
            return vec![normalize(&h)];
        }
    }
    let mut out = vec!["unix:///var/run/docker.sock".to_string()];
    if let Ok(xdg) = std::env::var("XDG_RUNTIME_DIR") {
        out.push(format!("unix://{xdg}/podman/podman.sock"));
        out.push(format!("unix://{xdg}/docker.sock"));
    }
    let uid = own_uid();
    out.push(format!("unix:///run/user/{uid}/podman/podman.sock"));
    out.push("unix:///run/podman/podman.sock".to_string());
    out.dedup();
    out
}

fn own_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(0)
}

/// Accepts a bare socket path as `unix://` and `http://` as `tcp://`.
fn normalize(endpoint: &str) -> String {
    if endpoint.starts_with('/') {
        format!("unix://{endpoint}")
    } else {
        endpoint.to_string()
    }
}

fn client_for(endpoint: &str) -> Result<Docker, String> {
    let api = bollard::API_DEFAULT_VERSION;
    let secs = REQUEST_TIMEOUT.as_secs();
    if let Some(path) = endpoint.strip_prefix("unix://") {
        if !std::path::Path::new(path).exists() {
            return Err("no such socket".into());
        }
        Docker::connect_with_unix(endpoint, secs, api).map_err(|e| e.to_string())
    } else if endpoint.starts_with("tcp://") || endpoint.starts_with("http://") {
        Docker::connect_with_http(endpoint, secs, api).map_err(|e| e.to_string())
    } else {
        Err("unsupported scheme (expected unix://, tcp:// or an absolute socket path)".into())
    }
}

/// Connects to the first endpoint whose daemon answers a ping, negotiating the
/// API version. Fails fast, listing every endpoint tried and why it failed.
pub async fn connect(explicit: Option<&str>) -> Result<(Docker, String), Error> {
    let mut tried = Vec::new();
    for endpoint in candidate_endpoints(explicit) {
        let client = match client_for(&endpoint) {
            Ok(c) => c,
            Err(e) => {
                tried.push(format!("{endpoint}: {e}"));
                continue;
            }
        };
        match tokio::time::timeout(PING_TIMEOUT, client.ping()).await {
            Ok(Ok(_)) => {
                let client =
                    client
                        .negotiate_version()
                        .await
                        .map_err(|e| Error::EngineUnavailable {
                            engine: "Docker",
                            detail: format!("{endpoint}: version negotiation failed: {e}"),
                        })?;
                return Ok((client, endpoint));
            }
            Ok(Err(e)) => tried.push(format!("{endpoint}: {e}")),
            Err(_) => tried.push(format!("{endpoint}: no answer within {PING_TIMEOUT:?}")),
        }
    }
    Err(Error::EngineUnavailable {
        engine: "Docker",
        // What to do about it is the front end's to say (the CLI's
        // `help:` line), in its own terms.
        detail: format!("tried {}", tried.join("; ")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_endpoint_wins_and_paths_become_unix_urls() {
        assert_eq!(
            candidate_endpoints(Some("/tmp/x.sock")),
            ["unix:///tmp/x.sock"]
        );
        assert_eq!(candidate_endpoints(Some("tcp://h:2375")), ["tcp://h:2375"]);
    }
}
