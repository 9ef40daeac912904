//! Telling the supervisor the truth: `READY=1` once a service can do its job,
//! `WATCHDOG=1` from its main loop, `STOPPING=1` on shutdown.
//!
//! Speaks the `sd_notify` datagram protocol directly (a path or an abstract
//! `@name` in `NOTIFY_SOCKET`), so there is no C dependency. Outside systemd
//! (no `NOTIFY_SOCKET`) every call does nothing.

use std::time::{Duration, Instant};

/// Sends one notification; false when there is no supervisor or it failed.
pub fn notify(state: &str) -> bool {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return false;
    };
    let Ok(socket) = std::os::unix::net::UnixDatagram::unbound() else {
        return false;
    };
    let bytes = path.as_encoded_bytes();
    let sent = if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(name)
            .and_then(|addr| socket.send_to_addr(state.as_bytes(), &addr))
    } else {
        socket.send_to(state.as_bytes(), &path)
    };
    sent.is_ok()
}

/// The service is connected and its consumer groups exist.
pub fn ready() {
    notify("READY=1");
}

/// Shutdown began; the entry in hand is being finished.
pub fn stopping() {
    notify("STOPPING=1");
}

/// Pings the watchdog at a third of its interval, from whatever loop calls [`Watchdog::tick`].
#[derive(Debug)]
pub struct Watchdog {
    every: Option<Duration>,
    last: Option<Instant>,
}

impl Watchdog {
    /// Reads `WATCHDOG_USEC` (and `WATCHDOG_PID`, which must be ours when set).
    pub fn from_env() -> Watchdog {
        let ours = std::env::var("WATCHDOG_PID")
            .ok()
            .and_then(|p| p.parse::<u32>().ok())
            .is_none_or(|p| p == std::process::id());
        let every = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|u| u.parse::<u64>().ok())
            .filter(|u| ours && *u > 0)
            .map(|u| Duration::from_micros(u / 3));
        Watchdog { every, last: None }
    }

    /// The longest a loop may wait between ticks, when a watchdog is set.
    pub fn interval(&self) -> Option<Duration> {
        self.every
    }

    /// Sends `WATCHDOG=1` when due.
    pub fn tick(&mut self) {
        if let Some(every) = self.every {
            if self.last.is_none_or(|t| t.elapsed() >= every) {
                notify("WATCHDOG=1");
                self.last = Some(Instant::now());
            }
        }
    }
}

/// Whether stderr goes to the journal (systemd sets `JOURNAL_STREAM`).
pub fn under_journal() -> bool {
    std::env::var_os("JOURNAL_STREAM").is_some()
}
