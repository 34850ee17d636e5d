//! The structured error of the agent's file commands (`file-write`,
//! `file-read`, `file-list`, `tar-extract`, `tar-create`).
//!
//! Those commands run as ordinary commands inside the sandbox, so their only
//! channels are stdout (the bytes moved), stderr and the exit code. A failing
//! command writes one [`FileErrorReport`] as the last line of its stderr:
//! [`REPORT_PREFIX`] followed by JSON. corral reads the kind and the fields
//! from it instead of parsing an English sentence; the sentence stays in
//! [`FileErrorReport::message`] for people.
//!
//! The line comes from inside a sandbox, so [`FileErrorReport::decode`] is
//! strict: bounded length, the exact prefix, no unknown or duplicate fields,
//! and the fields each kind promises present. Anything else is refused, and
//! corral falls back to a generic error.

use serde::{Deserialize, Serialize};

/// What starts the report line on stderr.
pub const REPORT_PREFIX: &str = "corral-agent-error: ";

/// Longest report line, prefix included, newline excluded. Well below any
/// output budget corral gives a file command, so the line is never cut.
pub const MAX_REPORT_LINE: usize = 16 * 1024;

/// Bytes each text field keeps at first when encoding; halved while the
/// line is still too long (JSON escapes can make text up to six times longer).
const FIELD_START: usize = 4096;

/// Smallest cap the halving goes down to: five fields this long, each
/// escaped six times over, still fit in [`MAX_REPORT_LINE`].
const FIELD_FLOOR: usize = 64;

/// Marks a text field cut to fit the line.
const CLIPPED: &str = "…";

/// Which failure a file command reports; `snake_case` on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileErrorKind {
    /// Any other IO failure: permission denied, read-only filesystem, a
    /// directory where a file was expected, no space left.
    Io,
    /// Bad arguments.
    Usage,
    /// The path, its parent directory or the root does not exist.
    NotFound,
    /// Above the `--max` cap; nothing was written or streamed.
    TooLarge,
    /// The path resolves outside `--root`.
    Escapes,
    /// A tar entry that would land outside the target directory, or of a
    /// kind that is not extracted.
    UnsafeEntry,
}

impl FileErrorKind {
    /// The stable `snake_case` name used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            FileErrorKind::Io => "io",
            FileErrorKind::Usage => "usage",
            FileErrorKind::NotFound => "not_found",
            FileErrorKind::TooLarge => "too_large",
            FileErrorKind::Escapes => "escapes",
            FileErrorKind::UnsafeEntry => "unsafe_entry",
        }
    }

    /// The exit code the agent ends with for this kind. The codes predate
    /// the report and are kept for anyone reading only the status; a report
    /// whose kind disagrees with the status is not trusted.
    pub const fn exit_code(self) -> i32 {
        match self {
            FileErrorKind::Io => 1,
            FileErrorKind::Usage => 2,
            FileErrorKind::NotFound => 3,
            FileErrorKind::TooLarge => 4,
            FileErrorKind::Escapes | FileErrorKind::UnsafeEntry => 5,
        }
    }
}

/// One failed file command, as the agent reports it. Which optional fields
/// are set depends on the kind (see [`FileErrorReport::decode`]); paths that
/// are not UTF-8 are carried with U+FFFD in place of the bad bytes (the
/// message quotes them exactly).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileErrorReport {
    /// What went wrong.
    pub kind: FileErrorKind,
    /// The whole story for people, naming the path.
    pub message: String,
    /// The path concerned (required for `not_found`, `too_large`, `escapes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The canonical `--root` (required for `escapes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    /// The tar entry's name (required for `unsafe_entry`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<String>,
    /// Why the entry was refused (required for `unsafe_entry`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The exact size in bytes, when known (`too_large`; above `limit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// The cap in bytes (required for `too_large`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
}

/// Why a report line was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The last line of stderr does not start with [`REPORT_PREFIX`] (or
    /// stderr is empty).
    #[error("no file error report on the last line of stderr")]
    Missing,
    /// The last line is longer than [`MAX_REPORT_LINE`].
    #[error("file error report line is longer than {MAX_REPORT_LINE} bytes")]
    TooLong,
    /// The JSON did not parse as a report (bad syntax, not UTF-8, unknown
    /// kind or field, duplicate field, wrong type).
    #[error("file error report does not parse: {0}")]
    Malformed(String),
    /// The JSON parsed but breaks a rule of its kind.
    #[error("file error report of kind {kind} is invalid: {reason}")]
    Invalid {
        /// The kind the report claims.
        kind: &'static str,
        /// The rule broken.
        reason: &'static str,
    },
}

impl FileErrorReport {
    /// A report with only a kind and a message.
    pub fn new(kind: FileErrorKind, message: impl Into<String>) -> Self {
        FileErrorReport {
            kind,
            message: message.into(),
            path: None,
            root: None,
            entry: None,
            reason: None,
            size: None,
            limit: None,
        }
    }

    /// The report line, prefix included, without a newline. Always one line
    /// of at most [`MAX_REPORT_LINE`] bytes: text fields too long for it are
    /// cut (ending in `…`), so what the agent writes the decoder accepts.
    pub fn encode(&self) -> String {
        let mut cap = FIELD_START;
        loop {
            let clipped = self.clipped(cap);
            // Strings and integers only: serializing cannot fail; should it
            // ever, a report without fields is still a report.
            let json = serde_json::to_string(&clipped)
                .unwrap_or_else(|_| format!(r#"{{"kind":"{}","message":""}}"#, self.kind.as_str()));
            let line = format!("{REPORT_PREFIX}{json}");
            if line.len() <= MAX_REPORT_LINE || cap <= FIELD_FLOOR {
                return line;
            }
            cap /= 2;
        }
    }

    /// Decodes the report from a file command's stderr: its last line (a
    /// final newline ignored), which must be [`REPORT_PREFIX`] and a valid
    /// report. Reads at most [`MAX_REPORT_LINE`] bytes from the end, however
    /// long stderr is.
    pub fn decode(stderr: &[u8]) -> Result<FileErrorReport, DecodeError> {
        let text = stderr.strip_suffix(b"\n").unwrap_or(stderr);
        let window = &text[text.len().saturating_sub(MAX_REPORT_LINE + 1)..];
        let line = match window.iter().rposition(|&b| b == b'\n') {
            Some(nl) => &window[nl + 1..],
            None if text.len() > MAX_REPORT_LINE => return Err(DecodeError::TooLong),
            None => window,
        };
        if line.len() > MAX_REPORT_LINE {
            return Err(DecodeError::TooLong);
        }
        let json = line
            .strip_prefix(REPORT_PREFIX.as_bytes())
            .ok_or(DecodeError::Missing)?;
        // serde would also take a struct written as an array; the agent
        // writes an object right after the prefix, nothing else passes.
        if json.first() != Some(&b'{') {
            return Err(DecodeError::Malformed("not a JSON object".into()));
        }
        let report: FileErrorReport =
            serde_json::from_slice(json).map_err(|e| DecodeError::Malformed(e.to_string()))?;
        report.check()?;
        Ok(report)
    }

    /// The rules a report of each kind keeps.
    fn check(&self) -> Result<(), DecodeError> {
        let invalid = |reason| DecodeError::Invalid {
            kind: self.kind.as_str(),
            reason,
        };
        if self.message.is_empty() {
            return Err(invalid("the message is empty"));
        }
        match self.kind {
            FileErrorKind::Io | FileErrorKind::Usage => {}
            FileErrorKind::NotFound if self.path.is_none() => return Err(invalid("no path")),
            FileErrorKind::NotFound => {}
            FileErrorKind::TooLarge => {
                let Some(limit) = self.limit else {
                    return Err(invalid("no limit"));
                };
                if self.path.is_none() {
                    return Err(invalid("no path"));
                }
                if self.size.is_some_and(|size| size <= limit) {
                    return Err(invalid("the size is not above the limit"));
                }
            }
            FileErrorKind::Escapes if self.path.is_none() || self.root.is_none() => {
                return Err(invalid("no path or no root"))
            }
            FileErrorKind::Escapes => {}
            FileErrorKind::UnsafeEntry if self.entry.is_none() || self.reason.is_none() => {
                return Err(invalid("no entry or no reason"))
            }
            FileErrorKind::UnsafeEntry => {}
        }
        Ok(())
    }

    /// A copy whose text fields are at most `cap` bytes (plus the marker).
    fn clipped(&self, cap: usize) -> FileErrorReport {
        let opt = |s: &Option<String>| s.as_deref().map(|s| clip(s, cap));
        FileErrorReport {
            kind: self.kind,
            message: clip(&self.message, cap),
            path: opt(&self.path),
            root: opt(&self.root),
            entry: opt(&self.entry),
            reason: opt(&self.reason),
            size: self.size,
            limit: self.limit,
        }
    }
}

/// `s` cut to at most `cap` bytes on a character boundary, marked when cut.
fn clip(s: &str, cap: usize) -> String {
    if s.len() <= cap {
        return s.to_string();
    }
    let mut end = cap;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{CLIPPED}", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> FileErrorReport {
        FileErrorReport {
            kind: FileErrorKind::UnsafeEntry,
            message: "unsafe entry \"../e\\\"vil\": a '..' component".into(),
            path: Some("/w/d".into()),
            root: Some("/w".into()),
            entry: Some("../e\"vil\nnext".into()),
            reason: Some("a '..' component".into()),
            size: Some(9),
            limit: Some(8),
        }
    }

    fn decode_str(s: &str) -> Result<FileErrorReport, DecodeError> {
        FileErrorReport::decode(s.as_bytes())
    }

    #[test]
    fn round_trips_as_one_prefixed_line() {
        let r = full();
        let line = r.encode();
        assert!(line.starts_with(REPORT_PREFIX), "{line}");
        assert!(!line.contains('\n'), "a newline in a field broke the line");
        assert_eq!(decode_str(&line), Ok(r.clone()));
        assert_eq!(decode_str(&format!("{line}\n")), Ok(r.clone()));
        // Whatever came before on stderr does not matter: the last line does.
        let stderr = format!("warning: something\r\n{line}\n");
        assert_eq!(decode_str(&stderr), Ok(r));

        // Absent fields are left out and come back absent.
        let r = FileErrorReport::new(FileErrorKind::Io, "cannot write \"/x\": denied");
        let line = r.encode();
        assert_eq!(
            line,
            r#"corral-agent-error: {"kind":"io","message":"cannot write \"/x\": denied"}"#
        );
        assert_eq!(decode_str(&line), Ok(r));
    }

    #[test]
    fn kinds_are_snake_case_with_their_exit_codes() {
        let all = [
            (FileErrorKind::Io, 1),
            (FileErrorKind::Usage, 2),
            (FileErrorKind::NotFound, 3),
            (FileErrorKind::TooLarge, 4),
            (FileErrorKind::Escapes, 5),
            (FileErrorKind::UnsafeEntry, 5),
        ];
        for (kind, code) in all {
            assert_eq!(kind.exit_code(), code);
            let json = serde_json::to_string(&kind).expect("serialize");
            assert_eq!(json, format!("\"{}\"", kind.as_str()));
            assert_eq!(
                serde_json::from_str::<FileErrorKind>(&json).ok(),
                Some(kind)
            );
        }
    }

    #[test]
    fn long_hostile_fields_are_clipped_to_a_line_the_decoder_takes() {
        // Control characters escape to six bytes each: the worst case.
        let evil = "\u{1}".repeat(200_000);
        let r = FileErrorReport {
            message: format!("unsafe entry {evil:?}"),
            path: Some(evil.clone()),
            root: Some(evil.clone()),
            entry: Some(evil.clone()),
            reason: Some("é".repeat(100_000)),
            ..full()
        };
        let line = r.encode();
        assert!(line.len() <= MAX_REPORT_LINE, "{}", line.len());
        let back = decode_str(&line).expect("the decoder takes what the agent writes");
        assert_eq!(back.kind, FileErrorKind::UnsafeEntry);
        let entry = back.entry.expect("entry kept");
        assert!(
            entry.ends_with(CLIPPED) && entry.starts_with('\u{1}'),
            "{entry:?}"
        );
        assert!(back.reason.expect("reason kept").starts_with('é'));

        // A plain long path keeps its first 4 KiB.
        let long = "a/".repeat(5000);
        let r = FileErrorReport {
            path: Some(long.clone()),
            ..FileErrorReport::new(FileErrorKind::NotFound, "not found")
        };
        let back = decode_str(&r.encode()).expect("decodes");
        assert_eq!(
            back.path,
            Some(format!("{}{CLIPPED}", &long[..FIELD_START]))
        );
    }

    #[test]
    fn garbage_is_refused() {
        let p = REPORT_PREFIX;
        let missing = [
            "",
            "\n",
            "corral-agent: not found: \"/x\"",
            // The report must be the last line, not any line.
            &format!("{p}{{\"kind\":\"io\",\"message\":\"m\"}}\ntrailing words"),
            // The exact prefix, at the start of the line.
            &format!(" {p}{{\"kind\":\"io\",\"message\":\"m\"}}"),
            "corral-agent-error:{\"kind\":\"io\",\"message\":\"m\"}",
        ];
        for s in missing {
            assert_eq!(decode_str(s), Err(DecodeError::Missing), "{s:?}");
        }
        let malformed = [
            p.to_string(),
            format!("{p}not json"),
            format!("{p}{{\"kind\":\"io\",\"message\":\"m\""),
            format!("{p}{{\"kind\":\"io\",\"message\":\"m\"}} extra"),
            format!("{p}{{\"kind\":\"segfault\",\"message\":\"m\"}}"),
            format!("{p}{{\"kind\":\"IO\",\"message\":\"m\"}}"),
            format!("{p}{{\"kind\":\"io\"}}"),
            format!("{p}{{\"kind\":\"io\",\"message\":\"m\",\"admin\":true}}"),
            format!("{p}{{\"kind\":\"io\",\"message\":\"m\",\"message\":\"n\"}}"),
            format!("{p}{{\"kind\":\"too_large\",\"message\":\"m\",\"path\":\"/x\",\"limit\":-1}}"),
            format!(
                "{p}{{\"kind\":\"too_large\",\"message\":\"m\",\"path\":\"/x\",\"limit\":1e3}}"
            ),
            format!("{p}{{\"kind\":\"io\",\"message\":7}}"),
            format!("{p}[\"io\",\"m\"]"),
            format!("{p} {{\"kind\":\"io\",\"message\":\"m\"}}"),
            format!("{p}null"),
        ];
        for s in &malformed {
            assert!(
                matches!(decode_str(s), Err(DecodeError::Malformed(_))),
                "{s:?}: {:?}",
                decode_str(s)
            );
        }
        // Not UTF-8.
        let mut bytes = p.as_bytes().to_vec();
        bytes.extend_from_slice(b"{\"kind\":\"io\",\"message\":\"\xff\"}");
        assert!(matches!(
            FileErrorReport::decode(&bytes),
            Err(DecodeError::Malformed(_))
        ));
        let invalid = [
            format!("{p}{{\"kind\":\"io\",\"message\":\"\"}}"),
            format!("{p}{{\"kind\":\"not_found\",\"message\":\"m\"}}"),
            format!("{p}{{\"kind\":\"too_large\",\"message\":\"m\",\"path\":\"/x\"}}"),
            format!("{p}{{\"kind\":\"too_large\",\"message\":\"m\",\"path\":\"/x\",\"size\":3,\"limit\":3}}"),
            format!("{p}{{\"kind\":\"escapes\",\"message\":\"m\",\"path\":\"/x\"}}"),
            format!("{p}{{\"kind\":\"unsafe_entry\",\"message\":\"m\",\"entry\":\"e\"}}"),
        ];
        for s in &invalid {
            assert!(
                matches!(decode_str(s), Err(DecodeError::Invalid { .. })),
                "{s:?}: {:?}",
                decode_str(s)
            );
        }
    }

    #[test]
    fn oversized_lines_are_refused_without_reading_them_whole() {
        let ok = FileErrorReport::new(FileErrorKind::Io, "m").encode();
        // A valid report padded past the limit with spaces JSON would accept.
        let padded = format!("{ok}{}", " ".repeat(MAX_REPORT_LINE));
        assert_eq!(decode_str(&padded), Err(DecodeError::TooLong));
        // Megabytes without a newline: refused, not parsed.
        let huge = "x".repeat(8 << 20);
        assert_eq!(decode_str(&huge), Err(DecodeError::TooLong));
        // A huge earlier line does not hide a good last one.
        assert_eq!(
            decode_str(&format!("{huge}\n{ok}\n")).map(|r| r.kind),
            Ok(FileErrorKind::Io)
        );
        // Exactly at the limit is fine.
        let pad = MAX_REPORT_LINE - ok.len();
        let at_limit = format!("{}{}}}", &ok[..ok.len() - 1], " ".repeat(pad));
        assert_eq!(at_limit.len(), MAX_REPORT_LINE);
        assert_eq!(decode_str(&at_limit).map(|r| r.kind), Ok(FileErrorKind::Io));
    }
}
