//! corral-agent: PID 1 of every corral sandbox, and its file tool.
//!
//! `init` runs commands for corral over the framed protocol of
//! `corral_core::protocol`, reaps zombies, forwards signals and stops the
//! sandbox when its controller disappears; corral reaches it through the
//! daemon's attach to PID 1's stdin and stdout, or, where the engine has
//! no such attach (a Kubernetes pod), over a TCP port after a handshake
//! proving it holds the sandbox's secret (`CORRAL_AGENT_LISTEN`,
//! `CORRAL_AGENT_SECRET`; see `listen.rs`). The binary is built
//! statically so it runs in any image, `FROM scratch` included; its
//! arguments are parsed by hand to keep it small. `file-write`, `file-read`,
//! `file-list`, `tar-extract` and `tar-create` make it corral's file tool
//! inside the sandbox (see `files.rs`).

mod caps;
mod command;
mod confine;
mod control;
mod deadman;
mod delta;
mod door;
mod egress;
mod files;
mod ids;
mod init;
mod install;
mod kernel;
mod listen;
mod listing;
mod netprobe;
mod oom;
mod port;
mod pristine;
mod reaper;
mod server;
mod signals;
mod supervise;
mod sys;
mod tarball;
mod tree;
mod tunables;
mod usage;
mod watchdog;
mod writer;

use std::time::Duration;

use files::{FileRequest, Op};
use init::{InitOptions, DEFAULT_GRACE_MS};

const USAGE: &str = "usage: corral-agent init [--grace-ms N] [--agent-caps KILL,SETPCAP] [--nproc N] [--pid-ns] [--pristine [--pristine-size BYTES]] [--pristine-refused REASON]
       corral-agent install DIR
       corral-agent file-write PATH [--root DIR] [--mode OCTAL] [--mkdirs] [--max BYTES]
       corral-agent file-read PATH [--root DIR] [--max BYTES]
       corral-agent tar-extract DIR [--root DIR] [--max BYTES]
       corral-agent tar-create PATH [--root DIR] [--max BYTES]
       corral-agent file-list DIR [--root DIR] [--max BYTES]
       corral-agent port PORT
       corral-agent kernel LANGUAGE
       corral-agent egress-gateway
       corral-agent egress-stats
       corral-agent netpol-probe IP ALLOWED_PORT DENIED_PORT
       corral-agent --version

--agent-caps names capabilities the container holds for PID 1 alone: every
command drops them before it runs. --nproc N runs every command with
RLIMIT_NPROC N (soft and hard): the sandbox's process limit where the kernel
counts only the sandbox's processes (gVisor's). --pristine-refused says why the engine
could not start the sandbox for in-place reset; the handshake reports it.
--pid-ns (gVisor) runs the agent and every command in a PID namespace and
under a /proc of their own, PID 1 staying outside as a door that copies the
engine's pipes to the agent's sockets (needs CAP_SYS_ADMIN, which it drops).

init serves corral on its stdin and stdout; with CORRAL_AGENT_LISTEN=PORT and
CORRAL_AGENT_SECRET=<64 hex digits> in its environment it serves TCP port
PORT instead, to connections that prove they hold the secret (both variables
are removed from the environment commands inherit).

file commands: stdin/stdout carry the bytes; PATH must be absolute unless
--root is given, and must resolve inside --root (symlinks followed); --max
defaults to 64 MiB. file-list prints five NUL-ended fields per entry, sorted
by name: TYPE (file, dir, symlink, other), SIZE, MODE (octal), NAME, TARGET
(a symlink's, else empty). A failure writes one line on stderr,
`corral-agent-error: ` and a JSON object (kind: io, usage, not_found,
too_large, escapes or unsafe_entry; message; path, root, entry, reason, size,
limit as they apply), and exits with 1 IO error, 2 usage, 3 not found, 4 too
large, 5 escapes the root or unsafe tar entry.

port relays one connection to PORT on the sandbox's loopback over stdin and
stdout (exit 1 when nothing listens there).

kernel starts a Jupyter kernel for LANGUAGE (python: python3 -m
ipykernel_launcher) on loopback ports with a random key and relays its
messages as JSON lines over stdin and stdout (see kernel.rs).

egress-gateway runs corral's egress gateway with the policy in
CORRAL_EGRESS_POLICY (JSON with allow and deny lists): DNS on UDP 53
answering allowed names only, and a proxy on 80, 443 and the rules' ports
routing TLS by SNI and HTTP by Host. egress-stats prints its counts (JSON),
kept in /egress-stats.json or the file CORRAL_EGRESS_STATS names.

netpol-probe, run in a pod that a NetworkPolicy lets reach IP on
ALLOWED_PORT only, prints whether the cluster enforces it: enforced,
not-enforced or unreachable, with why.";

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
enum Mode {
    Init(InitOptions),
    Install(String),
    File(FileRequest),
    Port(u16),
    Kernel(String),
    EgressGateway,
    EgressStats,
    NetpolProbe(netprobe::Probe),
    Version,
    Help,
}

/// Parses the arguments of a file command: one PATH and its flags (`--`
/// ends the flags, for paths starting with `-`).
fn parse_file_args(op: Op, rest: &[String]) -> Result<FileRequest, String> {
    let name = op.name();
    let mut req = FileRequest {
        op,
        path: String::new(),
        root: None,
        mode: None,
        mkdirs: false,
        max: files::DEFAULT_MAX,
    };
    let mut path = None;
    let mut flags_done = false;
    let mut it = rest.iter();
    while let Some(arg) = it.next() {
        if flags_done || !arg.starts_with('-') || arg == "-" {
            if path.replace(arg.clone()).is_some() {
                return Err(format!(
                    "unexpected argument '{arg}' for {name}: one path only"
                ));
            }
            continue;
        }
        if arg == "--" {
            flags_done = true;
            continue;
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f, Some(v.to_string())),
            None => (arg.as_str(), None),
        };
        let allowed = match flag {
            "--root" | "--max" => true,
            "--mode" | "--mkdirs" => op == Op::Write,
            _ => return Err(format!("unexpected argument '{arg}' for {name}")),
        };
        if !allowed {
            return Err(format!("'{flag}' applies to file-write only, not {name}"));
        }
        if flag == "--mkdirs" {
            if inline.is_some() {
                return Err(format!("'--mkdirs' takes no value (got '{arg}')"));
            }
            req.mkdirs = true;
            continue;
        }
        let value = match inline {
            Some(v) => v,
            None => it
                .next()
                .cloned()
                .ok_or_else(|| format!("missing value for '{flag}'"))?,
        };
        match flag {
            "--root" => req.root = Some(value),
            "--max" => {
                req.max = value
                    .parse()
                    .ok()
                    .filter(|m| *m > 0)
                    .ok_or_else(|| format!("invalid value '{value}' for '--max': expected a whole number of bytes above zero"))?;
            }
            _ => {
                req.mode = Some(
                    u32::from_str_radix(&value, 8)
                        .ok()
                        .filter(|m| *m <= 0o7777)
                        .ok_or_else(|| format!("invalid value '{value}' for '--mode': expected octal permission bits like 644"))?,
                );
            }
        }
    }
    req.path = path.ok_or_else(|| format!("missing path for {name}"))?;
    Ok(req)
}

fn parse_args(args: &[String]) -> Result<Mode, String> {
    let Some((first, rest)) = args.split_first() else {
        return Err("missing subcommand".to_string());
    };
    if let Some(op) = Op::from_name(first) {
        return parse_file_args(op, rest).map(Mode::File);
    }
    let no_more = |rest: &[String]| match rest.first() {
        Some(extra) => Err(format!("unexpected argument '{extra}'")),
        None => Ok(()),
    };
    match first.as_str() {
        "init" => {
            let mut grace_ms = DEFAULT_GRACE_MS;
            let mut pristine = None;
            let mut agent_caps = Vec::new();
            let mut pristine_refused = None;
            let mut nproc = None;
            let mut pid_ns = false;
            let mut it = rest.iter();
            while let Some(arg) = it.next() {
                if arg == "--pid-ns" {
                    pid_ns = true;
                    continue;
                }
                if arg == "--pristine" {
                    pristine.get_or_insert(None);
                    continue;
                }
                if arg == "--pristine-refused" {
                    let reason = it
                        .next()
                        .ok_or_else(|| format!("missing value for '{arg}'"))?;
                    pristine_refused = Some(reason.clone());
                    continue;
                }
                if arg == "--agent-caps" || arg.starts_with("--agent-caps=") {
                    let value = match arg.strip_prefix("--agent-caps=") {
                        Some(v) => v,
                        None => it
                            .next()
                            .ok_or_else(|| format!("missing value for '{arg}'"))?,
                    };
                    agent_caps = caps::parse_list(value)?;
                    continue;
                }
                let (flag, value) =
                    if arg == "--grace-ms" || arg == "--pristine-size" || arg == "--nproc" {
                        let v = it
                            .next()
                            .ok_or_else(|| format!("missing value for '{arg}'"))?;
                        (arg.as_str(), v.as_str())
                    } else if let Some(v) = arg.strip_prefix("--grace-ms=") {
                        ("--grace-ms", v)
                    } else if let Some(v) = arg.strip_prefix("--pristine-size=") {
                        ("--pristine-size", v)
                    } else if let Some(v) = arg.strip_prefix("--nproc=") {
                        ("--nproc", v)
                    } else {
                        return Err(format!("unexpected argument '{arg}' for init"));
                    };
                let number: u64 = value.parse().map_err(|_| {
                    let unit = match flag {
                        "--grace-ms" => "milliseconds",
                        "--nproc" => "processes",
                        _ => "bytes",
                    };
                    format!(
                        "invalid value '{value}' for '{flag}': expected a whole number of {unit}"
                    )
                })?;
                match flag {
                    "--grace-ms" => grace_ms = number,
                    "--nproc" => nproc = Some(number),
                    _ => pristine = Some(Some(number)),
                }
            }
            if pristine.is_some() && pristine_refused.is_some() {
                return Err("'--pristine' and '--pristine-refused' exclude each other".into());
            }
            Ok(Mode::Init(InitOptions {
                grace: Duration::from_millis(grace_ms),
                pristine,
                pristine_refused,
                agent_caps,
                nproc,
                pid_ns,
            }))
        }
        "install" => match rest {
            [dir] if dir.starts_with('/') => Ok(Mode::Install(dir.clone())),
            [dir] => Err(format!("install: '{dir}' is not an absolute path")),
            _ => Err("install takes one absolute directory".to_string()),
        },
        "port" => port::parse(rest).map(Mode::Port),
        "kernel" => kernel::parse(rest).map(Mode::Kernel),
        "egress-gateway" => no_more(rest).map(|()| Mode::EgressGateway),
        "egress-stats" => no_more(rest).map(|()| Mode::EgressStats),
        "netpol-probe" => netprobe::parse(rest).map(Mode::NetpolProbe),
        "--version" | "-V" => no_more(rest).map(|()| Mode::Version),
        "--help" | "-h" | "help" => Ok(Mode::Help),
        other => Err(format!("unknown subcommand '{other}'")),
    }
}

fn main() {
    let mut args = Vec::new();
    for a in std::env::args_os().skip(1) {
        match a.into_string() {
            Ok(s) => args.push(s),
            Err(bad) => {
                eprintln!("corral-agent: argument {bad:?} is not valid UTF-8\n{USAGE}");
                std::process::exit(2);
            }
        }
    }
    let code = match parse_args(&args) {
        Ok(Mode::Init(opts)) => init::run(&opts),
        Ok(Mode::Install(dir)) => install::run(&dir),
        Ok(Mode::File(req)) => files::run(&req),
        Ok(Mode::Port(port)) => port::run(port),
        Ok(Mode::Kernel(language)) => kernel::run(&language),
        Ok(Mode::EgressGateway) => egress::run(),
        Ok(Mode::EgressStats) => egress::stats(),
        Ok(Mode::NetpolProbe(probe)) => netprobe::run(probe),
        Ok(Mode::Version) => {
            println!("corral-agent {}", env!("CARGO_PKG_VERSION"));
            0
        }
        Ok(Mode::Help) => {
            println!("{USAGE}");
            0
        }
        // A file command's every failure is a report line, even a usage one.
        Err(message) if args.first().is_some_and(|a| Op::from_name(a).is_some()) => files::report(
            &files::Fail::usage(format!("{message} (see corral-agent --help)")),
        ),
        Err(message) => {
            eprintln!("corral-agent: {message}\n{USAGE}");
            2
        }
    };
    std::process::exit(code);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Mode, String> {
        parse_args(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn parses_subcommands() {
        let default = Mode::Init(InitOptions {
            grace: Duration::from_millis(DEFAULT_GRACE_MS),
            pristine: None,
            pristine_refused: None,
            agent_caps: Vec::new(),
            nproc: None,
            pid_ns: false,
        });
        assert_eq!(parse(&["init"]), Ok(default));
        let pristine = Mode::Init(InitOptions {
            grace: Duration::from_millis(DEFAULT_GRACE_MS),
            pristine: Some(Some(1 << 20)),
            pristine_refused: None,
            agent_caps: Vec::new(),
            nproc: None,
            pid_ns: false,
        });
        assert_eq!(
            parse(&["init", "--pristine", "--pristine-size", "1048576"]),
            Ok(pristine)
        );
        let e = parse(&["init", "--pristine-size", "big"]).expect_err("bad size");
        assert!(
            e.contains("'--pristine-size'") && e.contains("'big'"),
            "{e}"
        );
        let short = Mode::Init(InitOptions {
            grace: Duration::from_millis(1500),
            pristine: None,
            pristine_refused: None,
            agent_caps: Vec::new(),
            nproc: None,
            pid_ns: false,
        });
        assert_eq!(parse(&["init", "--grace-ms", "1500"]), Ok(short));
        let kill = Mode::Init(InitOptions {
            grace: Duration::from_millis(DEFAULT_GRACE_MS),
            pristine: None,
            pristine_refused: None,
            agent_caps: vec![caps::CAP_KILL, caps::CAP_SETPCAP],
            nproc: None,
            pid_ns: false,
        });
        assert_eq!(parse(&["init", "--agent-caps", "KILL,SETPCAP"]), Ok(kill));
        assert!(parse(&["init", "--agent-caps=KILL"]).is_ok());
        let e = parse(&["init", "--agent-caps", "ALL"]).expect_err("unknown cap");
        assert!(e.contains("'--agent-caps'") && e.contains("'ALL'"), "{e}");
        assert!(parse(&["init", "--agent-caps"]).is_err());
        let refused = Mode::Init(InitOptions {
            grace: Duration::from_millis(DEFAULT_GRACE_MS),
            pristine: None,
            pristine_refused: Some("namespace forbids it".into()),
            agent_caps: Vec::new(),
            nproc: None,
            pid_ns: false,
        });
        assert_eq!(
            parse(&["init", "--pristine-refused", "namespace forbids it"]),
            Ok(refused)
        );
        assert!(parse(&["init", "--pristine-refused"]).is_err());
        let e = parse(&["init", "--pristine", "--pristine-refused", "x"]).expect_err("both");
        assert!(e.contains("'--pristine-refused'"), "{e}");
        assert!(matches!(
            parse(&["init", "--grace-ms=0"]),
            Ok(Mode::Init(_))
        ));
        let nproc = parse(&["init", "--nproc", "256"]);
        assert!(
            matches!(&nproc, Ok(Mode::Init(o)) if o.nproc == Some(256)),
            "{nproc:?}"
        );
        let ns = parse(&["init", "--pid-ns"]);
        assert!(matches!(&ns, Ok(Mode::Init(o)) if o.pid_ns), "{ns:?}");
        let e = parse(&["init", "--nproc=many"]).expect_err("not a number");
        assert!(e.contains("'many'") && e.contains("'--nproc'"), "{e}");
        assert!(parse(&["attach"]).is_err(), "the relay is gone");
        assert_eq!(parse(&["--version"]), Ok(Mode::Version));
        assert_eq!(
            parse(&["install", "/.corral"]),
            Ok(Mode::Install("/.corral".into()))
        );
        assert!(parse(&["install", "rel"]).is_err_and(|e| e.contains("'rel'")));
        assert!(parse(&["install"]).is_err());
        assert!(parse(&["install", "/a", "/b"]).is_err());
    }

    #[test]
    fn parses_file_commands() {
        let Ok(Mode::File(r)) = parse(&[
            "file-write",
            "--root",
            "/w",
            "a/b",
            "--mode=640",
            "--mkdirs",
            "--max",
            "10",
        ]) else {
            panic!("file-write did not parse");
        };
        assert_eq!(
            r,
            FileRequest {
                op: Op::Write,
                path: "a/b".into(),
                root: Some("/w".into()),
                mode: Some(0o640),
                mkdirs: true,
                max: 10,
            }
        );
        let Ok(Mode::File(r)) = parse(&["file-read", "/x"]) else {
            panic!("file-read did not parse");
        };
        assert_eq!((r.op, r.max, r.root), (Op::Read, files::DEFAULT_MAX, None));
        // `--` lets a path start with a dash.
        let Ok(Mode::File(r)) = parse(&["tar-create", "--root=/r", "--", "-odd"]) else {
            panic!("tar-create did not parse");
        };
        assert_eq!((r.op, r.path.as_str()), (Op::TarCreate, "-odd"));
        assert!(matches!(parse(&["tar-extract", "/d"]), Ok(Mode::File(_))));
        let Ok(Mode::File(r)) = parse(&["file-list", "--max=99", "/d"]) else {
            panic!("file-list did not parse");
        };
        assert_eq!((r.op, r.path.as_str(), r.max), (Op::List, "/d", 99));
    }

    #[test]
    fn errors_name_the_bad_argument() {
        let e = parse(&["init", "--grace-ms", "soon"]).expect_err("bad value");
        assert!(e.contains("'soon'"), "{e}");
        let e = parse(&["init", "--grace"]).expect_err("bad flag");
        assert!(e.contains("'--grace'"), "{e}");
        let e = parse(&["init", "--grace-ms"]).expect_err("missing value");
        assert!(e.contains("--grace-ms"), "{e}");
        let e = parse(&["--version", "x"]).expect_err("extra");
        assert!(e.contains("'x'"), "{e}");
        let e = parse(&["file-read", "/a", "/b"]).expect_err("two paths");
        assert!(e.contains("'/b'"), "{e}");
        let e = parse(&["file-read", "/a", "--mode", "644"]).expect_err("write only");
        assert!(e.contains("'--mode'") && e.contains("file-read"), "{e}");
        let e = parse(&["file-list", "/a", "--mkdirs"]).expect_err("write only");
        assert!(e.contains("'--mkdirs'") && e.contains("file-list"), "{e}");
        let e = parse(&["file-write", "/a", "--mode", "999"]).expect_err("not octal");
        assert!(e.contains("'999'"), "{e}");
        let e = parse(&["file-write", "/a", "--max", "0"]).expect_err("zero cap");
        assert!(e.contains("'0'") && e.contains("--max"), "{e}");
        let e = parse(&["tar-create", "--root", "/r"]).expect_err("no path");
        assert!(e.contains("missing path"), "{e}");
        let e = parse(&["tar-extract", "/d", "--root"]).expect_err("no value");
        assert!(e.contains("'--root'"), "{e}");
        let e = parse(&["run"]).expect_err("unknown");
        assert!(e.contains("'run'"), "{e}");
        assert!(parse(&[]).is_err());
    }
}
