//! `effects`: runs an operator-declared action (a `git push`, say) at a commit
//! an agent names, and only once a human approved exactly that.
//!
//! Every entry waits for approval (`approval.required` is implied and cannot
//! be turned off). The agent names an action and a commit; the approval binds
//! the action, the repository, the full sha, the params and the exact argv;
//! the approver is shown the commit as git has it. Everything else (parking,
//! notices, dead letters, workers) is the broker's.
//!
//! # Layout
//!
//! - [`config`]: the declared actions.
//! - [`guard`]: refuses a repository anyone else could make git misbehave in.
//! - [`request`]: an agent's entry, checked against the config and git.
//! - [`run`]: the [`broker::Sender`] that runs an approved action.
//! - [`rebuild`]: the `rebuild` bridge: a system rebuild at an approved commit,
//!   built from a checkout the bridge owns.
//!
//! The ingest has no platform to read: it keeps its heartbeat, so `cowboy
//! status` shows the bridge whole. The ping checks that each repository is a
//! git repository and each program exists.

pub mod config;
pub mod guard;
pub mod rebuild;
pub mod request;
pub mod run;

use std::sync::Arc;

use broker::bridge::Bridge;
use broker::ingest::Ingest;
use broker::{Config, Result, Shutdown};

use crate::config::EffectsSettings;
use crate::run::Runner;

/// An effects bridge: its validated actions.
pub struct Effects {
    settings: EffectsSettings,
}

impl Bridge for Effects {
    const TYPE: &'static str = "effects";
    type Sender = Runner;

    fn load(config: &Config, name: &str) -> Result<Self> {
        let settings: EffectsSettings = config.bridge(name)?.settings(name)?;
        settings.validate(name)?;
        Ok(Effects { settings })
    }

    fn sender(&self, _name: &str) -> Result<Runner> {
        Ok(Runner {
            settings: self.settings.clone(),
        })
    }

    async fn ingest(self, ingest: Ingest, shutdown: Shutdown) -> Result<()> {
        heartbeat_only(ingest, shutdown).await
    }

    fn probe(&self, _name: &str) -> Result<Option<broker::ping::Probe>> {
        let settings = Arc::new(self.settings.clone());
        Ok(Some(Box::new(move || {
            let settings = settings.clone();
            Box::pin(async move { check(&settings).await })
        })))
    }
}

/// An ingest with no platform to read: it only keeps its heartbeat, so the
/// bridge shows whole in `cowboy status`.
pub(crate) async fn heartbeat_only(mut ingest: Ingest, shutdown: Shutdown) -> Result<()> {
    // The first beat is checked: a connection or permission problem stops
    // the service at start-up, naming it.
    ingest.tick().await?;
    broker::systemd::ready();
    ingest.keep_alive(shutdown).await;
    Ok(())
}

/// Each repository is a git repository and each program can be found.
async fn check(settings: &EffectsSettings) -> std::result::Result<(), String> {
    for (name, action) in &settings.actions {
        check_action(name, action).await?;
    }
    Ok(())
}

/// One action's repository passes the guard and is a git repository, and its
/// program can be found.
pub(crate) async fn check_action(
    name: &str,
    action: &config::Action,
) -> std::result::Result<(), String> {
    guard::check(&action.repo).map_err(|e| format!("`{name}`: {e}"))?;
    request::git(&action.repo, &["rev-parse", "--git-dir"])
        .await
        .map_err(|e| {
            format!(
                "`{name}`: {} is not a git repository: {e}",
                action.repo.display()
            )
        })?;
    let program = &action.command[0];
    if !program_exists(program, action.env.get("PATH").map(String::as_str)) {
        return Err(format!("`{name}`: program `{program}` not found"));
    }
    Ok(())
}

/// Whether `program` (a path, or a name looked up in `path`) is an executable file.
fn program_exists(program: &str, path: Option<&str>) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &std::path::Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        return executable(std::path::Path::new(program));
    }
    path.unwrap_or_default()
        .split(':')
        .filter(|d| !d.is_empty())
        .any(|d| executable(&std::path::Path::new(d).join(program)))
}
