//! Every relative link and `#anchor` in the README, ARCHITECTURE.md, the
//! Python client's README and the book (`docs/book/src`) resolves: the file
//! exists, and an anchor names a heading of the file it points into (as
//! GitHub and mdBook spell heading ids). mdBook's `{{#include}}` paths are
//! checked too. Links to other sites are not fetched.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![
        root.join("README.md"),
        root.join("ARCHITECTURE.md"),
        root.join("clients/python/README.md"),
    ];
    let mut dirs = vec![root.join("docs/book/src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read the book's sources") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The text outside fenced code blocks and inline code spans.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            out.push('\n');
            continue;
        }
        if fenced {
            out.push('\n');
            continue;
        }
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
            } else if !in_code {
                out.push(c);
            }
        }
        out.push('\n');
    }
    out
}

/// Targets of `[text](target)` and `![alt](target)` links.
fn links(text: &str) -> Vec<String> {
    let prose = prose(text);
    let mut out = Vec::new();
    let mut rest = prose.as_str();
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            let target = rest[..end].split_whitespace().next().unwrap_or("");
            out.push(target.to_string());
            rest = &rest[end..];
        }
    }
    out
}

/// `{{#include PATH}}` paths, fenced blocks included.
fn includes(text: &str) -> Vec<String> {
    text.match_indices("{{#include ")
        .filter_map(|(i, _)| {
            let rest = &text[i + "{{#include ".len()..];
            let end = rest.find("}}")?;
            Some(
                rest[..end]
                    .split(':')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_string(),
            )
        })
        .collect()
}

/// A heading's id as GitHub and mdBook make it: lowercase, spaces to
/// hyphens, punctuation other than `-` and `_` dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if !fenced && line.starts_with('#') {
            let heading = line.trim_start_matches('#').replace('`', "");
            let base = slug(&heading);
            // Repeated headings get -1, -2, ... on both sites.
            let mut id = base.clone();
            let mut n = 0;
            while out.contains(&id) {
                n += 1;
                id = format!("{base}-{n}");
            }
            out.insert(id);
        }
    }
    out
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let root = workspace_root();
    let book = root
        .join("docs/book/src")
        .canonicalize()
        .expect("the book's sources");
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in markdown_files(&root) {
        let text = std::fs::read_to_string(&file).expect("read markdown");
        let dir = file.parent().expect("parent");
        let shown = file
            .strip_prefix(&root)
            .unwrap_or(&file)
            .display()
            .to_string();
        for target in includes(&text) {
            checked += 1;
            if !dir.join(&target).exists() {
                broken.push(format!("{shown}: include {target} does not exist"));
            }
        }
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
                continue;
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let linked = if path.is_empty() {
                file.clone()
            } else {
                dir.join(path)
            };
            if !linked.exists() {
                broken.push(format!(
                    "{shown}: {target}: {} does not exist",
                    linked.display()
                ));
                continue;
            }
            // The rendered book holds only docs/book/src: a link out of it
            // works in the repository view and is dead in the HTML.
            let inside = |p: &Path| p.canonicalize().is_ok_and(|p| p.starts_with(&book));
            if inside(&file) && !inside(&linked) {
                broken.push(format!(
                    "{shown}: {target}: leaves docs/book/src (dead in the rendered book; \
                     name the file as code, or include it)"
                ));
                continue;
            }
            if let Some(anchor) = anchor {
                let linked_text = std::fs::read_to_string(&linked).unwrap_or_default();
                if !anchors(&linked_text).contains(anchor) {
                    broken.push(format!("{shown}: {target}: no heading #{anchor}"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(
        checked > 50,
        "only {checked} links found: is the scan broken?"
    );
}

#[test]
fn the_checker_sees_links_anchors_and_code() {
    let text = "# A `b` C!\n\n[x](y.md#a-b-c) `[not](a link)`\n```\n[no](pe)\n```\n![i](img.png)\n";
    assert_eq!(links(text), ["y.md#a-b-c", "img.png"]);
    assert!(anchors(text).contains("a-b-c"));
    assert_eq!(
        slug("Egress by name: allowed destinations"),
        "egress-by-name-allowed-destinations"
    );
}

#[test]
fn the_front_door_stays_short() {
    // The README is one screen and a table; ARCHITECTURE.md a map. Detail
    // belongs in the book.
    let root = workspace_root();
    for (file, most) in [("README.md", 200), ("ARCHITECTURE.md", 300)] {
        let lines = std::fs::read_to_string(root.join(file))
            .expect("read")
            .lines()
            .count();
        assert!(
            lines <= most,
            "{file} has {lines} lines, more than {most}: move detail into docs/book"
        );
    }
}
