//! What a bridge crate provides, and the one runner every bridge binary shares.
//!
//! A bridge is its settings, its [`Sender`], its ingest and (optionally) a
//! liveness probe: [`Bridge`]. Everything else (connections, groups, parking,
//! pings, heartbeats) is the broker's, and nothing in `broker` names a bridge
//! type. A binary's `main` is one line: `service::main::<MyBridge>(Service::Outbox)`.
//!
//! Invariant: settings (and the secrets they name) are read and validated before
//! Redis is contacted, so a bad config fails at start-up naming its key.

use std::future::Future;
use std::sync::Arc;

use crate::config::{Config, Service};
use crate::error::{ConfigError, Result};
use crate::ingest::Ingest;
use crate::keys;
use crate::outbox::{OutboxService, Sender};
use crate::ping::{PingService, Probe};
use crate::shutdown::Shutdown;
use crate::store::Store;

/// One bridge type: what talks to its platform.
pub trait Bridge: Sized + Send + Sync + 'static {
    /// The `type` of the `[bridges.NAME]` tables this crate serves.
    const TYPE: &'static str;
    /// Delivers for the outbox service.
    type Sender: Sender;

    /// Reads and validates the settings of bridge `name` (and the secrets they
    /// name); an error names the offending key.
    fn load(config: &Config, name: &str) -> Result<Self>;

    /// The sender of the outbox service.
    fn sender(&self, name: &str) -> Result<Self::Sender>;

    /// Runs the ingest until shutdown: platform events into `ingest`.
    fn ingest(self, ingest: Ingest, shutdown: Shutdown) -> impl Future<Output = Result<()>> + Send;

    /// A platform check run with each ping heartbeat, if the platform has one.
    fn probe(&self, name: &str) -> Result<Option<Probe>> {
        let _ = name;
        Ok(None)
    }
}

/// What a service process was started with.
pub struct Launch {
    pub config: Arc<Config>,
    /// The `[bridges.NAME]` served.
    pub bridge: String,
    /// The outbox worker name (`--worker`); `None` is the default worker.
    pub worker: Option<String>,
    pub shutdown: Shutdown,
}

/// Runs one service of a bridge of type `B` until shutdown.
pub async fn run<B: Bridge>(service: Service, launch: Launch) -> Result<()> {
    let Launch {
        config,
        bridge: name,
        worker,
        shutdown,
    } = launch;
    let bridge = B::load(&config, &name)?;
    if worker.is_some() && service != Service::Outbox {
        return Err(ConfigError::invalid("--worker", "only the outbox service has workers").into());
    }
    let store = Store::connect(&config.redis_for(&name, service)).await?;
    match service {
        Service::Outbox => {
            let sender = bridge.sender(&name)?;
            // The engine runs on its own shutdown, fired by the service's, or
            // by the task beside it that applies the operators' and the page's
            // decisions on a parking bridge's approvals (see `crate::request`)
            // when that stops for good: an outbox that delivers while ignoring
            // decisions would fail silently.
            let (trigger, engine) = Shutdown::new();
            let outbox = OutboxService::new(config.clone(), &name, sender, store.clone(), engine)?
                .with_worker(worker.as_deref())?;
            let parks = config.bridge(&name)?.approval.required;
            let worker = worker.unwrap_or_else(|| keys::DEFAULT_WORKER.to_string());
            let beside = tokio::spawn(async move {
                let result = match parks {
                    true => {
                        crate::request::serve(store, config, name, worker, shutdown.clone()).await
                    }
                    false => Ok(()),
                };
                if result.is_ok() {
                    shutdown.wait().await;
                }
                trigger.fire();
                result
            });
            let result = outbox.run().await;
            // Stopped, or failed by itself: the task beside goes with it (a
            // request cut short stays pending and lapses unapplied).
            if !beside.is_finished() {
                beside.abort();
            }
            match beside.await {
                Ok(Err(e)) => Err(e),
                _ => result,
            }
        }
        Service::Ingest => {
            let ingest = Ingest::new(config, &name, store)?;
            bridge.ingest(ingest, shutdown).await
        }
        Service::Ping => {
            let mut ping = PingService::new(config, &name, store, shutdown)?;
            if let Some(probe) = bridge.probe(&name)? {
                ping = ping.with_probe(probe);
            }
            ping.run().await
        }
    }
}
