//! The mailbox of one running command.
//!
//! Three threads talk to a command's supervisor: the reaper (the exit status),
//! the connection reader (stdin bytes, stdin EOF) and nobody else. They drop
//! their news here and poke an eventfd; the supervisor sleeps in `poll` on its
//! pipes plus that eventfd, so it wakes for output, input and exit alike
//! without a thread per pipe.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use corral_core::protocol::{CommandUsage, PtySize};

use crate::sys::{EventFd, ExitStatus, Rusage};

/// What the supervisor has not picked up yet.
#[derive(Debug, Default)]
pub struct Inbox {
    /// Exit status and when the reaper saw it.
    pub exit: Option<(ExitStatus, Instant)>,
    /// Stdin bytes received from the client, not yet written to the pipe.
    pub stdin: Vec<u8>,
    /// The client sent StdinEof.
    pub stdin_eof: bool,
    /// The latest terminal size asked for, not yet applied.
    pub resize: Option<PtySize>,
}

#[derive(Debug, Default)]
struct State {
    inbox: Inbox,
    /// Set once the exit status arrived; never cleared. Lets the connection
    /// avoid signalling a pid that may already belong to someone else.
    exited: bool,
    /// Stdin was closed by the client; later Stdin frames are errors.
    stdin_closed: bool,
    /// The session ended: nobody will read this command's result.
    abandoned: bool,
    /// What the main process used (with the descendants it waited for),
    /// once reaped.
    main: Option<Rusage>,
    /// What the orphans of its group reaped so far used, and how many.
    orphans: Rusage,
    orphan_count: u32,
}

/// Why a Stdin/StdinEof frame was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StdinRefused {
    /// The command was started with `stdin: false`.
    NoPipe,
    /// StdinEof was already received.
    AlreadyClosed,
    /// A Resize for a command that does not run on a terminal.
    NoTerminal,
}

/// Shared between a command's supervisor and the threads feeding it.
#[derive(Debug)]
pub struct Control {
    state: Mutex<State>,
    wake: EventFd,
    has_stdin: bool,
    on_terminal: bool,
    /// Set (under the frame writer's lock) once Exited went out: nothing
    /// about this command may follow it.
    pub reported: std::sync::atomic::AtomicBool,
}

/// Locks `m`, ignoring poisoning: a panicking holder cannot leave these plain
/// data structures half-updated in a way worse than losing the agent.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Control {
    /// A mailbox for a command with (or without) a stdin pipe.
    #[cfg(test)]
    pub fn new(has_stdin: bool) -> std::io::Result<Self> {
        Self::with_terminal(has_stdin, false)
    }

    /// A mailbox for a command on a terminal (input always, and resizes)
    /// or not.
    pub fn with_terminal(has_stdin: bool, on_terminal: bool) -> std::io::Result<Self> {
        Ok(Control {
            state: Mutex::new(State::default()),
            wake: EventFd::new()?,
            has_stdin: has_stdin || on_terminal,
            on_terminal,
            reported: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Called by the reaper with the command's exit status and what its
    /// main process used.
    pub fn set_exit(&self, status: ExitStatus, used: Rusage, at: Instant) {
        {
            let mut s = lock(&self.state);
            s.inbox.exit = Some((status, at));
            s.exited = true;
            s.main = Some(used);
        }
        self.wake.notify();
    }

    /// Called by the reaper with what an orphan of the command's process
    /// group used.
    pub fn add_orphan(&self, used: Rusage) {
        let mut s = lock(&self.state);
        s.orphans.add(used);
        s.orphan_count = s.orphan_count.saturating_add(1);
    }

    /// What the command's processes used so far: the main process once
    /// reaped, and the orphans charged to it; `None` before the main
    /// process was reaped.
    pub fn usage(&self) -> Option<CommandUsage> {
        let s = lock(&self.state);
        let mut used = s.main?;
        used.add(s.orphans);
        let micros = |d: std::time::Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        Some(CommandUsage {
            user_us: micros(used.user),
            system_us: micros(used.system),
            max_rss_bytes: used.max_rss_kib.saturating_mul(1024),
            orphans: s.orphan_count,
        })
    }

    /// True once the command's main process has been reaped.
    pub fn exited(&self) -> bool {
        lock(&self.state).exited
    }

    /// Tells a supervisor still waiting for output after the main process
    /// exited that its session is over: it kills what holds the output and
    /// finishes.
    pub fn abandon(&self) {
        lock(&self.state).abandoned = true;
        self.wake.notify();
    }

    /// True once [`Control::abandon`] was called.
    pub fn abandoned(&self) -> bool {
        lock(&self.state).abandoned
    }

    /// Queues bytes for the command's stdin.
    pub fn push_stdin(&self, bytes: &[u8]) -> Result<(), StdinRefused> {
        self.check_stdin()?;
        {
            let mut s = lock(&self.state);
            if s.stdin_closed {
                return Err(StdinRefused::AlreadyClosed);
            }
            s.inbox.stdin.extend_from_slice(bytes);
        }
        self.wake.notify();
        Ok(())
    }

    /// Closes the command's stdin once queued bytes are written.
    pub fn close_stdin(&self) -> Result<(), StdinRefused> {
        self.check_stdin()?;
        {
            let mut s = lock(&self.state);
            if s.stdin_closed {
                return Err(StdinRefused::AlreadyClosed);
            }
            s.stdin_closed = true;
            s.inbox.stdin_eof = true;
        }
        self.wake.notify();
        Ok(())
    }

    /// Queues a new terminal size (only the latest one counts).
    pub fn resize(&self, size: PtySize) -> Result<(), StdinRefused> {
        if !self.on_terminal {
            return Err(StdinRefused::NoTerminal);
        }
        lock(&self.state).inbox.resize = Some(size);
        self.wake.notify();
        Ok(())
    }

    fn check_stdin(&self) -> Result<(), StdinRefused> {
        if self.has_stdin {
            Ok(())
        } else {
            Err(StdinRefused::NoPipe)
        }
    }

    /// Takes everything queued so far (the supervisor's side). Clears the
    /// eventfd first, so news arriving after this call wakes the next poll.
    pub fn take(&self) -> Inbox {
        self.wake.clear();
        std::mem::take(&mut lock(&self.state).inbox)
    }

    /// The eventfd to poll for news.
    pub fn wake_fd(&self) -> std::os::fd::RawFd {
        self.wake.raw()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdin_rules() {
        let c = Control::new(true).expect("control");
        assert_eq!(c.push_stdin(b"ab"), Ok(()));
        assert_eq!(c.push_stdin(b"c"), Ok(()));
        assert_eq!(c.close_stdin(), Ok(()));
        assert_eq!(c.push_stdin(b"d"), Err(StdinRefused::AlreadyClosed));
        assert_eq!(c.close_stdin(), Err(StdinRefused::AlreadyClosed));
        let inbox = c.take();
        assert_eq!(inbox.stdin, b"abc");
        assert!(inbox.stdin_eof);
        let none = Control::new(false).expect("control");
        assert_eq!(none.push_stdin(b"x"), Err(StdinRefused::NoPipe));
        let size = PtySize { cols: 80, rows: 24 };
        assert_eq!(none.resize(size), Err(StdinRefused::NoTerminal));
        let tty = Control::with_terminal(false, true).expect("control");
        assert_eq!(tty.push_stdin(b"y"), Ok(()));
        assert_eq!(tty.resize(PtySize { cols: 1, rows: 1 }), Ok(()));
        assert_eq!(tty.resize(size), Ok(()));
        let inbox = tty.take();
        assert_eq!((inbox.stdin, inbox.resize), (b"y".to_vec(), Some(size)));
    }

    #[test]
    fn exit_is_delivered_once_and_remembered() {
        let c = Control::new(false).expect("control");
        assert!(!c.exited());
        assert_eq!(c.usage(), None);
        let ms = std::time::Duration::from_millis;
        c.add_orphan(Rusage {
            user: ms(5),
            system: ms(1),
            max_rss_kib: 9000,
        });
        c.set_exit(
            ExitStatus::Code(4),
            Rusage {
                user: ms(20),
                system: ms(2),
                max_rss_kib: 100,
            },
            Instant::now(),
        );
        assert!(c.exited());
        assert!(matches!(c.take().exit, Some((ExitStatus::Code(4), _))));
        assert!(c.take().exit.is_none());
        assert!(c.exited());
        // CPU adds up over the processes; memory is the largest one's.
        assert_eq!(
            c.usage(),
            Some(CommandUsage {
                user_us: 25_000,
                system_us: 3_000,
                max_rss_bytes: 9000 * 1024,
                orphans: 1,
            })
        );
    }
}
