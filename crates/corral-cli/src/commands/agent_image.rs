//! `corral agent-image`: the image the Kubernetes backend's init container
//! copies the agent from, and how to get it to a cluster's nodes.
//!
//! This binary embeds the static agent (`corral::agent`: the same bytes
//! every backend puts into its sandboxes), so it can write the image itself, as an
//! image archive in `docker save`'s format (one layer holding
//! `/corral-agent`), with no daemon and no registry: `docker load`,
//! `kind load image-archive`, `ctr images import` and `skopeo copy
//! docker-archive:` all read it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use corral_core::config::Config;
use sha2::{Digest, Sha256};

/// Print or save the agent image a cluster's nodes need.
///
/// Print how to make the agent image (`kubernetes.agent_image`, default
/// corral-agent:<version>) reachable for a cluster's nodes; with --save,
/// write it as an image archive (docker save format, FROM scratch with the
/// static agent embedded in this binary) that `docker load`, `kind load
/// image-archive`, `ctr images import` and `skopeo copy docker-archive:`
/// accept. Needs no daemon and no registry.
#[derive(Args, Debug)]
pub struct AgentImageArgs {
    /// Write the image archive to FILE.
    #[arg(long, value_name = "FILE")]
    save: Option<PathBuf>,
    /// The image reference to tag it with [default: the config's
    /// kubernetes.agent_image, else corral-agent:<version>].
    #[arg(long, value_name = "REF")]
    tag: Option<String>,
}

pub fn run(settings: &Config, args: AgentImageArgs) -> anyhow::Result<ExitCode> {
    let tag = args
        .tag
        .or_else(|| settings.kubernetes.agent_image.clone())
        .unwrap_or_else(corral_kube::default_agent_image);
    if tag.trim().is_empty() || tag.chars().any(char::is_whitespace) {
        anyhow::bail!("invalid --tag '{tag}': expected an image reference such as registry.example/corral-agent:0.1.0");
    }
    let agent = corral::agent::BINARY;
    match &args.save {
        Some(file) => {
            let bytes = archive(&tag, agent)?;
            write_file(file, &bytes)?;
            println!(
                "wrote {tag} ({} byte agent) to {}",
                agent.len(),
                file.display()
            );
            print_how(&tag, &file.display().to_string());
        }
        None => {
            println!("the Kubernetes backend's init container runs {tag} (kubernetes.agent_image)");
            print_how(&tag, "corral-agent.tar");
            println!("(write the archive with: corral agent-image --save corral-agent.tar)");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_how(tag: &str, file: &str) {
    println!("to get it to the nodes, one of:");
    println!(
        "  docker load -i {file} && docker tag {tag} REGISTRY/{tag} && docker push REGISTRY/{tag}"
    );
    println!("  skopeo copy docker-archive:{file} docker://REGISTRY/{tag}");
    println!("    (then set kubernetes.agent_image: REGISTRY/{tag})");
    println!("  kind load image-archive {file}            (a kind cluster)");
    println!("  ctr -n k8s.io images import {file}        (on each containerd node)");
}

fn write_file(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let mut f =
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The platform's architecture as image configs name it.
fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// A tar entry of `bytes` at `path` with `mode`, owned by root, dated at
/// the epoch (the archive is the same for the same agent).
fn append(
    builder: &mut tar::Builder<Vec<u8>>,
    path: &str,
    mode: u32,
    bytes: &[u8],
) -> std::io::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_size(bytes.len() as u64);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_cksum();
    builder.append_data(&mut header, path, bytes)
}

/// The image `tag` (FROM scratch, `/corral-agent` = `agent`, run as
/// nobody) as a `docker save` archive.
pub fn archive(tag: &str, agent: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut layer = tar::Builder::new(Vec::new());
    append(&mut layer, "corral-agent", 0o755, agent)?;
    let layer = layer.into_inner()?;
    let layer_id = hex(&Sha256::digest(&layer));
    let version = env!("CARGO_PKG_VERSION");
    let config = serde_json::json!({
        "architecture": oci_arch(),
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {
            "User": "65534:65534",
            "Entrypoint": ["/corral-agent"],
            "Labels": {"corral.version": version},
        },
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_id}")]},
        "history": [{
            "created": "1970-01-01T00:00:00Z",
            "created_by": format!("corral agent-image (corral-agent {version})"),
        }],
    });
    let config = serde_json::to_vec(&config)?;
    let config_name = format!("{}.json", hex(&Sha256::digest(&config)));
    let layer_path = format!("{layer_id}/layer.tar");
    let manifest = serde_json::to_vec(&serde_json::json!([{
        "Config": config_name,
        "RepoTags": [tag],
        "Layers": [layer_path],
    }]))?;
    let mut out = tar::Builder::new(Vec::new());
    append(&mut out, &layer_path, 0o644, &layer)?;
    append(&mut out, &config_name, 0o644, &config)?;
    append(&mut out, "manifest.json", 0o644, &manifest)?;
    Ok(out.into_inner()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_archive_holds_the_agent_a_config_and_a_manifest() {
        let bytes = archive("corral-agent:9", b"\x7fELF agent").expect("archive");
        let mut entries = std::collections::BTreeMap::new();
        let mut a = tar::Archive::new(&bytes[..]);
        for e in a.entries().expect("entries") {
            let mut e = e.expect("entry");
            let path = e.path().expect("path").display().to_string();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut data).expect("read");
            entries.insert(path, data);
        }
        let manifest: serde_json::Value =
            serde_json::from_slice(&entries["manifest.json"]).expect("manifest");
        assert_eq!(manifest[0]["RepoTags"][0], "corral-agent:9");
        let config_name = manifest[0]["Config"].as_str().expect("config");
        let config = &entries[config_name];
        // Named by its own digest, and the layer by its diff id.
        assert_eq!(
            config_name,
            format!("{}.json", hex(&Sha256::digest(config)))
        );
        let layer_path = manifest[0]["Layers"][0].as_str().expect("layer");
        let layer = &entries[layer_path];
        let parsed: serde_json::Value = serde_json::from_slice(config).expect("config json");
        assert_eq!(
            parsed["rootfs"]["diff_ids"][0],
            format!("sha256:{}", hex(&Sha256::digest(layer)))
        );
        assert_eq!(parsed["config"]["User"], "65534:65534");
        let mut inner = tar::Archive::new(&layer[..]);
        let mut files = inner.entries().expect("layer entries");
        let mut agent = files.next().expect("one file").expect("entry");
        assert_eq!(
            agent.path().expect("path").display().to_string(),
            "corral-agent"
        );
        assert_eq!(agent.header().mode().expect("mode"), 0o755);
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut agent, &mut data).expect("read");
        assert_eq!(data, b"\x7fELF agent");
        // The same agent gives the same archive.
        assert_eq!(
            archive("corral-agent:9", b"\x7fELF agent").expect("again"),
            bytes
        );
    }
}
