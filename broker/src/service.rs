//! What every bridge binary shares: arguments, tracing, signals and exit codes.
//!
//! A binary's `main` is one call to [`main`] with the [`Bridge`] type it serves
//! and the service it runs. Exit codes follow sysexits so a supervisor can
//! tell "fix the config" ([`EXIT_CONFIG`]) from "a dependency went away"
//! ([`EXIT_UNAVAILABLE`]).

use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;

use crate::bridge::{Bridge, Launch};
use crate::config::{Config, Service};
use crate::error::{ConfigError, Error};
use crate::shutdown::Shutdown;

/// Bad configuration or permissions: restarting will not help.
pub const EXIT_CONFIG: i32 = crate::error::EXIT_CONFIG as i32;
/// Redis or the platform stayed unreachable.
pub const EXIT_UNAVAILABLE: i32 = crate::error::EXIT_UNAVAILABLE as i32;
/// Anything else.
pub const EXIT_SOFTWARE: i32 = crate::error::EXIT_SOFTWARE as i32;

/// Arguments every bridge binary takes.
#[derive(Debug, Parser)]
pub struct BridgeArgs {
    /// The deployment config file.
    #[arg(long, env = "COWBOY_CONFIG")]
    pub config: PathBuf,
    /// Which `[bridges.NAME]` to serve.
    #[arg(long, env = "COWBOY_BRIDGE")]
    pub bridge: String,
    /// Outbox only: this process's consumer name in the bridge's groups, stable
    /// across restarts (letters, digits, `-`, `_`). Default: `worker`.
    #[arg(long, env = "COWBOY_WORKER")]
    pub worker: Option<String>,
}

/// Starts tracing: `RUST_LOG` filters (default `info`); JSON lines when
/// `COWBOY_LOG_FORMAT=json`, which suits a log shipper or the journal.
pub fn init_tracing() {
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
    };
    if crate::systemd::under_journal() {
        // Structured fields (bridge=, approval=, ...) straight into the journal.
        if let Ok(journald) = tracing_journald::layer() {
            use tracing_subscriber::layer::SubscriberExt;
            use tracing_subscriber::util::SubscriberInitExt;
            let _ = tracing_subscriber::registry()
                .with(filter())
                .with(journald)
                .try_init();
            return;
        }
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_writer(std::io::stderr);
    let _ = if std::env::var("COWBOY_LOG_FORMAT").as_deref() == Ok("json") {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// The exit code for an error (see [`Error::exit_code`]).
pub fn exit_code(e: &Error) -> i32 {
    i32::from(e.exit_code())
}

/// Loads the config and checks that bridge `name` exists and has type `kind`.
pub fn load_for(
    path: &std::path::Path,
    name: &str,
    kind: &str,
) -> Result<Arc<Config>, ConfigError> {
    let config = Config::load(path)?;
    let bridge = config.bridge(name)?;
    if bridge.kind != kind {
        return Err(ConfigError::Invalid {
            key: format!("bridges.{name}.type"),
            message: format!(
                "is `{}`, but this binary serves `{kind}` bridges",
                bridge.kind
            ),
        });
    }
    Ok(Arc::new(config))
}

/// The whole `main` of a bridge binary: parse, load, run until a signal, exit.
pub fn main<B: Bridge>(service: Service) -> ! {
    crate::alloc::fix_thresholds();
    let args = BridgeArgs::parse();
    init_tracing();
    let code = match load_for(&args.config, &args.bridge, B::TYPE) {
        Err(e) => {
            tracing::error!("{e}");
            EXIT_CONFIG
        }
        Ok(config) => {
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!("cannot start the runtime: {e}");
                    std::process::exit(EXIT_SOFTWARE);
                }
            };
            runtime.block_on(async move {
                let (shutdown, _signals) = match Shutdown::from_signals() {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::error!("cannot install signal handlers: {e}");
                        return EXIT_SOFTWARE;
                    }
                };
                let launch = Launch::new(config, &args.bridge, args.worker, shutdown);
                let result = crate::bridge::run::<B>(service, launch).await;
                match result {
                    Ok(()) => 0,
                    Err(e) => {
                        tracing::error!("{e}");
                        exit_code(&e)
                    }
                }
            })
        }
    };
    std::process::exit(code)
}

/// `cowboy service SERVICE --bridge NAME`: replaces this process with the bridge
/// type's binary (`cowboy-{type}-{service}`, beside this one or on `PATH`), so one
/// unit template serves every bridge type and the supervisor keeps the same pid.
/// Returns only on failure.
pub fn exec_service(
    config_path: &std::path::Path,
    config: &Config,
    service: Service,
    bridge: &str,
    worker: Option<&str>,
) -> Error {
    use std::os::unix::process::CommandExt;
    let service = service.as_str();
    let kind = match config.bridge(bridge) {
        Ok(b) => b.kind.clone(),
        Err(e) => return e.into(),
    };
    let name = format!("cowboy-{kind}-{service}");
    let beside = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(&name)))
        .filter(|p| p.exists());
    let program = beside.unwrap_or_else(|| name.clone().into());
    let mut command = std::process::Command::new(&program);
    command
        .arg("--config")
        .arg(config_path)
        .arg("--bridge")
        .arg(bridge);
    if let Some(worker) = worker {
        command.arg("--worker").arg(worker);
    }
    let err = command.exec();
    Error::platform(false, format!("cannot run {}: {err}", program.display()))
}
