//! The runtime's lifecycle events: every sandbox created, failed to start,
//! command finished (with its outcome kind), reset, snapshot, container
//! lost, recovered, evicted, removed, whoever asked for it (the CLI, the
//! REST API, MCP, any front end over this runtime).
//!
//! Kept in a bounded window ([`WINDOW`] events) with increasing ids, so a
//! reader can resume after the last id it saw; older events are gone (the
//! reader is told). Each event carries the sandbox's `corral.tenant` label
//! (set by the service to the tenant that owns it), which is how the
//! service shows each tenant its own.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::broadcast;

/// Events kept for readers that resume.
pub const WINDOW: usize = 10_000;

/// The label naming the tenant that owns a sandbox (set by the service;
/// empty: the operator's).
pub const TENANT_LABEL: &str = "corral.tenant";

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A sandbox was created and started.
    Created,
    /// A start failed (nothing is left of it).
    StartFailed,
    /// A command ended (`outcome`: `ok`, `exit` for a non-zero exit, or the
    /// failure kind).
    Command,
    /// The sandbox was reset (`detail`: in place or replaced).
    Reset,
    /// A snapshot of it was taken (`detail`: the snapshot's name).
    Snapshot,
    /// Its container was lost (`outcome`: the failure kind).
    Lost,
    /// Its lost container was brought back (`recovery: recreate`).
    Recovered,
    /// The provider removed it: idle, too old, or room for another.
    Evicted,
    /// It was removed.
    Removed,
}

impl EventKind {
    /// The name in the event stream.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Created => "created",
            EventKind::StartFailed => "start_failed",
            EventKind::Command => "command",
            EventKind::Reset => "reset",
            EventKind::Snapshot => "snapshot",
            EventKind::Lost => "lost",
            EventKind::Recovered => "recovered",
            EventKind::Evicted => "evicted",
            EventKind::Removed => "removed",
        }
    }
}

/// One event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Increasing from 1 in this process.
    pub id: u64,
    /// When, in ms since the epoch.
    pub time_ms: u64,
    /// What happened.
    pub kind: EventKind,
    /// The sandbox's id.
    pub sandbox: String,
    /// The provider session key it serves, when a provider handed it out
    /// (how the service tells whose it is).
    pub session: Option<String>,
    /// The tenant that owns it (its `corral.tenant` label); `None`: the
    /// operator's, or made outside the service.
    pub tenant: Option<String>,
    /// For commands and losses: `ok`, `exit` or the failure kind.
    pub outcome: Option<String>,
    /// A few words more (an image, an exit code, a snapshot's name).
    pub detail: String,
}

/// The window and the live feed.
pub struct EventLog {
    window: Mutex<(u64, VecDeque<Event>)>,
    live: broadcast::Sender<Event>,
}

impl Default for EventLog {
    fn default() -> Self {
        EventLog {
            window: Mutex::new((0, VecDeque::with_capacity(1024))),
            live: broadcast::channel(4096).0,
        }
    }
}

/// What a reader resuming after an id gets.
#[derive(Debug)]
pub struct Since {
    /// The events after the id still in the window, oldest first.
    pub events: Vec<Event>,
    /// Whether some events after the id had already left the window.
    pub gap: bool,
}

impl EventLog {
    /// Records an event and hands it to live readers.
    #[allow(clippy::too_many_arguments)]
    pub fn emit(
        &self,
        kind: EventKind,
        sandbox: &str,
        session: Option<&str>,
        tenant: Option<&str>,
        outcome: Option<&str>,
        detail: impl Into<String>,
    ) {
        let time_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        w.0 += 1;
        let event = Event {
            id: w.0,
            time_ms,
            kind,
            sandbox: sandbox.to_string(),
            session: session.map(str::to_string),
            tenant: tenant.filter(|t| !t.is_empty()).map(str::to_string),
            outcome: outcome.map(str::to_string),
            detail: detail.into(),
        };
        if w.1.len() == WINDOW {
            w.1.pop_front();
        }
        w.1.push_back(event.clone());
        // Sent under the lock: live readers see ids in order.
        let _ = self.live.send(event);
    }

    /// The events after `after` still kept, and a live feed of the ones to
    /// come, taken together so nothing falls between them.
    pub fn subscribe(&self, after: u64) -> (Since, broadcast::Receiver<Event>) {
        let w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let rx = self.live.subscribe();
        let oldest = w.1.front().map_or(w.0 + 1, |e| e.id);
        let events: Vec<Event> = w.1.iter().filter(|e| e.id > after).cloned().collect();
        let gap = after + 1 < oldest && after < w.0;
        (Since { events, gap }, rx)
    }

    /// The id of the last event (0: none yet).
    pub fn last_id(&self) -> u64 {
        self.window.lock().unwrap_or_else(|p| p.into_inner()).0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_resume_after_an_id_and_learn_of_a_gap() {
        let log = EventLog::default();
        for i in 0..5 {
            log.emit(
                EventKind::Command,
                &format!("sb-{i}"),
                None,
                Some("alice"),
                Some("ok"),
                "",
            );
        }
        let (since, _) = log.subscribe(2);
        assert_eq!(
            since.events.iter().map(|e| e.id).collect::<Vec<_>>(),
            [3, 4, 5]
        );
        assert!(!since.gap);
        assert_eq!(since.events[0].tenant.as_deref(), Some("alice"));
        let (all, _) = log.subscribe(0);
        assert_eq!(all.events.len(), 5);
        assert!(!all.gap);
        for i in 0..WINDOW {
            log.emit(EventKind::Removed, &format!("x{i}"), None, None, None, "");
        }
        let (late, _) = log.subscribe(2);
        assert!(late.gap, "events 3.. left the window");
        assert_eq!(late.events.len(), WINDOW);
        assert_eq!(log.last_id(), 5 + WINDOW as u64);
        let (now, _) = log.subscribe(log.last_id());
        assert!(now.events.is_empty() && !now.gap);
    }

    #[tokio::test]
    async fn live_readers_get_new_events_in_order() {
        let log = EventLog::default();
        let (_, mut rx) = log.subscribe(0);
        log.emit(EventKind::Created, "sb-1", Some("k"), None, None, "img");
        log.emit(EventKind::Removed, "sb-1", Some("k"), None, None, "");
        assert_eq!(
            rx.recv().await.map(|e| e.kind).ok(),
            Some(EventKind::Created)
        );
        assert_eq!(rx.recv().await.map(|e| e.id).ok(), Some(2));
    }
}
