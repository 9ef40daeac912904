//! Carrying out a parsed `cowboy` command: which connection each uses, and
//! the exit code of its outcome.

use std::path::Path;
use std::process::ExitCode;

use super::args::{AclCommand, Approvals, Args, Command, Deliveries};
use super::editor::in_editor;
use super::{self as cli};
use crate::approval::Verdict;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::store::Store;

/// Runs `cowboy-web` (beside this binary, else on `PATH`) with `args`;
/// returns only if it cannot.
pub fn exec_web(config: &Path, args: &[String]) -> Error {
    exec_companion("cowboy-web", config, args)
}

/// Runs companion binary `name` (`cowboy-web`, `cowboy-mcp`: beside this
/// binary, else on `PATH`) with `--config` and `args`; returns only if it
/// cannot. Companions are their own crates: they need what `broker` must not
/// depend on (a web server, the MCP SDK).
pub fn exec_companion(name: &str, config: &Path, args: &[String]) -> Error {
    use std::os::unix::process::CommandExt;
    let beside = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(name)))
        .filter(|p| p.exists());
    let program = beside.unwrap_or_else(|| name.into());
    let err = std::process::Command::new(&program)
        .arg("--config")
        .arg(config)
        .args(args)
        .exec();
    Error::platform(false, format!("cannot run {}: {err}", program.display()))
}

fn operator(given: Option<String>) -> String {
    given
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "operator".to_string())
}

/// Runs `args` to completion: prints what the command prints and returns the
/// exit code (the services' codes where the cause is the same, see
/// [`crate::error`]).
pub async fn run(args: Args) -> ExitCode {
    match execute(&args.config, args.command).await {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

async fn execute(path: &Path, command: Command) -> Result<String> {
    let command = match command {
        // The page and the exporter load the config themselves.
        Command::Web { args } => return Err(exec_web(path, &args)),
        Command::Exporter => return Err(exec_web(path, &["exporter".to_string()])),
        Command::Mcp { args } => return Err(exec_companion("cowboy-mcp", path, &args)),
        other => other,
    };
    let config = Config::load(path)?;
    match command {
        // Replaces this process; returns only if it cannot.
        Command::Service {
            service,
            bridge,
            worker,
        } => Err(crate::service::exec_service(
            path,
            &config,
            service,
            &bridge,
            worker.as_deref(),
        )),
        Command::Acl {
            format,
            command: None,
        } => Ok(crate::acl::render(&config, format)?),
        // `cowboy approvals` connects as the operator alone (with [operators]),
        // never reading the administrator's password; everything else as [redis].
        Command::Approvals { command } => approvals(&config, command).await,
        command => connected(&config, command).await,
    }
}

/// `cowboy approvals ...`, over the operator's own connection.
async fn approvals(config: &Config, command: Approvals) -> Result<String> {
    match command {
        Approvals::List { all } => {
            let mut store = cli::reading_store(config, &operator(None)).await?;
            cli::approvals_list(&mut store, config, all).await
        }
        Approvals::Show { id } => {
            let mut store = cli::reading_store(config, &operator(None)).await?;
            cli::approvals_show(&mut store, config, &id).await
        }
        Approvals::Review {
            bridge,
            agent,
            operator: who,
        } => {
            let who = operator(who);
            let mut store = cli::decision_store(config, &who).await?;
            let filter = cli::ReviewFilter { bridge, agent };
            let stdin = std::io::stdin();
            let mut input = stdin.lock();
            let mut output = std::io::stdout();
            cli::approvals_review(&mut store, config, &filter, &who, &mut input, &mut output).await
        }
        Approvals::Approve {
            id,
            digest,
            operator: who,
        } => decide(config, &id, Verdict::Approved, who, "", digest).await,
        Approvals::Edit {
            id,
            content,
            content_file,
            subject,
            channel,
            operator: who,
        } => {
            let who = operator(who);
            let mut store = cli::decision_store(config, &who).await?;
            let mut seen = None;
            let content = match (content, content_file) {
                (Some(c), _) => Some(c),
                (None, Some(path)) => Some(
                    std::fs::read_to_string(&path)
                        .map_err(|e| crate::Error::usage(format!("{}: {e}", path.display())))?,
                ),
                (None, None) if subject.is_none() && channel.is_none() => {
                    let (now, digest) = cli::approval_content(&mut store, config, &id).await?;
                    // Another edit while the editor was open: refused, not lost.
                    seen = Some(digest);
                    Some(in_editor(&now)?)
                }
                (None, None) => None,
            };
            let change = crate::approval::edit::Change {
                content,
                subject,
                channel_id: channel,
                seen,
            };
            cli::approvals_edit(&mut store, config, &id, &change, &who).await
        }
        Approvals::Reject {
            id,
            reason,
            digest,
            operator: who,
        } => decide(config, &id, Verdict::Rejected, who, &reason, digest).await,
        Approvals::Delegate {
            from,
            to,
            until,
            end,
            bridge,
            operator: who,
        } => {
            let who = operator(who);
            let mut store = cli::decision_store(config, &who).await?;
            let args = cli::DelegateArgs {
                from,
                to,
                until,
                end,
                bridge,
            };
            cli::delegate(&mut store, config, &who, &args, crate::now_secs()).await
        }
        Approvals::Delegations => {
            let mut store = cli::reading_store(config, &operator(None)).await?;
            cli::delegations(&mut store, config, crate::now_secs()).await
        }
        Approvals::Later {
            id,
            span,
            reason,
            operator: who,
        } => {
            let seconds = span
                .map(|s| {
                    crate::text::duration_secs(&s).ok_or_else(|| {
                        crate::Error::usage(format!(
                            "--for `{s}`: give a time such as 90m, 2h or 1d"
                        ))
                    })
                })
                .transpose()?;
            let who = operator(who);
            let mut store = cli::decision_store(config, &who).await?;
            cli::approvals_later(&mut store, config, &id, &who, seconds, &reason).await
        }
    }
}

/// `cowboy approvals approve|reject`, as operator `who`.
async fn decide(
    config: &Config,
    id: &str,
    verdict: Verdict,
    who: Option<String>,
    reason: &str,
    digest: Option<String>,
) -> Result<String> {
    let who = operator(who);
    let mut store = cli::decision_store(config, &who).await?;
    cli::approvals_decide(
        &mut store,
        config,
        id,
        verdict,
        &who,
        reason,
        digest.as_deref(),
    )
    .await
}

/// The commands run over the `[redis]` connection.
async fn connected(config: &Config, command: Command) -> Result<String> {
    let mut store = Store::connect(&config.redis).await?;
    match command {
        Command::Send(a) => cli::send(&mut store, config, &a).await,
        Command::Status => cli::status(&mut store, config).await,
        Command::Audit {
            approval,
            agent,
            bridge,
            since,
            json,
        } => {
            let since = since
                .map(|s| cli::parse_since(&s, crate::now_secs_f64()))
                .transpose()?;
            let filter = crate::audit::Filter {
                approval,
                agent,
                bridge,
                since,
            };
            cli::audit(&mut store, config, &filter, json).await
        }
        Command::Deliveries { command } => match command {
            Deliveries::List => cli::deliveries_list(&mut store, config).await,
            Deliveries::Reconcile {
                id,
                outcome,
                evidence,
                operator: who,
            } => {
                // Writes the entry back and the uncertain list: the administrator's
                // job (an operator's Redis user writes nothing).
                let who = operator(who);
                cli::deliveries_reconcile(&mut store, config, &id, &outcome, &evidence, &who).await
            }
        },
        Command::Acl {
            command: Some(AclCommand::Check { real }),
            ..
        } => {
            let (table, ok) = crate::acl::check(config, &mut store, real).await?;
            if ok {
                Ok(table)
            } else {
                print!("{table}");
                Err(crate::Error::refused(
                    "some permissions are not as expected (SURPRISE rows)",
                ))
            }
        }
        Command::Approvals { .. }
        | Command::Acl { command: None, .. }
        | Command::Service { .. }
        | Command::Web { .. }
        | Command::Exporter
        | Command::Mcp { .. } => Err(Error::internal("a command reached the wrong runner")),
    }
}
