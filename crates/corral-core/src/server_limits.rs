//! Ceilings the operator sets on what one client of the service may ask
//! for (`server.limits`), and the budget of bytes that every request in
//! flight may hold at once.
//!
//! A client chooses how much output a command may keep, how long it may
//! run, how much stdin it sends and how large a file it reads; each of
//! those is memory or time the service spends for it. Without a ceiling one
//! request asking for 512 MiB of output makes the service hold 512 MiB, and
//! a handful of them at once exhaust the host. So every such request field
//! has a ceiling here (a request above it is refused, never clamped: the
//! client learns its ask was not honoured), and every request reserves its
//! worst case from one shared budget before it starts, so requests that
//! fit their ceilings one by one cannot add up without bound either.
//!
//! No one principal may hold the whole budget: a tenant (the operator
//! counts as one), or an unauthenticated peer by its address, holds at
//! most `share_percent` of `buffer_bytes` and of `max_concurrent`, so the
//! rest stays for the others. Request bodies are reserved as their bytes
//! arrive (never by the size a request announces) and must arrive within
//! `body_timeout_ms`; a port relay waits at most `backend_timeout_ms` for
//! the sandbox's server to answer.
//!
//! The arithmetic of a request's worst case lives here, once, so the
//! service's reservations and the configuration's check that the budget
//! holds at least one request at the ceilings cannot drift apart. No IO.

use serde::{Deserialize, Serialize};

/// Room a file operation keeps for the agent's error report on top of the
/// file's bytes (the runtime's stdout budget is at least this much, so the
/// report is never cut).
pub const FILE_REPORT_BYTES: u64 = 64 << 10;

/// The ceilings (`server.limits` in the config file).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerLimits {
    /// Largest `max_output` (bytes kept per output stream of a command or
    /// shell command) a client may ask for. Default 67108864 (64 MiB).
    pub max_output: u64,
    /// Longest `timeout_ms` a client may ask for; a command without one
    /// gets this. Default 86400000 (24 hours).
    pub max_timeout_ms: u64,
    /// Largest stdin of a command, in bytes (after base64 decoding).
    /// Default 67108864 (64 MiB).
    pub max_stdin_bytes: u64,
    /// Largest `max_bytes` of a file read, listing or archive download.
    /// Default 268435456 (256 MiB).
    pub max_read_bytes: u64,
    /// Commands, shell commands, file operations and MCP tool calls in
    /// flight at once across the service. Default 1024.
    pub max_concurrent: u32,
    /// Bytes all requests in flight may hold together (their bodies, the
    /// output they keep, the files they move), each reserved at its worst
    /// case before the request starts. Default 2147483648 (2 GiB).
    pub buffer_bytes: u64,
    /// Code contexts (Jupyter kernels) one sandbox may hold at once, its
    /// default context included; one more is refused naming this key.
    /// Each costs a kernel in the sandbox and a small queue in the
    /// service. Default 16.
    pub max_code_contexts: u32,
    /// Percent of `buffer_bytes` and of `max_concurrent` one principal may
    /// hold at once: a tenant (the operator counts as one), or the address
    /// of a peer no token names. Never less than one request at the
    /// ceilings, nor than one slot; 100: no shares. Default 50.
    pub share_percent: u32,
    /// Longest a request body may take to arrive, in ms from the
    /// request's headers; a body still arriving then is cut off and the
    /// request answered 408. Default 60000 (60 s).
    pub body_timeout_ms: u64,
    /// Longest a port link or an E2B port relay waits for the sandbox's
    /// server to start its answer, in ms; then 504. Default 300000 (5 min).
    pub backend_timeout_ms: u64,
    /// Output kept per stream of a command started through the E2B
    /// listener, whose protocol has no field for it; never more than
    /// `max_output`. Default 1048576 (1 MiB).
    pub e2b_max_output: u64,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_output: 64 << 20,
            max_timeout_ms: 86_400_000,
            max_stdin_bytes: 64 << 20,
            max_read_bytes: 256 << 20,
            max_concurrent: 1024,
            buffer_bytes: 2 << 30,
            max_code_contexts: 16,
            share_percent: 50,
            body_timeout_ms: 60_000,
            backend_timeout_ms: 300_000,
            e2b_max_output: 1 << 20,
        }
    }
}

/// A `server.limits` value that cannot work: the key (under
/// `server.limits`), its value and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("server.limits.{key} {value}: {reason}")]
pub struct LimitsError {
    /// The key under `server.limits`.
    pub key: &'static str,
    /// Its value as configured.
    pub value: String,
    /// What it must be.
    pub reason: String,
}

impl ServerLimits {
    /// Bytes a command may hold while it runs: the output it keeps on both
    /// streams, twice over when streamed (chunks queued for a slow reader,
    /// then the result repeats them), and its stdin.
    pub fn command_bytes(max_output: u64, stdin: u64, streamed: bool) -> u64 {
        let copies = if streamed { 4 } else { 2 };
        max_output.saturating_mul(copies).saturating_add(stdin)
    }

    /// Bytes a file operation moving `payload` bytes may hold.
    pub fn file_bytes(payload: u64) -> u64 {
        payload.saturating_add(FILE_REPORT_BYTES)
    }

    /// The most one request within the ceilings may reserve, with request
    /// bodies of up to `max_body` bytes (`server.max_body_bytes`): its body
    /// and the worst of a streamed command and a file operation.
    pub fn largest_request(&self, max_body: u64) -> u64 {
        let command = Self::command_bytes(self.max_output, self.max_stdin_bytes, true);
        let file = Self::file_bytes(self.max_read_bytes.max(max_body));
        max_body.saturating_add(command.max(file))
    }

    /// Bytes one principal may hold, with request bodies of up to
    /// `max_body` bytes: `share_percent` of the budget, never less than one
    /// request at the ceilings, never more than the budget.
    pub fn share_bytes(&self, max_body: u64) -> u64 {
        let part =
            (u128::from(self.buffer_bytes) * u128::from(self.share_percent.min(100)) / 100) as u64;
        part.max(self.largest_request(max_body))
            .min(self.buffer_bytes)
    }

    /// Slots (`max_concurrent`) one principal may hold: `share_percent` of
    /// them, rounded up, at least one.
    pub fn share_slots(&self) -> u32 {
        let part =
            (u64::from(self.max_concurrent) * u64::from(self.share_percent.min(100))).div_ceil(100);
        u32::try_from(part).unwrap_or(u32::MAX).max(1)
    }

    /// Checks every value, with request bodies of up to `max_body` bytes:
    /// each at least 1, and a budget that holds at least one request at the
    /// ceilings (otherwise such a request would be refused as retryable
    /// forever).
    pub fn validate(&self, max_body: u64) -> Result<(), LimitsError> {
        let at_least_one = |key: &'static str, value: u64| {
            if value == 0 {
                Err(LimitsError {
                    key,
                    value: "0".into(),
                    reason: "at least 1".into(),
                })
            } else {
                Ok(())
            }
        };
        at_least_one("max_output", self.max_output)?;
        at_least_one("max_timeout_ms", self.max_timeout_ms)?;
        at_least_one("max_stdin_bytes", self.max_stdin_bytes)?;
        at_least_one("max_read_bytes", self.max_read_bytes)?;
        at_least_one("max_concurrent", u64::from(self.max_concurrent))?;
        at_least_one("max_code_contexts", u64::from(self.max_code_contexts))?;
        at_least_one("body_timeout_ms", self.body_timeout_ms)?;
        at_least_one("backend_timeout_ms", self.backend_timeout_ms)?;
        at_least_one("e2b_max_output", self.e2b_max_output)?;
        if !(1..=100).contains(&self.share_percent) {
            return Err(LimitsError {
                key: "share_percent",
                value: self.share_percent.to_string(),
                reason: "a percent from 1 to 100".into(),
            });
        }
        let largest = self.largest_request(max_body);
        if self.buffer_bytes < largest {
            return Err(LimitsError {
                key: "buffer_bytes",
                value: self.buffer_bytes.to_string(),
                reason: format!(
                    "must hold at least one request at the ceilings: {largest} bytes (a body of \
                     server.max_body_bytes, plus 4 x max_output + max_stdin_bytes for a streamed \
                     command, or max_read_bytes + {FILE_REPORT_BYTES} for a file, whichever is \
                     more)"
                ),
            });
        }
        // Budget permits are counted in KiB in a u32 (tokio's semaphore).
        if self.buffer_bytes / 1024 > u64::from(u32::MAX) {
            return Err(LimitsError {
                key: "buffer_bytes",
                value: self.buffer_bytes.to_string(),
                reason: format!("at most {} (4 TiB)", u64::from(u32::MAX) * 1024),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_hold_a_request_at_the_ceilings() {
        let limits = ServerLimits::default();
        assert_eq!(limits.validate(64 << 20), Ok(()));
        // 64 MiB body + 4 x 64 MiB output + 64 MiB stdin.
        assert_eq!(limits.largest_request(64 << 20), 384 << 20);
    }

    #[test]
    fn a_zero_or_a_budget_too_small_names_the_key_and_value() {
        let zero = ServerLimits {
            max_output: 0,
            ..ServerLimits::default()
        };
        let e = zero.validate(1024).expect_err("zero");
        assert_eq!((e.key, e.value.as_str()), ("max_output", "0"));
        let small = ServerLimits {
            buffer_bytes: 100 << 20,
            ..ServerLimits::default()
        };
        let e = small.validate(64 << 20).expect_err("too small");
        assert_eq!(e.key, "buffer_bytes");
        assert_eq!(e.value, (100u64 << 20).to_string());
        assert!(e.reason.contains(&(384u64 << 20).to_string()), "{e}");
        assert!(e
            .to_string()
            .starts_with("server.limits.buffer_bytes 104857600"));
        let huge = ServerLimits {
            buffer_bytes: u64::MAX,
            ..ServerLimits::default()
        };
        assert_eq!(huge.validate(1).map_err(|e| e.key), Err("buffer_bytes"));
    }

    #[test]
    fn a_share_is_a_part_of_the_budget_that_holds_one_request() {
        let limits = ServerLimits::default();
        assert_eq!(limits.share_bytes(64 << 20), 1 << 30);
        assert_eq!(limits.share_slots(), 512);
        let small = ServerLimits {
            buffer_bytes: 400 << 20,
            share_percent: 10,
            max_concurrent: 3,
            ..ServerLimits::default()
        };
        // 10% is 40 MiB, less than one request at the ceilings (384 MiB).
        assert_eq!(small.share_bytes(64 << 20), 384 << 20);
        assert_eq!(small.share_slots(), 1);
        let whole = ServerLimits {
            share_percent: 100,
            ..ServerLimits::default()
        };
        assert_eq!(whole.share_bytes(64 << 20), 2 << 30);
        assert_eq!(whole.share_slots(), 1024);
        for (bad, key) in [
            (
                ServerLimits {
                    share_percent: 0,
                    ..ServerLimits::default()
                },
                "share_percent",
            ),
            (
                ServerLimits {
                    share_percent: 101,
                    ..ServerLimits::default()
                },
                "share_percent",
            ),
            (
                ServerLimits {
                    body_timeout_ms: 0,
                    ..ServerLimits::default()
                },
                "body_timeout_ms",
            ),
            (
                ServerLimits {
                    e2b_max_output: 0,
                    ..ServerLimits::default()
                },
                "e2b_max_output",
            ),
        ] {
            assert_eq!(bad.validate(64 << 20).map_err(|e| e.key), Err(key));
        }
    }

    #[test]
    fn worst_cases_do_not_overflow() {
        assert_eq!(ServerLimits::command_bytes(u64::MAX, 1, true), u64::MAX);
        assert_eq!(ServerLimits::command_bytes(10, 3, false), 23);
        assert_eq!(ServerLimits::command_bytes(10, 3, true), 43);
        assert_eq!(ServerLimits::file_bytes(1), 1 + FILE_REPORT_BYTES);
    }

    /// No host facts matter to `server.limits`.
    struct NoHost;
    impl crate::spec::HostView for NoHost {
        fn var(&self, _: &str) -> Option<String> {
            None
        }
        fn path_exists(&self, _: &str) -> bool {
            false
        }
    }

    #[test]
    fn the_config_file_names_the_key_and_value_of_a_bad_limit() {
        use crate::config::Config;
        let invalid = |text: &str| {
            Config::from_yaml(text)
                .expect("parses")
                .validate(&NoHost)
                .expect_err("should be rejected")
        };
        let e = invalid("server:\n  limits:\n    max_timeout_ms: 0\n");
        assert_eq!(e.path(), "server.limits.max_timeout_ms");
        assert_eq!(
            e.to_string(),
            "server.limits.max_timeout_ms: invalid value '0': at least 1"
        );
        let e =
            invalid("server:\n  max_body_bytes: 1048576\n  limits:\n    buffer_bytes: 2097152\n");
        assert_eq!(e.path(), "server.limits.buffer_bytes");
        let text = e.to_string();
        assert!(
            text.starts_with("server.limits.buffer_bytes: invalid value '2097152': must hold at least one request"),
            "{text}"
        );
        // 1 MiB body + 4 x 64 MiB + 64 MiB: the ceilings it was checked against.
        assert!(
            text.contains(&((1u64 << 20) + (320u64 << 20)).to_string()),
            "{text}"
        );
        let e = Config::from_yaml("server:\n  limits:\n    max_output: lots\n").expect_err("type");
        assert_eq!(e.path(), "server.limits.max_output");
        assert!(e.to_string().contains("\"lots\""), "{e}");
        let e = Config::from_yaml("server:\n  limits:\n    max_outptu: 1\n").expect_err("unknown");
        assert_eq!(e.path(), "server.limits.max_outptu");
        let ok = Config::from_yaml(
            "server:\n  max_body_bytes: 65536\n  limits:\n    max_output: 262144\n    \
             max_stdin_bytes: 65536\n    max_read_bytes: 65536\n    buffer_bytes: 1310720\n",
        )
        .expect("parses");
        ok.validate(&NoHost)
            .expect("a small budget that holds one request");
        assert_eq!(ok.server.limits.max_output, 262144);
        assert_eq!(
            ok.server.limits.max_concurrent, 1024,
            "defaults fill the rest"
        );
    }
}
