//! The book's configuration reference (`docs/book/src/reference/config.md`)
//! is generated from the example configuration, `examples/corral.yaml`,
//! which another test keeps equal to the built-in defaults: every key, its
//! default and the comments that explain it. This test fails when the page
//! is stale; `CORRAL_UPDATE_CONFIG_REFERENCE=1 cargo test -p corral-core
//! --test config_reference` rewrites it.

use std::path::PathBuf;

use corral_core::config::EXAMPLE_YAML;

const PAGE: &str = "docs/book/src/reference/config.md";

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One top-level key of the example file: the comment lines just above it,
/// and its own lines (the key line, what is nested under it, and commented
/// examples that follow it).
struct Section {
    key: String,
    about: Vec<String>,
    lines: Vec<String>,
}

/// A comment line's text without its `#` and one following space.
fn uncomment(line: &str) -> &str {
    let t = line.trim_start().trim_start_matches('#');
    t.strip_prefix(' ').unwrap_or(t)
}

/// `name: value  # note` split into its parts; `None` for list items,
/// comments and anything that is not a key.
fn key_line(line: &str) -> Option<(usize, &str, &str, &str)> {
    let indent = line.len() - line.trim_start().len();
    let t = line.trim_start();
    if t.starts_with('#') || t.starts_with('-') {
        return None;
    }
    let (name, rest) = t.split_once(':')?;
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return None;
    }
    let (value, note) = match rest.find(" #") {
        Some(i) => (rest[..i].trim(), uncomment(&rest[i + 1..]).trim()),
        None => (rest.trim(), ""),
    };
    Some((indent, name, value, note))
}

fn parse(text: &str) -> (Vec<String>, Vec<Section>) {
    let lines: Vec<&str> = text.lines().collect();
    // The file's own header: the first comment block.
    let mut header = Vec::new();
    let mut i = 0;
    while i < lines.len() && lines[i].starts_with('#') {
        header.push(uncomment(lines[i]).to_string());
        i += 1;
    }
    let mut sections: Vec<Section> = Vec::new();
    let mut pending: Vec<String> = Vec::new();
    for line in &lines[i..] {
        let top_level_key = !line.starts_with([' ', '#']) && !line.is_empty();
        if top_level_key {
            let (key, _) = line.split_once(':').unwrap_or((line, ""));
            sections.push(Section {
                key: key.to_string(),
                about: std::mem::take(&mut pending),
                lines: vec![line.to_string()],
            });
        } else if line.starts_with('#') {
            pending.push(line.to_string());
        } else if line.is_empty() {
            // A blank line ends a section's trailing commented example; a
            // comment block after it describes the next key.
            if let Some(s) = sections.last_mut() {
                s.lines.append(&mut pending);
            }
        } else if let Some(s) = sections.last_mut() {
            s.lines.append(&mut pending);
            s.lines.push(line.to_string());
        }
    }
    if let Some(s) = sections.last_mut() {
        s.lines.append(&mut pending);
    }
    for s in &mut sections {
        s.about = s.about.iter().map(|l| uncomment(l).to_string()).collect();
        while s.lines.last().is_some_and(|l| l.trim().is_empty()) {
            s.lines.pop();
        }
    }
    (header, sections)
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

fn render(text: &str) -> String {
    let (header, sections) = parse(text);
    let mut out = String::new();
    out.push_str("# Configuration reference\n\n");
    out.push_str(
        "<!-- Generated from examples/corral.yaml by crates/corral-core/tests/config_reference.rs; \
         do not edit. Rewrite with CORRAL_UPDATE_CONFIG_REFERENCE=1 cargo test -p corral-core \
         --test config_reference. -->\n\n",
    );
    out.push_str(&header.join("\n"));
    out.push_str("\n\n`corral config example` prints the whole file; each key follows.\n");
    for s in &sections {
        out.push_str(&format!("\n## `{}`\n\n", s.key));
        if !s.about.is_empty() {
            out.push_str(&s.about.join("\n"));
            out.push_str("\n\n");
        }
        // The nested keys, by dotted path, with their defaults and notes.
        let mut rows = Vec::new();
        let mut path: Vec<(usize, String)> = Vec::new();
        let mut notes: Vec<String> = Vec::new();
        for line in &s.lines[1..] {
            let trimmed = line.trim_start();
            if line.starts_with(' ') && trimmed.starts_with('#') {
                notes.push(uncomment(trimmed).to_string());
                continue;
            }
            let Some((indent, name, value, note)) = key_line(line) else {
                notes.clear();
                continue;
            };
            while path.last().is_some_and(|(i, _)| *i >= indent) {
                path.pop();
            }
            path.push((indent, name.to_string()));
            let dotted = std::iter::once(s.key.as_str())
                .chain(path.iter().map(|(_, n)| n.as_str()))
                .collect::<Vec<_>>()
                .join(".");
            let mut meaning = std::mem::take(&mut notes).join(" ");
            if !note.is_empty() {
                if !meaning.is_empty() {
                    meaning.push(' ');
                }
                meaning.push_str(note);
            }
            let default = if value.is_empty() {
                String::new()
            } else {
                format!("`{value}`")
            };
            rows.push(format!(
                "| `{dotted}` | {} | {} |",
                cell(&default),
                cell(&meaning)
            ));
        }
        if !rows.is_empty() {
            out.push_str("| Key | Default | Meaning |\n|---|---|---|\n");
            out.push_str(&rows.join("\n"));
            out.push_str("\n\n");
        }
        out.push_str("```yaml\n");
        out.push_str(&s.lines.join("\n"));
        out.push_str("\n```\n");
    }
    out
}

#[test]
fn the_config_reference_is_generated_from_the_example_file() {
    let page = workspace_root().join(PAGE);
    let want = render(EXAMPLE_YAML);
    if std::env::var_os("CORRAL_UPDATE_CONFIG_REFERENCE").is_some() {
        std::fs::write(&page, &want).expect("write the config reference");
        return;
    }
    let have = std::fs::read_to_string(&page).unwrap_or_default();
    assert!(
        have == want,
        "{PAGE} is stale (examples/corral.yaml changed): rewrite it with \
         CORRAL_UPDATE_CONFIG_REFERENCE=1 cargo test -p corral-core --test config_reference"
    );
}

#[test]
fn every_top_level_key_of_the_example_has_a_section() {
    let (_, sections) = parse(EXAMPLE_YAML);
    let keys: Vec<&str> = sections.iter().map(|s| s.key.as_str()).collect();
    for key in [
        "backend",
        "endpoint",
        "daemon",
        "defaults",
        "profiles",
        "provider",
        "server",
        "kubernetes",
    ] {
        assert!(keys.contains(&key), "no section for {key}: {keys:?}");
    }
    let page = render(EXAMPLE_YAML);
    // Nested keys land in the table under their dotted path.
    assert!(page.contains("| `daemon.retry.attempts` | `5` |"), "{page}");
    assert!(page.contains("| `server.policy.images` | `[]` |"), "{page}");
}
