//! Shutdown as a value passed into every service loop.
//!
//! Binaries trigger it from SIGTERM/SIGINT; tests trigger it by hand. Loops select
//! on [`Shutdown::wait`] only around *waiting* (blocking reads, backoff sleeps), never
//! around handling, so the entry in hand is always finished before a service stops.

use tokio::sync::watch;

/// A cloneable shutdown signal.
#[derive(Clone, Debug)]
pub struct Shutdown(watch::Receiver<bool>);

/// The side that triggers a [`Shutdown`].
#[derive(Debug)]
pub struct Trigger(watch::Sender<bool>);

impl Shutdown {
    /// A signal and its trigger.
    pub fn new() -> (Trigger, Shutdown) {
        let (tx, rx) = watch::channel(false);
        (Trigger(tx), Shutdown(rx))
    }

    /// Whether shutdown has been asked for (or its trigger is dropped, as
    /// [`Self::wait`] has it: a loop that checks one and waits on the other
    /// must not spin).
    pub fn is_set(&self) -> bool {
        *self.0.borrow() || self.0.has_changed().is_err()
    }

    /// Resolves once shutdown is asked for (or its trigger is dropped).
    pub async fn wait(&self) {
        let mut rx = self.0.clone();
        let _ = rx.wait_for(|set| *set).await;
    }

    /// Sleeps for `d` unless shutdown comes first; returns false on shutdown.
    pub async fn sleep(&self, d: std::time::Duration) -> bool {
        tokio::select! {
            _ = self.wait() => false,
            _ = tokio::time::sleep(d) => true,
        }
    }

    /// A signal triggered by SIGTERM or SIGINT.
    pub fn from_signals() -> std::io::Result<(Shutdown, tokio::task::JoinHandle<()>)> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let (trigger, shutdown) = Shutdown::new();
        let task = tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::info!("shutdown requested; finishing the entry in hand");
            crate::systemd::stopping();
            trigger.fire();
        });
        Ok((shutdown, task))
    }
}

impl Trigger {
    /// Asks every holder of the signal to stop.
    pub fn fire(&self) {
        let _ = self.0.send(true);
    }
}
