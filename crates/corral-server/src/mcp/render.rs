//! Tool results as a model reads them: plain text first (exit code, output,
//! the typed failure), with the REST API's JSON shapes as structured
//! content for programs.

use std::fmt::Write;

use base64::Engine;
use corral::{DirEntry, EntryKind, SessionResult};
use corral_core::{CommandResult, Failure};
use rmcp::model::{CallToolResult, ContentBlock};

use crate::wire::{CommandOutcome, ResetBody, ShellOutcome};

/// Entries of a listing shown before the rest is only counted.
pub(super) const MAX_LISTED: usize = 1000;

/// A tool result with text and, when given, structured content; an error
/// result (`isError`) when `failed`.
fn result(text: String, structured: Option<serde_json::Value>, failed: bool) -> CallToolResult {
    let mut r = if failed {
        CallToolResult::error(vec![ContentBlock::text(text)])
    } else {
        CallToolResult::success(vec![ContentBlock::text(text)])
    };
    r.structured_content = structured;
    r
}

/// A tool error result: the text only.
pub(super) fn error(text: impl Into<String>) -> CallToolResult {
    result(text.into(), None, true)
}

/// A successful tool result: the text only.
pub(super) fn ok(text: impl Into<String>) -> CallToolResult {
    result(text.into(), None, false)
}

/// What the sandbox's egress gateway allowed and refused: a line of
/// counts and the last refusals for the model, the REST API's
/// `EgressCounts` as structured content.
pub(super) fn egress(c: corral_core::egress::EgressCounts, notes: &[String]) -> CallToolResult {
    let mut text = String::new();
    for note in notes {
        let _ = writeln!(text, "{note}");
    }
    let _ = write!(
        text,
        "egress: {} DNS names allowed, {} refused; {} connections allowed, {} refused",
        c.dns_allowed, c.dns_refused, c.connections_allowed, c.connections_refused
    );
    if !c.recent_refusals.is_empty() {
        let _ = write!(text, "\nlast refusals: {}", c.recent_refusals.join(", "));
    }
    let body = crate::wire::EgressCounts {
        dns_allowed: c.dns_allowed,
        dns_refused: c.dns_refused,
        connections_allowed: c.connections_allowed,
        connections_refused: c.connections_refused,
        recent_refusals: c.recent_refusals,
    };
    result(text, serde_json::to_value(body).ok(), false)
}

/// A failure as one line: kind, whether a retry may help, message.
pub(super) fn failure_line(what: &str, f: &Failure) -> String {
    format!(
        "{what}: {} ({}): {}",
        f.kind,
        if f.retryable() {
            "retryable"
        } else {
            "not retryable"
        },
        f.message
    )
}

/// One output stream: its text (invalid UTF-8 replaced), a mark where the
/// middle was cut, and the byte count when it was.
fn stream(out: &mut String, name: &str, bytes: &[u8], truncated: bool, total: u64, budget: u64) {
    if bytes.is_empty() && !truncated {
        let _ = writeln!(out, "{name}: (empty)");
        return;
    }
    let _ = writeln!(out, "--- {name} ---");
    // The capper keeps the first half of the budget and the last half.
    let head = usize::try_from(budget - budget / 2)
        .unwrap_or(usize::MAX)
        .min(bytes.len());
    if truncated {
        out.push_str(&String::from_utf8_lossy(&bytes[..head]));
        let cut = total.saturating_sub(bytes.len() as u64);
        let _ = write!(out, "\n[... {cut} bytes cut ...]\n");
        out.push_str(&String::from_utf8_lossy(&bytes[head..]));
    } else {
        out.push_str(&String::from_utf8_lossy(bytes));
    }
    if !out.ends_with('\n') {
        out.push('\n');
    }
    if truncated {
        let _ = writeln!(
            out,
            "[{name}: {total} bytes in all; the first and last parts are shown]"
        );
    }
}

/// The text of a command's outcome.
fn command_text(r: &CommandResult, notes: &[String], budget: u64) -> String {
    let mut out = String::new();
    for n in notes {
        out.push_str(n);
        out.push('\n');
    }
    if let Some(f) = &r.failure {
        out.push_str(&failure_line("failure", f));
        out.push('\n');
    }
    match (r.exit_code, r.signal) {
        (Some(code), _) => {
            let _ = writeln!(out, "exit code: {code}");
        }
        (None, Some(sig)) => {
            let _ = writeln!(out, "killed by signal {sig}");
        }
        (None, None) => {}
    }
    if let Some(u) = &r.usage {
        let _ = writeln!(
            out,
            "used: cpu {:.3} s, peak memory {:.1} MiB (largest process)",
            u.cpu().as_secs_f64(),
            u.peak_memory_bytes as f64 / f64::from(1u32 << 20)
        );
    }
    stream(
        &mut out,
        "stdout",
        &r.stdout,
        r.stdout_truncated,
        r.stdout_total_bytes,
        budget,
    );
    stream(
        &mut out,
        "stderr",
        &r.stderr,
        r.stderr_truncated,
        r.stderr_total_bytes,
        budget,
    );
    out
}

/// Whether a command's outcome is an error result: a failure or a
/// non-zero exit.
fn failed(r: &CommandResult) -> bool {
    r.failure.is_some() || r.exit_code != Some(0)
}

/// `run_command`'s result.
pub(super) fn command(
    r: &CommandResult,
    sandbox: &str,
    notes: &[String],
    budget: u64,
) -> CallToolResult {
    let structured = serde_json::to_value(CommandOutcome::new(r, Some(sandbox))).ok();
    result(command_text(r, notes, budget), structured, failed(r))
}

/// `reset`'s result: how it was done, and why not in place when it was not.
pub(super) fn reset(o: &corral::ResetOutcome, notes: &[String]) -> CallToolResult {
    let mut text = String::new();
    for n in notes {
        text.push_str(n);
        text.push('\n');
    }
    match &o.fallback_reason {
        None => {
            let _ = write!(
                text,
                "the sandbox is pristine again (reset in place in {:.1} ms, {} process{} killed)",
                o.elapsed_ms,
                o.killed,
                if o.killed == 1 { "" } else { "es" }
            );
        }
        Some(why) => {
            let _ = write!(
                text,
                "the sandbox is pristine again (its container was replaced by a new one in {:.0} ms; not in place because {why})",
                o.elapsed_ms
            );
        }
    }
    text.push_str(": every process and shell session is gone and every file change is undone");
    result(text, serde_json::to_value(ResetBody::from(o)).ok(), false)
}

/// `shell_run`'s result; `restarted` says the session's earlier shell was
/// lost (not merely that this was its first command).
pub(super) fn shell(
    s: &SessionResult,
    session: &str,
    restarted: bool,
    sandbox: &str,
    mut notes: Vec<String>,
    budget: u64,
) -> CallToolResult {
    if restarted {
        notes.push(format!(
            "note: shell session '{session}' was restarted before this command: its working directory, variables and functions from earlier commands are gone"
        ));
    }
    if s.dropped_between_bytes > 0 {
        notes.push(format!(
            "note: {} bytes printed by background jobs since the previous command were dropped",
            s.dropped_between_bytes
        ));
    }
    let mut text = command_text(&s.result, &notes, budget);
    if s.ended {
        let _ = writeln!(
            text,
            "note: shell session '{session}' has ended; the next shell_run in it starts a fresh shell"
        );
    }
    let structured = serde_json::to_value(ShellOutcome {
        result: CommandOutcome::new(&s.result, Some(sandbox)),
        restarted,
        ended: s.ended,
        dropped_between_bytes: s.dropped_between_bytes,
        trusted: s.trusted,
    })
    .ok();
    result(text, structured, failed(&s.result))
}

/// `read_file`'s text: the content itself, or base64 with a note for a
/// binary file.
pub(super) fn file_content(path: &str, bytes: Vec<u8>) -> CallToolResult {
    match String::from_utf8(bytes) {
        Ok(text) if !text.contains('\0') => ok(text),
        Ok(text) => binary(path, text.as_bytes()),
        Err(e) => binary(path, e.as_bytes()),
    }
}

fn binary(path: &str, bytes: &[u8]) -> CallToolResult {
    ok(format!(
        "note: {path} is binary ({} bytes); its content follows base64-encoded\n{}",
        bytes.len(),
        base64::engine::general_purpose::STANDARD.encode(bytes)
    ))
}

/// A name as shown in a listing: as is, or `{:?}`-quoted when it holds
/// control characters (a newline would break the listing's lines).
fn shown(name: &str) -> String {
    if name.chars().any(char::is_control) {
        format!("{name:?}")
    } else {
        name.to_string()
    }
}

/// `list_files`' text: one line per entry (type, mode, size, name; `/`
/// after directories, `-> target` after symlinks).
pub(super) fn listing(path: &str, entries: &[DirEntry]) -> String {
    let mut out = format!(
        "{path}: {} entr{}\n",
        entries.len(),
        if entries.len() == 1 { "y" } else { "ies" }
    );
    for e in entries.iter().take(MAX_LISTED) {
        let _ = write!(
            out,
            "{:<7} {:04o} {:>10}  {}",
            e.kind.as_str(),
            e.mode,
            e.size,
            shown(&e.name)
        );
        match (e.kind, &e.target) {
            (EntryKind::Dir, _) => out.push('/'),
            (EntryKind::Symlink, Some(t)) => {
                let _ = write!(out, " -> {}", shown(t));
            }
            _ => {}
        }
        out.push('\n');
    }
    if entries.len() > MAX_LISTED {
        let _ = writeln!(
            out,
            "... and {} more (list a subdirectory, or use run_command with ls or find)",
            entries.len() - MAX_LISTED
        );
    }
    out
}

/// A `run_code` result: what it printed, the last expression's value, the
/// exception (an error result), a corral failure; plots as images.
pub(super) fn code(
    events: &[corral::CodeEvent],
    outcome: &Result<corral::CodeOutcome, Failure>,
    notes: &[String],
) -> CallToolResult {
    let mut text = notes.join("\n");
    let mut images = Vec::new();
    let mut failed = false;
    let push = |text: &mut String, s: &str| {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(s);
    };
    for e in events {
        match e {
            corral::CodeEvent::Stdout { text: t } => push(&mut text, t),
            corral::CodeEvent::Stderr { text: t } => push(&mut text, &format!("[stderr] {t}")),
            corral::CodeEvent::Result {
                data,
                is_main_result,
            } => {
                for (mime, value) in data {
                    if matches!(mime.as_str(), "image/png" | "image/jpeg") {
                        if let Some(b64) = value.as_str() {
                            images.push(ContentBlock::image(b64.trim().to_string(), mime.clone()));
                        }
                    }
                }
                if let Some(plain) = data.get("text/plain").and_then(|v| v.as_str()) {
                    let label = if *is_main_result { "result" } else { "display" };
                    push(&mut text, &format!("[{label}] {plain}"));
                }
            }
            corral::CodeEvent::Error {
                name,
                value,
                traceback,
            } => {
                failed = true;
                let tb = strip_ansi(&traceback.join("\n"));
                push(&mut text, &format!("{name}: {value}\n{tb}"));
            }
        }
    }
    match outcome {
        Ok(o) => {
            if let Some(f) = &o.failure {
                failed = true;
                push(&mut text, &failure_line("the code did not finish", f));
            }
            if o.truncated {
                push(&mut text, "(output beyond the budget was dropped)");
            }
        }
        Err(f) => {
            failed = true;
            push(&mut text, &failure_line("the code did not run", f));
        }
    }
    if text.is_empty() {
        text = "(no output)".to_string();
    }
    let mut r = result(text, None, failed);
    r.content.extend(images);
    r
}

/// `text` without ANSI colour sequences (IPython's tracebacks).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use corral_core::FailureKind;

    fn text_of(r: &CallToolResult) -> String {
        r.content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect()
    }

    #[test]
    fn resets_say_how_and_why_not_in_place() {
        let r = reset(
            &corral::ResetOutcome {
                mode: corral::ResetMode::InPlace,
                fallback_reason: None,
                killed: 1,
                elapsed_ms: 4.31,
            },
            &[],
        );
        assert_eq!(r.is_error, Some(false));
        let t = text_of(&r);
        assert!(
            t.contains("reset in place in 4.3 ms, 1 process killed"),
            "{t}"
        );
        assert_eq!(
            r.structured_content,
            Some(
                serde_json::json!({"mode": "in_place", "fallback_reason": null, "killed": 1, "elapsed_ms": 4.31})
            )
        );
        let r = reset(
            &corral::ResetOutcome {
                mode: corral::ResetMode::Replaced,
                fallback_reason: Some("pristine is false: not started for it".into()),
                killed: 0,
                elapsed_ms: 812.0,
            },
            &["note: replaced earlier".to_string()],
        );
        let t = text_of(&r);
        assert!(t.starts_with("note: replaced earlier\n"), "{t}");
        assert!(
            t.contains("replaced by a new one in 812 ms; not in place because pristine is false"),
            "{t}"
        );
        assert!(t.ends_with("every file change is undone"), "{t}");
    }

    #[test]
    fn a_clean_exit_shows_code_and_output() {
        let r = CommandResult {
            exit_code: Some(0),
            stdout: b"hello\n".to_vec(),
            stdout_total_bytes: 6,
            ..CommandResult::default()
        };
        let t = command(&r, "sb-1", &[], 64);
        assert_eq!(t.is_error, Some(false));
        assert_eq!(
            text_of(&t),
            "exit code: 0\n--- stdout ---\nhello\nstderr: (empty)\n"
        );
        let s = t.structured_content.expect("structured");
        assert_eq!(s["exit_code"], 0);
        assert_eq!(s["stdout"], "hello\n");
        assert_eq!(s["sandbox_id"], "sb-1");
    }

    #[test]
    fn a_non_zero_exit_and_a_failure_are_errors_naming_the_kind() {
        let r = CommandResult {
            exit_code: Some(3),
            ..CommandResult::default()
        };
        assert_eq!(command(&r, "sb", &[], 64).is_error, Some(true));
        let r = CommandResult::failed(
            Failure::new(FailureKind::Timeout, "timed out after 1s"),
            Duration::from_secs(1),
        );
        let t = command(&r, "sb", &["note: n".to_string()], 64);
        assert_eq!(t.is_error, Some(true));
        let text = text_of(&t);
        assert!(text.starts_with("note: n\n"), "{text}");
        assert!(
            text.contains("failure: timeout (not retryable): timed out after 1s"),
            "{text}"
        );
        let s = t.structured_content.expect("structured");
        assert_eq!(s["failure"]["kind"], "timeout");
    }

    #[test]
    fn a_full_cluster_reads_as_a_retryable_capacity_failure() {
        let full = corral::Error::Capacity {
            sandbox: "sb-1".into(),
            message: "0/3 nodes are available: 3 Insufficient memory.".into(),
        };
        assert_eq!(
            failure_line("sandbox", &full.failure()),
            "sandbox: capacity (retryable): no room for sandbox sb-1: 0/3 nodes are available: \
             3 Insufficient memory."
        );
    }

    #[test]
    fn a_cut_stream_marks_the_cut() {
        let r = CommandResult {
            exit_code: Some(0),
            stdout: b"AAAAzzzz".to_vec(),
            stdout_truncated: true,
            stdout_total_bytes: 100,
            ..CommandResult::default()
        };
        let text = text_of(&command(&r, "sb", &[], 8));
        assert!(
            text.contains("AAAA\n[... 92 bytes cut ...]\nzzzz\n"),
            "{text}"
        );
        assert!(text.contains("100 bytes in all"), "{text}");
    }

    #[test]
    fn shell_results_say_when_state_was_lost() {
        let s = SessionResult {
            result: CommandResult {
                exit_code: Some(0),
                ..CommandResult::default()
            },
            restarted: true,
            ended: true,
            dropped_between_bytes: 0,
            trusted: false,
        };
        let text = text_of(&shell(&s, "main", true, "sb", Vec::new(), 64));
        assert!(text.contains("'main' was restarted"), "{text}");
        assert!(text.contains("has ended"), "{text}");
        let first = text_of(&shell(&s, "main", false, "sb", Vec::new(), 64));
        assert!(!first.contains("restarted"), "{first}");
    }

    #[test]
    fn binary_files_come_back_base64() {
        assert_eq!(text_of(&file_content("/f", b"hi\n".to_vec())), "hi\n");
        let t = text_of(&file_content("/b", vec![0xff, 0x00, 0x01]));
        assert!(t.starts_with("note: /b is binary (3 bytes)"), "{t}");
        assert!(t.ends_with("\n/wAB"), "{t}");
        let t = text_of(&file_content("/z", b"a\0b".to_vec()));
        assert!(t.contains("binary"), "{t}");
    }

    #[test]
    fn listings_show_one_line_per_entry() {
        let e = |name: &str, kind, size, mode, target: Option<&str>| DirEntry {
            name: name.into(),
            kind,
            size,
            mode,
            target: target.map(String::from),
            modified: std::time::UNIX_EPOCH,
            uid: 0,
            gid: 0,
            owner: None,
            group: None,
        };
        let text = listing(
            "/w",
            &[
                e("a", EntryKind::Dir, 4096, 0o755, None),
                e("b.txt", EntryKind::File, 5, 0o644, None),
                e("l", EntryKind::Symlink, 5, 0o777, Some("b.txt")),
                e("n\nl", EntryKind::File, 0, 0o600, None),
            ],
        );
        assert_eq!(
            text,
            "/w: 4 entries\n\
             dir     0755       4096  a/\n\
             file    0644          5  b.txt\n\
             symlink 0777          5  l -> b.txt\n\
             file    0600          0  \"n\\nl\"\n"
        );
        let many: Vec<DirEntry> = (0..MAX_LISTED + 2)
            .map(|i| e(&format!("f{i}"), EntryKind::File, 0, 0o644, None))
            .collect();
        assert!(listing("/m", &many).ends_with(
            "... and 2 more (list a subdirectory, or use run_command with ls or find)\n"
        ));
    }
}
