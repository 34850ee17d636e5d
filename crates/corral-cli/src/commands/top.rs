//! `corral top`: a live view of the sandboxes on the daemon (or cluster),
//! refreshed every interval: id, session or owner, age, state, CPU (share
//! of one core over the last interval), memory against its limit,
//! processes, image. Sorted by a key the user picks; fits 80x24 and works
//! over SSH (ratatui on crossterm, drawn on the alternate screen).

use std::collections::HashMap;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::{Args, ValueEnum};
use corral::backend::{SandboxInfo, Usage};
use corral::Backend;
use crossterm::event::{self, Event, KeyCode, KeyEventKind};
use futures_util::StreamExt;
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Cell, Row, Table};
use ratatui::Frame;

/// Watch the sandboxes on the daemon, live (q quits).
///
/// One row per sandbox: id, its session (or owning process), age, state,
/// CPU (percent of one core over the last interval), memory against its
/// limit, processes, image. Keys: c, m, a, p, i sort by CPU, memory, age,
/// processes, id; q or Esc quits. Usage comes from the engine's accounting
/// (the container's cgroup), read once per interval per sandbox.
#[derive(Args, Debug)]
pub struct TopArgs {
    /// Refresh interval in ms (at least 200).
    #[arg(long, default_value_t = 2000, value_name = "MS")]
    interval_ms: u64,
    /// Sort key to start with.
    #[arg(long, value_enum, default_value_t = SortKey::Cpu)]
    sort: SortKey,
    /// Print one snapshot as text and exit (no terminal needed).
    #[arg(long)]
    once: bool,
}

/// What the rows are sorted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SortKey {
    /// CPU, busiest first.
    Cpu,
    /// Memory, largest first.
    Mem,
    /// Age, oldest first.
    Age,
    /// Processes, most first.
    Pids,
    /// Sandbox id.
    Id,
}

/// One row as shown.
struct RowData {
    id: String,
    who: String,
    age_s: i64,
    state: String,
    cpu_pct: Option<f64>,
    mem: Option<u64>,
    mem_limit: Option<u64>,
    pids: Option<u64>,
    image: String,
}

fn now_s() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn mib(b: u64) -> String {
    if b >= 10 << 30 {
        format!("{:.0}G", b as f64 / (1u64 << 30) as f64)
    } else if b >= 1 << 30 {
        format!("{:.1}G", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.0}M", b as f64 / (1u64 << 20) as f64)
    }
}

fn age(s: i64) -> String {
    match s {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s => format!("{}h", s / 3600),
    }
}

/// Who a sandbox is for: its session key, else the process that made it.
fn who(info: &SandboxInfo) -> String {
    if let Some(s) = &info.session {
        return s.clone();
    }
    match &info.owner {
        Some(o) => format!("{}:{}", o.host, o.pid),
        None => "-".into(),
    }
}

/// Reads every sandbox's usage (eight at a time) and turns the CPU time
/// into a share of one core since the previous sample.
async fn sample(
    backend: &dyn Backend,
    previous: &mut HashMap<String, (u64, Instant)>,
) -> anyhow::Result<Vec<RowData>> {
    let list = backend.list().await.context("list the sandboxes")?;
    let usages: Vec<(SandboxInfo, Option<Usage>)> = futures_util::stream::iter(list)
        .map(|info| async move {
            let usage = if info.state.is_running() {
                backend.usage(&info.placement).await.ok()
            } else {
                None
            };
            (info, usage)
        })
        .buffer_unordered(8)
        .collect()
        .await;
    let now = Instant::now();
    let mut seen = HashMap::new();
    let rows = usages
        .into_iter()
        .map(|(info, usage)| {
            let cpu_pct = usage.as_ref().and_then(|u| {
                let before = previous.get(&info.sandbox_id).copied();
                seen.insert(info.sandbox_id.clone(), (u.cpu_ns, now));
                let (ns, at) = before?;
                let dt = now.duration_since(at).as_nanos() as f64;
                (dt > 0.0).then(|| u.cpu_ns.saturating_sub(ns) as f64 / dt * 100.0)
            });
            RowData {
                id: info.sandbox_id.clone(),
                who: who(&info),
                age_s: (now_s() - info.created).max(0),
                state: info.state.as_str().to_string(),
                cpu_pct,
                mem: usage.as_ref().map(|u| u.memory_bytes),
                mem_limit: usage.as_ref().and_then(|u| u.memory_limit_bytes),
                pids: usage.as_ref().map(|u| u.pids),
                image: info.image.clone(),
            }
        })
        .collect();
    *previous = seen;
    Ok(rows)
}

fn sort(rows: &mut [RowData], key: SortKey) {
    match key {
        SortKey::Cpu => rows.sort_by(|a, b| {
            b.cpu_pct
                .unwrap_or(-1.0)
                .total_cmp(&a.cpu_pct.unwrap_or(-1.0))
        }),
        SortKey::Mem => rows.sort_by_key(|r| std::cmp::Reverse(r.mem.unwrap_or(0))),
        SortKey::Age => rows.sort_by_key(|r| std::cmp::Reverse(r.age_s)),
        SortKey::Pids => rows.sort_by_key(|r| std::cmp::Reverse(r.pids.unwrap_or(0))),
        SortKey::Id => rows.sort_by(|a, b| a.id.cmp(&b.id)),
    }
}

/// The row's cells as text: id, who, age, state, cpu, mem/limit, pids, image.
fn cells(r: &RowData) -> [String; 8] {
    let short = |s: &str, n: usize| s.chars().take(n).collect::<String>();
    [
        short(&r.id, 15),
        short(&r.who, 14),
        age(r.age_s),
        short(&r.state, 8),
        r.cpu_pct
            .map(|c| format!("{c:.0}%"))
            .unwrap_or_else(|| "-".into()),
        match (r.mem, r.mem_limit) {
            (Some(m), Some(l)) => format!("{}/{}", mib(m), mib(l)),
            (Some(m), None) => mib(m),
            _ => "-".into(),
        },
        r.pids.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
        r.image.clone(),
    ]
}

const HEADER: [&str; 8] = [
    "SANDBOX",
    "SESSION",
    "AGE",
    "STATE",
    "CPU",
    "MEM/LIMIT",
    "PIDS",
    "IMAGE",
];
const WIDTHS: [u16; 8] = [15, 14, 4, 8, 5, 11, 4, 12];

fn draw(frame: &mut Frame, rows: &[RowData], key: SortKey, note: &str) {
    let [head, body] =
        Layout::vertical([Constraint::Length(1), Constraint::Min(1)]).areas(frame.area());
    let running = rows.iter().filter(|r| r.state == "running").count();
    frame.render_widget(
        Line::from(format!(
            "corral top: {} sandboxes, {running} running; sort {key:?} (c m a p i), q quits {note}",
            rows.len()
        ))
        .style(Style::default().add_modifier(Modifier::REVERSED)),
        head,
    );
    let table = Table::new(
        rows.iter().map(|r| Row::new(cells(r).map(Cell::from))),
        WIDTHS.map(Constraint::Length),
    )
    .header(Row::new(HEADER).style(Style::default().add_modifier(Modifier::BOLD)));
    frame.render_widget(table, body);
}

pub async fn run(config: super::BackendConfig, args: TopArgs) -> anyhow::Result<ExitCode> {
    if args.interval_ms < 200 {
        return Err(crate::diagnostics::CliError::BadArgument {
            command: "top",
            what: "--interval-ms",
            value: args.interval_ms.to_string(),
            reason: "below 200",
        }
        .into());
    }
    let runtime = super::connect(config).await?;
    let backend = runtime.backend().clone();
    let mut previous = HashMap::new();
    let interval = Duration::from_millis(args.interval_ms);
    if args.once || !std::io::stdout().is_terminal() {
        // Two samples, so CPU has an interval to be measured over.
        sample(backend.as_ref(), &mut previous).await?;
        tokio::time::sleep(interval.min(Duration::from_secs(1))).await;
        let mut rows = sample(backend.as_ref(), &mut previous).await?;
        sort(&mut rows, args.sort);
        println!("{}", HEADER.join("\t"));
        for r in &rows {
            println!("{}", cells(r).join("\t"));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut terminal = ratatui::init();
    let mut key = args.sort;
    let mut rows = Vec::new();
    let mut note = String::new();
    let mut next = Instant::now();
    let outcome: anyhow::Result<()> = async {
        loop {
            if Instant::now() >= next {
                match sample(backend.as_ref(), &mut previous).await {
                    Ok(r) => {
                        rows = r;
                        note.clear();
                    }
                    Err(e) => note = format!("({e:#})"),
                }
                next = Instant::now() + interval;
            }
            sort(&mut rows, key);
            terminal.draw(|f| draw(f, &rows, key, &note))?;
            let wait = next.saturating_duration_since(Instant::now());
            let polled =
                tokio::task::block_in_place(|| event::poll(wait.min(Duration::from_millis(250))))?;
            if polled {
                if let Event::Key(k) = tokio::task::block_in_place(event::read)? {
                    if k.kind != KeyEventKind::Press {
                        continue;
                    }
                    match k.code {
                        KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                        KeyCode::Char('c') => key = SortKey::Cpu,
                        KeyCode::Char('m') => key = SortKey::Mem,
                        KeyCode::Char('a') => key = SortKey::Age,
                        KeyCode::Char('p') => key = SortKey::Pids,
                        KeyCode::Char('i') => key = SortKey::Id,
                        _ => {}
                    }
                }
            }
        }
    }
    .await;
    ratatui::restore();
    outcome?;
    Ok(ExitCode::SUCCESS)
}
