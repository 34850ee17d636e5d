//! Image references as an engine reads them: which registry a reference
//! is pulled from and which repository it names, however it is spelled
//! (`corral-snapshot:x`, `docker.io/library/corral-snapshot:x`,
//! `index.docker.io/...`, with or without a tag, with a digest).
//!
//! Two decisions hang on this reading, so it errs on the safe side of
//! each: the operator's Docker Hub credentials go only to references an
//! engine pulls from Docker Hub, and a reference into a snapshot
//! repository is a snapshot, whose owner decides who may start it
//! ([`crate::principal::Principal::may_name_image`]).

/// Docker Hub, as the registry of a reference without one.
pub const DOCKER_HUB: &str = "docker.io";

/// The repository every snapshot image is kept in on an engine that keeps
/// snapshots as images: `corral-snapshot:NAME` for the operator's,
/// `corral-snapshot/NAMESPACE:NAME` for a principal's.
pub const SNAPSHOT_REPOSITORY: &str = "corral-snapshot";

/// The parts of an image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// The registry host as written (with any port); [`DOCKER_HUB`] for
    /// Docker Hub, written or implied.
    pub registry: String,
    /// The repository within it, lower-case; on Docker Hub an official
    /// image's gets its `library/` (`python` is `library/python`).
    pub repository: String,
    /// The tag, when one is given.
    pub tag: Option<String>,
    /// The digest (`sha256:...`), when one is given.
    pub digest: Option<String>,
}

/// Docker Hub's other names, which engines read as Docker Hub.
const HUB_ALIASES: &[&str] = &[DOCKER_HUB, "index.docker.io", "registry-1.docker.io"];

/// Whether the first component of a reference names a registry host. Docker
/// reads one with a `.` or a `:`, or `localhost`, as a host; newer
/// reference parsers (distribution/reference 0.6) also one with an
/// upper-case letter (`Registry/x`), which Docker Hub never has. Both
/// readings are taken as a host here, so such a name never counts as
/// Docker Hub's.
fn is_host(first: &str) -> bool {
    first.contains(['.', ':'])
        || first.eq_ignore_ascii_case("localhost")
        || first.bytes().any(|b| b.is_ascii_uppercase())
}

impl Reference {
    /// Splits `image` into its parts. Nothing is validated: an engine
    /// refuses what is not a reference.
    pub fn parse(image: &str) -> Reference {
        let image = image.trim();
        let (name, digest) = match image.split_once('@') {
            Some((n, d)) => (n, Some(d.to_string())),
            None => (image, None),
        };
        let (registry, path) = match name.split_once('/') {
            Some((first, rest)) if is_host(first) => (first.to_string(), rest),
            _ => (DOCKER_HUB.to_string(), name),
        };
        let registry = if HUB_ALIASES.contains(&registry.as_str()) {
            DOCKER_HUB.to_string()
        } else {
            registry
        };
        // A tag follows the last component's `:`.
        let last = path.rfind('/').map_or(0, |i| i + 1);
        let (path, tag) = match path[last..].rfind(':') {
            Some(i) => (&path[..last + i], Some(path[last + i + 1..].to_string())),
            None => (path, None),
        };
        let mut repository = path.to_ascii_lowercase();
        if registry == DOCKER_HUB && !repository.contains('/') {
            repository = format!("library/{repository}");
        }
        Reference {
            registry,
            repository,
            tag,
            digest,
        }
    }

    /// Whether it is pulled from Docker Hub.
    pub fn is_docker_hub(&self) -> bool {
        self.registry == DOCKER_HUB
    }

    /// The snapshot repository it points into, if any: `Some(None)` for the
    /// operator's (`corral-snapshot`), `Some(Some(namespace))` for a
    /// principal's (`corral-snapshot/NAMESPACE`).
    pub fn snapshot_namespace(&self) -> Option<Option<String>> {
        if !self.is_docker_hub() {
            return None;
        }
        let repo = self.repository.as_str();
        if repo == format!("library/{SNAPSHOT_REPOSITORY}") {
            return Some(None);
        }
        repo.strip_prefix(SNAPSHOT_REPOSITORY)
            .and_then(|r| r.strip_prefix('/'))
            .map(|ns| Some(ns.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registries_are_read_as_an_engine_reads_them() {
        let registry = |i: &str| Reference::parse(i).registry;
        assert_eq!(registry("python:3.12"), DOCKER_HUB);
        assert_eq!(registry("library/python"), DOCKER_HUB);
        assert_eq!(registry("swe/instance:1"), DOCKER_HUB);
        assert_eq!(registry("docker.io/swe/instance:1"), DOCKER_HUB);
        assert_eq!(registry("index.docker.io/library/python"), DOCKER_HUB);
        assert_eq!(registry("127.0.0.1:5000/x:1"), "127.0.0.1:5000");
        assert_eq!(registry("ghcr.io/a/b"), "ghcr.io");
        assert_eq!(registry("localhost/x"), "localhost");
        // What newer parsers read as a host is never Docker Hub.
        assert_eq!(registry("Localhost/x"), "Localhost");
        assert_eq!(registry("Registry/x"), "Registry");
        assert_eq!(registry("LOCALHOST:5000/x"), "LOCALHOST:5000");
        // Engines compare registry names as written.
        assert_eq!(registry("Docker.IO/x"), "Docker.IO");
    }

    #[test]
    fn repositories_tags_and_digests() {
        let r = Reference::parse("docker.io/library/corral-snapshot:base");
        assert_eq!(r.repository, "library/corral-snapshot");
        assert_eq!(r.tag.as_deref(), Some("base"));
        let r = Reference::parse("127.0.0.1:5000/a/b:1@sha256:00");
        assert_eq!(
            (r.repository.as_str(), r.tag.as_deref(), r.digest.as_deref()),
            ("a/b", Some("1"), Some("sha256:00"))
        );
        let r = Reference::parse("busybox");
        assert_eq!((r.repository.as_str(), r.tag), ("library/busybox", None));
    }

    #[test]
    fn every_spelling_of_a_snapshot_repository_is_one() {
        for (image, ns) in [
            ("corral-snapshot:base", None),
            ("corral-snapshot", None),
            ("corral-snapshot@sha256:00", None),
            ("library/corral-snapshot:base", None),
            ("docker.io/corral-snapshot:base", None),
            ("docker.io/library/corral-snapshot:base", None),
            ("index.docker.io/library/corral-snapshot", None),
            ("corral-snapshot/alice:x", Some("alice")),
            ("corral-snapshot/alice", Some("alice")),
            ("docker.io/corral-snapshot/alice:x", Some("alice")),
            (
                "corral-snapshot/alice.mcp-01@sha256:00",
                Some("alice.mcp-01"),
            ),
        ] {
            assert_eq!(
                Reference::parse(image).snapshot_namespace(),
                Some(ns.map(str::to_string)),
                "{image}"
            );
        }
        for image in [
            "busybox",
            "corral-snapshots:x",
            "corral-snapshotx/alice:x",
            "library/corral-snapshot/alice:x",
            "127.0.0.1:5000/corral-snapshot:x",
            "alice/corral-snapshot:x",
        ] {
            assert_eq!(
                Reference::parse(image).snapshot_namespace(),
                None,
                "{image}"
            );
        }
    }
}
