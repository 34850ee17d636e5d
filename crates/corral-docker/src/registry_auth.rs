//! Registry credentials for pulls, from a file the operator names
//! (`daemon.registry_auth_file`), never from a client: the `auths` section
//! of a Docker client configuration (`~/.docker/config.json` as
//! `docker login` writes it without a credential helper). Read at each
//! pull, so a rotated password applies without a restart.
//!
//! ```json
//! {"auths": {"registry.example:5000": {"auth": "<base64 of user:password>"},
//!            "https://index.docker.io/v1/": {"username": "u", "password": "p"}}}
//! ```

use std::collections::HashMap;
use std::path::Path;

use base64::Engine as _;
use bollard::auth::DockerCredentials;
use corral_core::image_ref::{Reference, DOCKER_HUB};
use serde::Deserialize;

#[derive(Deserialize)]
struct ConfigFile {
    #[serde(default)]
    auths: HashMap<String, Entry>,
}

#[derive(Deserialize, Default)]
struct Entry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    identitytoken: Option<String>,
    #[serde(default)]
    registrytoken: Option<String>,
}

/// The registry host an image reference is pulled from, as the engine
/// reads the reference ([`Reference::parse`]): Docker Hub only for a
/// reference an engine pulls from Docker Hub. A first component a newer
/// reference parser reads as a host (`Registry/x`, `Localhost/x`) is a
/// host here too, so the operator's Docker Hub credentials never go to it.
pub(crate) fn registry_of(image: &str) -> String {
    Reference::parse(image).registry
}

/// A key of `auths` as a bare host: `https://index.docker.io/v1/` →
/// `docker.io`, `http://reg:5000` → `reg:5000`.
fn host_of_key(key: &str) -> &str {
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let host = key.split('/').next().unwrap_or(key);
    match host {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => DOCKER_HUB,
        h => h,
    }
}

/// The credentials `file` holds for the registry of `image`, if any.
/// Fails (naming the file and what is wrong) when the file cannot be read
/// or parsed, or its entry for the registry is unusable.
pub(crate) fn credentials_for(
    file: &Path,
    image: &str,
) -> Result<Option<DockerCredentials>, String> {
    let text = std::fs::read_to_string(file).map_err(|e| {
        format!(
            "read registry credentials {} (daemon.registry_auth_file): {e}",
            file.display()
        )
    })?;
    credentials_in(&text, image).map_err(|e| {
        format!(
            "registry credentials {} (daemon.registry_auth_file): {e}",
            file.display()
        )
    })
}

/// [`credentials_for`] on the file's text.
fn credentials_in(text: &str, image: &str) -> Result<Option<DockerCredentials>, String> {
    let config: ConfigFile = serde_json::from_str(text)
        .map_err(|e| format!("not a Docker client configuration with `auths`: {e}"))?;
    let registry = registry_of(image);
    let Some((key, entry)) = config
        .auths
        .iter()
        .find(|(key, _)| host_of_key(key) == registry)
    else {
        return Ok(None);
    };
    let (mut username, mut password) = (entry.username.clone(), entry.password.clone());
    if let Some(auth) = entry.auth.as_deref().filter(|a| !a.is_empty()) {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .map_err(|e| format!("auths.\"{key}\".auth is not base64: {e}"))?;
        let decoded = String::from_utf8(decoded)
            .map_err(|_| format!("auths.\"{key}\".auth is not UTF-8 once decoded"))?;
        let (user, pass) = decoded
            .split_once(':')
            .ok_or_else(|| format!("auths.\"{key}\".auth is not base64 of `user:password`"))?;
        username = Some(user.to_string());
        password = Some(pass.to_string());
    }
    if username.is_none() && entry.identitytoken.is_none() && entry.registrytoken.is_none() {
        return Err(format!(
            "auths.\"{key}\" has neither `auth`, `username`/`password` nor a token"
        ));
    }
    Ok(Some(DockerCredentials {
        username,
        password,
        identitytoken: entry.identitytoken.clone(),
        registrytoken: entry.registrytoken.clone(),
        serveraddress: Some(registry),
        ..Default::default()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_is_the_first_component_when_it_names_a_host() {
        assert_eq!(registry_of("python:3.12"), "docker.io");
        assert_eq!(registry_of("library/python"), "docker.io");
        assert_eq!(registry_of("swe/instance:1"), "docker.io");
        assert_eq!(registry_of("127.0.0.1:5000/x:1"), "127.0.0.1:5000");
        assert_eq!(registry_of("ghcr.io/a/b"), "ghcr.io");
        assert_eq!(registry_of("localhost/x"), "localhost");
        assert_eq!(registry_of("docker.io/swe/x"), "docker.io");
        assert_eq!(registry_of("index.docker.io/library/x"), "docker.io");
    }

    #[test]
    fn docker_hub_credentials_go_to_docker_hub_only_however_a_name_is_spelled() {
        let file = r#"{"auths": {"https://index.docker.io/v1/": {"auth": "aHViOnNlY3JldA=="}}}"#;
        for hub in [
            "python:3.12",
            "library/python",
            "swe/x:1",
            "docker.io/swe/x",
            "index.docker.io/library/python",
        ] {
            let found = credentials_in(file, hub).expect("parses");
            assert_eq!(
                found.and_then(|c| c.serveraddress).as_deref(),
                Some("docker.io"),
                "{hub}"
            );
        }
        // Newer reference parsers read an upper-case first component as a
        // host: such a name is pulled from that host, never from Docker Hub.
        for elsewhere in [
            "Localhost/x",
            "Registry/x",
            "REGISTRY/x:1",
            "myRegistry/a/b",
            "Docker.IO/x",
            "localhost/x",
            "evil.example/library/python",
            "docker.io.evil.example/x",
            "127.0.0.1:5000/x",
        ] {
            assert!(
                matches!(credentials_in(file, elsewhere), Ok(None)),
                "Docker Hub's credentials offered for {elsewhere}"
            );
            assert_ne!(registry_of(elsewhere), DOCKER_HUB, "{elsewhere}");
        }
    }

    #[test]
    fn entries_match_by_host_in_every_spelling_docker_login_writes() {
        let file = r#"{"auths": {
            "https://index.docker.io/v1/": {"auth": "aHViOnNlY3JldA=="},
            "http://127.0.0.1:5000": {"username": "u", "password": "p"},
            "ghcr.io": {"identitytoken": "tok"}
        }, "credsStore": "desktop"}"#;
        let found = |image: &str| {
            credentials_in(file, image)
                .expect("the file parses")
                .expect("an entry for the registry")
        };
        let hub = found("python:3.12");
        assert_eq!(
            (hub.username.as_deref(), hub.password.as_deref()),
            (Some("hub"), Some("secret"))
        );
        assert_eq!(hub.serveraddress.as_deref(), Some("docker.io"));
        let local = found("127.0.0.1:5000/a/b:1");
        assert_eq!(local.username.as_deref(), Some("u"));
        let gh = found("ghcr.io/o/i");
        assert_eq!(gh.identitytoken.as_deref(), Some("tok"));
        assert!(matches!(credentials_in(file, "quay.io/x"), Ok(None)));
    }

    #[test]
    fn a_broken_file_or_entry_says_what_is_wrong() {
        let e = credentials_in("{", "x").expect_err("refused");
        assert!(e.contains("not a Docker client configuration"), "{e}");
        let e = credentials_in(r#"{"auths": {"r.io": {"auth": "%%%"}}}"#, "r.io/x")
            .expect_err("refused");
        assert!(e.contains("auths.\"r.io\".auth is not base64"), "{e}");
        let e = credentials_in(r#"{"auths": {"r.io": {"auth": "bm9jb2xvbg=="}}}"#, "r.io/x")
            .expect_err("refused");
        assert!(e.contains("user:password"), "{e}");
        let e = credentials_in(r#"{"auths": {"r.io": {}}}"#, "r.io/x").expect_err("refused");
        assert!(e.contains("has neither"), "{e}");
        let e =
            credentials_for(Path::new("/nonexistent/corral-auth.json"), "x").expect_err("refused");
        assert!(
            e.contains("/nonexistent/corral-auth.json") && e.contains("daemon.registry_auth_file"),
            "{e}"
        );
    }
}
