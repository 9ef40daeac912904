//! `rebuild`: a system rebuild at a commit an agent names, once a human
//! approved exactly that commit (the protocol's second gated effect).
//!
//! Invariants:
//! - One rebuild is declared per bridge: `flake` (a git repository),
//!   `checkout` (a directory the bridge owns) and `command`, where
//!   `{checkout}` stands for that directory. A command naming the repository
//!   itself (where uncommitted edits may sit) fails the start-up: what is
//!   built is the approved commit, checked out detached in `checkout` (a git
//!   worktree of `flake`), never the operator's working tree, whose edits are
//!   neither built nor touched.
//! - One rebuild at a time (every request has the one destination `rebuild`).
//! - The commit last built successfully is remembered beside the checkout; a
//!   request for it is answered `done` without building again.
//! - Everything else is the effects bridge's: the approval binds the commit
//!   and the exact argv, the repository guard applies, a rebuild cut off by a
//!   crash is `uncertain` and not run again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use broker::bridge::Bridge;
use broker::bridge::{Outgoing, Report, SendError, Sender, Sent};
use broker::entry::Message;
use broker::entry::NoticeStatus;
use broker::error::ConfigError;
use broker::ingest::Ingest;
use broker::store::Entry;
use broker::{Config, Result, Shutdown};
use serde::Deserialize;

use crate::config::Action;
use crate::request::{self, Bound};

/// The one destination of every request: rebuilds never overlap.
const DESTINATION: &str = "rebuild";

/// The rebuild bridge's own keys.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RebuildSettings {
    /// The git repository (e.g. `/etc/nixos`) whose commit is built.
    pub flake: PathBuf,
    /// The directory the bridge checks the approved commit out into.
    pub checkout: PathBuf,
    /// argv, e.g. `["nixos-rebuild", "switch", "--flake", "{checkout}#host"]`.
    pub command: Vec<String>,
    #[serde(default = "default_timeout")]
    pub timeout: u64,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub target: Option<String>,
}

fn default_timeout() -> u64 {
    3600
}

impl RebuildSettings {
    pub fn validate(&self, bridge: &str) -> std::result::Result<(), ConfigError> {
        let at = format!("bridges.{bridge}");
        crate::config::check_run(&at, &self.command, self.timeout)?;
        // Compared with repeated and trailing slashes folded away.
        let fold = |s: &str| {
            let mut out = String::new();
            for c in s.chars() {
                if !(c == '/' && out.ends_with('/')) {
                    out.push(c);
                }
            }
            out
        };
        let flake = fold(&self.flake.display().to_string());
        let flake = flake.trim_end_matches('/').to_string();
        if let Some(arg) = self.command.iter().find(|a| fold(a).contains(&flake)) {
            return Err(ConfigError::invalid(
                format!("{at}.command"),
                format!("`{arg}` names the repository itself, where uncommitted edits may sit: build `{{checkout}}`"),
            ));
        }
        if !self.command.iter().any(|a| a.contains("{checkout}")) {
            return Err(ConfigError::invalid(
                format!("{at}.command"),
                "must build `{checkout}`, the approved commit's checkout",
            ));
        }
        if self.checkout.starts_with(&self.flake) || self.flake.starts_with(&self.checkout) {
            return Err(ConfigError::invalid(
                format!("{at}.checkout"),
                "must be a directory of its own, outside the repository",
            ));
        }
        Ok(())
    }

    /// The rebuild as an action: its argv with `{checkout}` in place.
    fn action(&self) -> Action {
        let checkout = self.checkout.display().to_string();
        Action {
            repo: self.flake.clone(),
            command: self
                .command
                .iter()
                .map(|a| a.replace("{checkout}", &checkout))
                .collect(),
            params: BTreeMap::new(),
            timeout: self.timeout,
            env: self.env.clone(),
            target: self.target.clone(),
            idempotent: false,
        }
    }

    /// Where the commit last built is remembered.
    fn built_marker(&self) -> PathBuf {
        let mut name = self.checkout.file_name().unwrap_or_default().to_os_string();
        name.push(".built");
        self.checkout.with_file_name(name)
    }
}

/// A rebuild bridge.
pub struct Rebuild {
    settings: RebuildSettings,
}

impl Bridge for Rebuild {
    const TYPE: &'static str = "rebuild";
    type Sender = Rebuilder;

    fn load(config: &Config, name: &str) -> Result<Self> {
        let settings: RebuildSettings = config.bridge(name)?.settings(name)?;
        settings.validate(name)?;
        Ok(Rebuild { settings })
    }

    fn sender(&self, _name: &str) -> Result<Rebuilder> {
        Ok(Rebuilder {
            settings: self.settings.clone(),
        })
    }

    async fn ingest(self, ingest: Ingest, shutdown: Shutdown) -> Result<()> {
        crate::heartbeat_only(ingest, shutdown).await
    }

    fn probe(&self, _name: &str) -> Result<Option<broker::ping::Probe>> {
        let action = self.settings.action();
        Ok(Some(Box::new(move || {
            let action = action.clone();
            Box::pin(async move { crate::check_action("rebuild", &action).await })
        })))
    }
}

/// Runs approved rebuilds.
pub struct Rebuilder {
    settings: RebuildSettings,
}

/// Fields an agent may write on a rebuild bridge.
const FIELDS: &[&str] = &["sha", "request_id"];

impl Sender for Rebuilder {
    const DEDUPLICATES: bool = false;

    async fn request(
        &self,
        entry: &Entry,
        _bridge: &broker::config::BridgeConfig,
    ) -> std::result::Result<Message, String> {
        request::check_fields(entry, FIELDS, "a rebuild")?;
        let sha = request::sha_field(entry)?;
        let request_id = entry.text("request_id").map(str::to_string);
        let mut action = self.settings.action();
        crate::guard::check(&action.repo)?;
        request::commit_exists(&action.repo, &sha).await?;
        // Without a target, the approver sees the change from what was built
        // last (not only the tip commit's own files).
        if action.target.is_none() {
            action.target = built(&self.settings.built_marker()).map(|(sha, _)| sha);
        }
        let mut context = request::context(&action, &sha).await;
        if let Some(base) = action.target.as_deref() {
            let range = format!("{base}..{sha}");
            let lock = request::git(
                &action.repo,
                &[
                    "diff",
                    "--no-ext-diff",
                    "--no-textconv",
                    &range,
                    "--",
                    "flake.lock",
                ],
            )
            .await
            .unwrap_or_else(|e| format!("(unavailable: {e})"));
            if !lock.trim().is_empty() {
                context.push_str(&format!("\n\nflake.lock against {base}:\n"));
                context.push_str(&request::capped(lock.trim_end(), 400));
            }
        }
        let bound = Bound {
            action: DESTINATION.into(),
            repository: action.repo.display().to_string(),
            commit: sha.clone(),
            argv: action.argv(&sha, &BTreeMap::new()),
            params: BTreeMap::new(),
        };
        Ok(Message {
            channel_id: DESTINATION.into(),
            content: bound.content(),
            request_id,
            context: Some(context),
            ..Message::default()
        })
    }

    async fn send(&self, out: Outgoing<'_>) -> std::result::Result<Sent, SendError> {
        let bound = Bound::parse(&out.message.content).map_err(SendError::Permanent)?;
        let action = self.settings.action();
        crate::run::verify(&bound, &action, out.retry).await?;
        let done = |reason: String, output: String| Sent {
            external_id: format!("rebuild:{}", out.delivery_key),
            report: Some(Report {
                status: NoticeStatus::Done,
                exit_code: Some(0),
                output,
                reason,
            }),
        };
        let marker = self.settings.built_marker();
        let argv = serde_json::to_string(&bound.argv).expect("strings serialize");
        if built(&marker).is_some_and(|(sha, by)| sha == bound.commit && by == argv) {
            return Ok(done(
                format!(
                    "{} was built last, by this same command: nothing to do",
                    bound.commit
                ),
                String::new(),
            ));
        }
        // Whatever happens next, the last build is no longer known to be current.
        forget(&marker).map_err(SendError::Permanent)?;
        check_out(&action.repo, &self.settings.checkout, &bound.commit)
            .await
            .map_err(SendError::Permanent)?;
        tracing::info!(commit = %bound.commit, argv = ?bound.argv, "rebuilding at an approved commit");
        let report = crate::run::run(
            &bound.argv,
            &self.settings.checkout,
            &action.env,
            std::time::Duration::from_secs(action.timeout),
        )
        .await
        .map_err(SendError::Permanent)?;
        match report.status {
            NoticeStatus::Done => {
                if let Err(e) = remember(&marker, &bound.commit, &argv) {
                    tracing::warn!(error = %e, "the built commit could not be remembered");
                }
                Ok(done(report.reason, report.output))
            }
            _ => Err(SendError::Ran(report)),
        }
    }
}

/// The commit last built and the argv (JSON) that built it.
fn built(marker: &Path) -> Option<(String, String)> {
    if !std::fs::symlink_metadata(marker).is_ok_and(|m| m.is_file()) {
        return None;
    }
    let text = std::fs::read_to_string(marker).ok()?;
    let (sha, argv) = text.trim_end().split_once('\n')?;
    Some((sha.to_string(), argv.to_string()))
}

/// Forgets the last build (a link in its place is refused, never followed).
fn forget(marker: &Path) -> std::result::Result<(), String> {
    match std::fs::symlink_metadata(marker) {
        Ok(m) if !m.is_file() => Err(format!("{} is not a plain file: refused", marker.display())),
        Ok(_) => std::fs::remove_file(marker).map_err(|e| format!("{}: {e}", marker.display())),
        Err(_) => Ok(()),
    }
}

/// Remembers a build: written beside, then renamed over it (so a link put in
/// its place is replaced, never followed).
fn remember(marker: &Path, sha: &str, argv: &str) -> std::io::Result<()> {
    let tmp = marker.with_extension("built.tmp");
    let _ = std::fs::remove_file(&tmp);
    std::fs::write(&tmp, format!("{sha}\n{argv}\n"))?;
    std::fs::rename(&tmp, marker)
}

/// Checks `sha` out, detached, in `checkout`: a worktree of `repo` the bridge
/// owns, made afresh each time. The repository's own working tree is not
/// touched, and nothing at `checkout` is removed unless it is empty or this
/// repository's own worktree (a link there is refused, never followed).
async fn check_out(repo: &Path, checkout: &Path, sha: &str) -> std::result::Result<(), String> {
    const CHECKOUT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);
    let path = checkout.display().to_string();
    match std::fs::symlink_metadata(checkout) {
        Err(_) => {}
        Ok(m) if !m.is_dir() => {
            return Err(format!(
                "{path} is not a directory (a link or a file): refused"
            ));
        }
        Ok(_) => {
            let empty = std::fs::read_dir(checkout)
                .map(|mut d| d.next().is_none())
                .unwrap_or(false);
            if !empty && !ours(repo, checkout).await {
                return Err(format!(
                    "{path} is not a checkout this bridge made: refused to replace it"
                ));
            }
        }
    }
    // An earlier checkout goes, whatever state (even locked) it was left in.
    let _ = request::git(repo, &["worktree", "unlock", &path]).await;
    let _ = request::git(repo, &["worktree", "remove", "--force", "--force", &path]).await;
    if std::fs::symlink_metadata(checkout).is_ok_and(|m| m.is_dir()) {
        std::fs::remove_dir_all(checkout).map_err(|e| format!("cannot clear {path}: {e}"))?;
    }
    let _ = request::git(repo, &["worktree", "prune"]).await;
    request::git_within(
        repo,
        &[
            "worktree", "add", "--detach", "--force", "--force", &path, sha,
        ],
        CHECKOUT_TIMEOUT,
    )
    .await
    .map_err(|e| format!("cannot check {sha} out in {path}: {e}"))?;
    Ok(())
}

/// Whether `checkout` is a worktree of `repo`: its `.git` is a file naming
/// one of `repo`'s worktrees.
async fn ours(repo: &Path, checkout: &Path) -> bool {
    let dot = checkout.join(".git");
    if !std::fs::symlink_metadata(&dot).is_ok_and(|m| m.is_file()) {
        return false;
    }
    let Ok(common) = request::git(
        repo,
        &["rev-parse", "--path-format=absolute", "--git-common-dir"],
    )
    .await
    else {
        return false;
    };
    let worktrees = Path::new(common.trim()).join("worktrees");
    std::fs::read_to_string(&dot).is_ok_and(|text| {
        text.trim()
            .strip_prefix("gitdir: ")
            .is_some_and(|dir| Path::new(dir).parent() == Some(worktrees.as_path()))
    })
}
