//! Running an approved action: the [`broker::Sender`] of an effects bridge.
//!
//! Invariants:
//! - What runs is re-derived from the config and the repository and must equal
//!   what was approved (the argv, the commit): otherwise nothing runs.
//! - The command runs without a shell, in the repository, with only the
//!   environment the action declares, in its own process group, killed (the
//!   whole group) at its timeout. The last [`TAIL_BYTES`] of its output are kept.
//! - A run that may have started before a crash (`retry`) is never started
//!   again unless the action is `idempotent`: it is reported `uncertain`.
//! - One run per action at a time: the outbox never overlaps two deliveries to
//!   one destination of a sender that splits, and the destination is the action.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use broker::bridge::{Outgoing, Report, SendError, Sender, Sent};
use broker::entry::NoticeStatus;
use tokio::io::AsyncReadExt;

use crate::config::{Action, EffectsSettings};
use crate::request::{self, Bound};

/// Output kept from a run (stdout and stderr as they came).
pub const TAIL_BYTES: usize = 4096;

/// Runs declared actions.
pub struct Runner {
    pub settings: EffectsSettings,
}

impl Sender for Runner {
    /// Running twice is not harmless: a run that may have started is marked,
    /// and a retry after a crash is known as such.
    const DEDUPLICATES: bool = false;

    async fn request(
        &self,
        entry: &broker::store::Entry,
        _bridge: &broker::config::BridgeConfig,
    ) -> Result<broker::entry::Message, String> {
        request::parse(&self.settings, entry).await
    }

    async fn send(&self, out: Outgoing<'_>) -> Result<Sent, SendError> {
        let bound = Bound::parse(&out.message.content).map_err(SendError::Permanent)?;
        let action = self.settings.actions.get(&bound.action).ok_or_else(|| {
            SendError::Permanent(format!("action `{}` is no longer declared", bound.action))
        })?;
        verify(&bound, action, out.retry && !action.idempotent).await?;
        let argv = &bound.argv;
        tracing::info!(action = %bound.action, commit = %bound.commit, ?argv, "running an approved action");
        let report = run(
            argv,
            &action.repo,
            &action.env,
            Duration::from_secs(action.timeout),
        )
        .await
        .map_err(SendError::Permanent)?;
        tracing::info!(action = %bound.action, status = %report.status, exit_code = ?report.exit_code, "action finished");
        match report.status {
            NoticeStatus::Done => Ok(Sent {
                external_id: format!("run:{}", out.delivery_key),
                report: Some(report),
            }),
            _ => Err(SendError::Ran(report)),
        }
    }
}

/// What was approved is what runs: refuses a run that may have happened
/// already (`retried`, first, whatever else changed since), then one whose argv
/// today's config no longer derives or whose repository changed, one in a
/// repository the guard refuses, and one whose commit is gone.
pub(crate) async fn verify(bound: &Bound, action: &Action, retried: bool) -> Result<(), SendError> {
    if retried {
        return Err(SendError::Uncertain(format!(
            "`{}` may have run before the service stopped; it is not run again",
            bound.action
        )));
    }
    if action.argv(&bound.commit, &bound.params) != bound.argv
        || action.repo.display().to_string() != bound.repository
    {
        return Err(SendError::Permanent(format!(
            "the command or repository of `{}` changed since it was approved; not run",
            bound.action
        )));
    }
    crate::guard::check(&action.repo).map_err(SendError::Permanent)?;
    request::commit_exists(&action.repo, &bound.commit)
        .await
        .map_err(SendError::Permanent)
}

/// Runs `argv` and reports how it went. `Err` only when it could not start.
pub async fn run(
    argv: &[String],
    dir: &std::path::Path,
    env: &std::collections::BTreeMap<String, String>,
    timeout: Duration,
) -> Result<Report, String> {
    let (program, args) = argv.split_first().ok_or("empty command")?;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .current_dir(dir)
        .env_clear()
        .envs(env)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start `{program}`: {e}"))?;
    let tail = Arc::new(Mutex::new(Vec::new()));
    let readers: Vec<_> = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
    ]
    .into_iter()
    .flatten()
    .map(|mut pipe| {
        let tail = tail.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                // A reader that panicked holding the lock left bytes worth keeping.
                let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
                t.extend_from_slice(&buf[..n]);
                let over = t.len().saturating_sub(TAIL_BYTES);
                t.drain(..over);
            }
        })
    })
    .collect();
    let group = child.id();
    let deadline = tokio::time::Instant::now() + timeout;
    let waited = tokio::time::timeout_at(deadline, child.wait()).await;
    // The whole group, after every run: what the command left behind in it
    // (its own children) goes with it, timed out or not.
    let kill_group = || {
        if let Some(pid) = group {
            // SAFETY: kill(2) with a negative pid signals that process group
            // only; a group already gone answers ESRCH, which is ignored.
            unsafe {
                libc::kill(-(pid as i32), libc::SIGKILL);
            }
        }
    };
    let status = match waited {
        Ok(status) => {
            kill_group();
            Some(status.map_err(|e| format!("waiting for `{program}`: {e}"))?)
        }
        Err(_) => {
            kill_group();
            let _ = child.wait().await;
            None
        }
    };
    // The output read so far, waiting briefly for what is still in the pipes;
    // a pipe held open by a process that left the group is not waited for.
    let drained = tokio::time::Instant::now() + Duration::from_secs(2);
    for r in readers {
        let abort = r.abort_handle();
        if tokio::time::timeout_at(drained, r).await.is_err() {
            abort.abort();
        }
    }
    let output =
        String::from_utf8_lossy(&tail.lock().unwrap_or_else(|p| p.into_inner())).into_owned();
    Ok(match status {
        Some(s) if s.success() => Report {
            status: NoticeStatus::Done,
            exit_code: Some(0),
            output,
            reason: "exited 0".into(),
        },
        Some(s) => Report {
            status: NoticeStatus::Failed,
            exit_code: s.code(),
            reason: match s.code() {
                Some(c) => format!("exited with {c}"),
                None => "killed by a signal".into(),
            },
            output,
        },
        None => Report {
            status: NoticeStatus::TimedOut,
            exit_code: None,
            reason: format!("still running after {} s: killed", timeout.as_secs()),
            output,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn sh(script: &str) -> Vec<String> {
        vec!["/bin/sh".into(), "-c".into(), script.into()]
    }

    #[tokio::test]
    async fn a_run_reports_its_exit_and_output_tail() {
        let dir = std::env::temp_dir();
        let env = BTreeMap::new();
        let done = run(&sh("echo hello"), &dir, &env, Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!((done.status, done.exit_code), (NoticeStatus::Done, Some(0)));
        assert_eq!(done.output, "hello\n");
        let failed = run(
            &sh("echo oops >&2; exit 3"),
            &dir,
            &env,
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        assert_eq!(
            (failed.status, failed.exit_code),
            (NoticeStatus::Failed, Some(3))
        );
        assert_eq!(failed.output, "oops\n");
        let long = run(
            &sh("head -c 10000 /dev/zero | tr '\\0' x"),
            &dir,
            &env,
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        assert_eq!(long.output.len(), TAIL_BYTES);
    }

    #[tokio::test]
    async fn a_hanging_run_is_killed_with_its_children() {
        let env = BTreeMap::new();
        let started = std::time::Instant::now();
        let r = run(
            &sh("sleep 30 & sleep 30; echo never"),
            &std::env::temp_dir(),
            &env,
            Duration::from_millis(300),
        )
        .await
        .unwrap();
        assert_eq!(r.status, NoticeStatus::TimedOut);
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the background child did not hold the pipes open"
        );
    }

    /// A command that leaves a child behind in its group ends when it exits:
    /// the child is killed and its open pipe does not hold the report up.
    #[tokio::test]
    async fn what_a_run_leaves_behind_goes_with_it() {
        let started = std::time::Instant::now();
        let r = run(
            &sh("sleep 30 & echo started"),
            &std::env::temp_dir(),
            &BTreeMap::new(),
            Duration::from_secs(20),
        )
        .await
        .unwrap();
        assert_eq!(
            (r.status, r.output.as_str()),
            (NoticeStatus::Done, "started\n")
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "waited for the child: {:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn the_environment_is_only_what_is_declared() {
        let env = BTreeMap::from([("ONLY".to_string(), "this".to_string())]);
        let r = run(
            &["/usr/bin/env".to_string()],
            &std::env::temp_dir(),
            &env,
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        assert_eq!(r.output, "ONLY=this\n");
    }
}
