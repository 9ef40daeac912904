//! `cowboy`: the operator CLI. Parses arguments and calls `broker::cli`.

use std::path::PathBuf;
use std::process::ExitCode;

use broker::approval::Verdict;
use broker::cli::{self, SendArgs};
use broker::{Config, Store};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cowboy",
    about = "Operate the cowboy bridges: approvals, sending, status"
)]
struct Args {
    /// The deployment config file.
    #[arg(
        long,
        env = "COWBOY_CONFIG",
        global = true,
        default_value = "/etc/cowboy/cowboy.toml"
    )]
    config: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Inspect and decide approvals.
    Approvals {
        #[command(subcommand)]
        command: Approvals,
    },
    /// Write an outbox entry as an agent would.
    Send {
        #[arg(long)]
        bridge: String,
        /// Write to the agent's own stream `{agent}:{bridge}:outbox`.
        #[arg(long)]
        agent: Option<String>,
        #[arg(long)]
        channel: String,
        #[arg(long)]
        content: String,
        #[arg(long)]
        subject: Option<String>,
        #[arg(long)]
        reply_to: Option<String>,
        #[arg(long)]
        request_id: Option<String>,
    },
    /// Streams, pending and parked counts, dead letters and liveness per bridge.
    Status,
    /// The audit trail: every step of every approval, kept after the records.
    Audit {
        /// One approval's history (an id, or the start of one).
        #[arg(long)]
        approval: Option<String>,
        /// Every approval this agent asked for.
        #[arg(long)]
        agent: Option<String>,
        /// One requesting bridge's trail.
        #[arg(long)]
        bridge: Option<String>,
        /// Unix seconds, or an age such as 2h or 7d.
        #[arg(long)]
        since: Option<String>,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Deliveries whose outcome is unknown, until an operator settles them.
    Deliveries {
        #[command(subcommand)]
        command: Deliveries,
    },
    /// The approval page (`cowboy web`, `cowboy web hash-password`); runs `cowboy-web`.
    Web {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Serve `/metrics` alone, for hosts without the page; runs `cowboy-web exporter`.
    Exporter,
    /// Run one service of a bridge (exec's `cowboy-{type}-{service}`), for unit templates.
    Service {
        /// ingest, outbox or ping.
        service: String,
        #[arg(long)]
        bridge: String,
        /// Outbox only: the worker name (see the outbox binaries' `--worker`).
        #[arg(long)]
        worker: Option<String>,
    },
    /// Render the Redis ACL users of the deployment, or check them on a live server.
    Acl {
        /// `aclfile` (a users file) or `commands` (ACL SETUSER lines for redis-cli).
        #[arg(long, default_value = "aclfile")]
        format: String,
        #[command(subcommand)]
        command: Option<AclCommand>,
    },
}

#[derive(Subcommand)]
enum AclCommand {
    /// Connect as every configured user and verify what it can and cannot do.
    Check {
        /// Run destructive forbidden commands for real instead of `ACL DRYRUN`
        /// (only on a throwaway server: a broken ACL would let them through).
        #[arg(long)]
        real: bool,
    },
}

#[derive(Subcommand)]
enum Deliveries {
    /// Every uncertain delivery, oldest first.
    List,
    /// Settle an uncertain delivery: `delivered` closes it and sends nothing;
    /// `not-delivered` puts the agent's entry back on its stream, to be
    /// approved (or delivered, without approval) afresh.
    Reconcile {
        id: String,
        /// delivered or not-delivered.
        #[arg(long)]
        outcome: String,
        /// How you know (kept in the audit trail).
        #[arg(long)]
        evidence: String,
        #[arg(long = "as", env = "COWBOY_OPERATOR")]
        operator: Option<String>,
    },
}

#[derive(Subcommand)]
enum Approvals {
    /// One line per pending approval, id first.
    List {
        /// Also show decided and expired approvals not yet settled.
        #[arg(long)]
        all: bool,
    },
    /// Everything in the record, and the full content.
    Show { id: String },
    /// Approve (any unambiguous id prefix).
    Approve {
        id: String,
        /// Decide only if the message still has this digest (the one shown),
        /// so an edit in between makes this decide nothing.
        #[arg(long)]
        digest: Option<String>,
        /// Who decides; must be on the approvers list as `cli:NAME`. With
        /// `[operators]` declared, NAME is proven by connecting as that Redis user.
        #[arg(long = "as", env = "COWBOY_OPERATOR")]
        operator: Option<String>,
    },
    /// Change the message before it is sent (approvers only): any decision is
    /// revoked and approvers are asked about the edited version. Without
    /// --content, --content-file, --subject or --channel, opens $EDITOR.
    Edit {
        id: String,
        #[arg(long, conflicts_with = "content_file")]
        content: Option<String>,
        #[arg(long)]
        content_file: Option<PathBuf>,
        #[arg(long)]
        subject: Option<String>,
        #[arg(long)]
        channel: Option<String>,
        #[arg(long = "as", env = "COWBOY_OPERATOR")]
        operator: Option<String>,
    },
    /// Walk the pending approvals one at a time, oldest first: approve,
    /// reject with a reason, skip or quit. End of input decides nothing.
    Review {
        #[arg(long)]
        bridge: Option<String>,
        #[arg(long)]
        agent: Option<String>,
        #[arg(long = "as", env = "COWBOY_OPERATOR")]
        operator: Option<String>,
    },
    /// Reject with a reason the agent will see.
    Reject {
        id: String,
        #[arg(long, default_value = "")]
        reason: String,
        #[arg(long)]
        digest: Option<String>,
        #[arg(long = "as", env = "COWBOY_OPERATOR")]
        operator: Option<String>,
    },
}

/// Opens `$VISUAL`/`$EDITOR` (default `vi`) on `text`, on a terminal only, and
/// returns what was saved.
fn in_editor(text: &str) -> broker::Result<String> {
    use std::io::IsTerminal;
    let fail = |why: String| broker::Error::platform(false, why);
    if !std::io::stdin().is_terminal() {
        return Err(broker::Error::usage(
            "no --content, --content-file, --subject or --channel, and no terminal for $EDITOR",
        ));
    }
    let editor = std::env::var("VISUAL")
        .or_else(|_| std::env::var("EDITOR"))
        .unwrap_or_else(|_| "vi".into());
    let dir = std::env::temp_dir().join(format!("cowboy-edit-{}", std::process::id()));
    std::fs::create_dir(&dir).map_err(|e| fail(format!("{}: {e}", dir.display())))?;
    let path = dir.join("message.txt");
    let result = (|| {
        std::fs::write(&path, text).map_err(|e| fail(format!("{}: {e}", path.display())))?;
        // The editor may carry arguments (`code --wait`); no shell is involved.
        let mut argv = editor.split_whitespace();
        let program = argv.next().unwrap_or("vi");
        let status = std::process::Command::new(program)
            .args(argv)
            .arg(&path)
            .status()
            .map_err(|e| fail(format!("{editor}: {e}")))?;
        if !status.success() {
            return Err(broker::Error::refused(format!(
                "{editor} exited with {status}: nothing edited"
            )));
        }
        std::fs::read_to_string(&path).map_err(|e| fail(format!("{}: {e}", path.display())))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Runs `cowboy-web` (beside this binary, else on `PATH`) with `args`.
fn exec_web(config: &std::path::Path, args: &[String]) -> ExitCode {
    use std::os::unix::process::CommandExt;
    let beside = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("cowboy-web")))
        .filter(|p| p.exists());
    let program = beside.unwrap_or_else(|| "cowboy-web".into());
    let err = std::process::Command::new(&program)
        .arg("--config")
        .arg(config)
        .args(args)
        .exec();
    eprintln!("error: cannot run {}: {err}", program.display());
    ExitCode::FAILURE
}

fn operator(given: Option<String>) -> String {
    given
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "operator".to_string())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    match &args.command {
        Command::Web { args: rest } => return exec_web(&args.config, rest),
        Command::Exporter => return exec_web(&args.config, &["exporter".to_string()]),
        _ => {}
    }
    let config = match Config::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(broker::service::EXIT_CONFIG as u8);
        }
    };
    if let Command::Service {
        service,
        bridge,
        worker,
    } = &args.command
    {
        let err = broker::service::exec_service(
            &args.config,
            &config,
            service,
            bridge,
            worker.as_deref(),
        );
        eprintln!("error: {err}");
        return ExitCode::from(broker::service::EXIT_CONFIG as u8);
    }
    if let Command::Acl {
        format,
        command: None,
    } = &args.command
    {
        let format = match format.as_str() {
            "aclfile" => broker::acl::Format::Aclfile,
            "commands" => broker::acl::Format::Commands,
            other => {
                eprintln!("error: unknown format `{other}` (aclfile, commands)");
                return ExitCode::from(broker::error::EXIT_USAGE);
            }
        };
        return match broker::acl::render(&config, format) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(broker::service::EXIT_CONFIG as u8)
            }
        };
    }
    let result = async {
        // `cowboy approvals` connects as the operator alone (with [operators]),
        // never reading the administrator's password; everything else as [redis].
        let command = match args.command {
            Command::Approvals { command } => {
                return match command {
                    Approvals::List { all } => {
                        let mut store = cli::reading_store(&config, &operator(None)).await?;
                        cli::approvals_list(&mut store, &config, all).await
                    }
                    Approvals::Show { id } => {
                        let mut store = cli::reading_store(&config, &operator(None)).await?;
                        cli::approvals_show(&mut store, &config, &id).await
                    }
                    Approvals::Review {
                        bridge,
                        agent,
                        operator: who,
                    } => {
                        let who = operator(who);
                        let mut store = cli::decision_store(&config, &who).await?;
                        let filter = cli::ReviewFilter { bridge, agent };
                        let stdin = std::io::stdin();
                        let mut input = stdin.lock();
                        let mut output = std::io::stdout();
                        cli::approvals_review(
                            &mut store,
                            &config,
                            &filter,
                            &who,
                            &mut input,
                            &mut output,
                        )
                        .await
                    }
                    Approvals::Approve {
                        id,
                        digest,
                        operator: who,
                    } => {
                        let who = operator(who);
                        let mut store = cli::decision_store(&config, &who).await?;
                        cli::approvals_decide(
                            &mut store,
                            &config,
                            &id,
                            Verdict::Approved,
                            &who,
                            "",
                            digest.as_deref(),
                        )
                        .await
                    }
                    Approvals::Edit {
                        id,
                        content,
                        content_file,
                        subject,
                        channel,
                        operator: who,
                    } => {
                        let who = operator(who);
                        let mut store = cli::decision_store(&config, &who).await?;
                        let mut seen = None;
                        let content = match (content, content_file) {
                            (Some(c), _) => Some(c),
                            (None, Some(path)) => {
                                Some(std::fs::read_to_string(&path).map_err(|e| {
                                    broker::Error::usage(format!("{}: {e}", path.display()))
                                })?)
                            }
                            (None, None) if subject.is_none() && channel.is_none() => {
                                let (now, digest) =
                                    cli::approval_content(&mut store, &config, &id).await?;
                                // Another edit while the editor was open: refused, not lost.
                                seen = Some(digest);
                                Some(in_editor(&now)?)
                            }
                            (None, None) => None,
                        };
                        let change = broker::approval::edit::Change {
                            content,
                            subject,
                            channel_id: channel,
                            seen,
                        };
                        cli::approvals_edit(&mut store, &config, &id, &change, &who).await
                    }
                    Approvals::Reject {
                        id,
                        reason,
                        digest,
                        operator: who,
                    } => {
                        let who = operator(who);
                        let mut store = cli::decision_store(&config, &who).await?;
                        cli::approvals_decide(
                            &mut store,
                            &config,
                            &id,
                            Verdict::Rejected,
                            &who,
                            &reason,
                            digest.as_deref(),
                        )
                        .await
                    }
                };
            }
            other => other,
        };
        let mut store = Store::connect(&config.redis).await?;
        match command {
            Command::Send {
                bridge,
                agent,
                channel,
                content,
                subject,
                reply_to,
                request_id,
            } => {
                let a = SendArgs {
                    bridge,
                    agent,
                    channel,
                    content,
                    subject,
                    reply_to,
                    request_id,
                };
                cli::send(&mut store, &config, &a).await
            }
            Command::Status => cli::status(&mut store, &config).await,
            Command::Audit {
                approval,
                agent,
                bridge,
                since,
                json,
            } => {
                let since = since
                    .map(|s| cli::parse_since(&s, broker::now_secs_f64()))
                    .transpose()?;
                let filter = broker::audit::Filter {
                    approval,
                    agent,
                    bridge,
                    since,
                };
                cli::audit(&mut store, &config, &filter, json).await
            }
            Command::Deliveries { command } => match command {
                Deliveries::List => cli::deliveries_list(&mut store, &config).await,
                Deliveries::Reconcile {
                    id,
                    outcome,
                    evidence,
                    operator: who,
                } => {
                    // Writes the entry back and the uncertain list: the administrator's
                    // job (an operator's Redis user writes nothing).
                    let who = operator(who);
                    cli::deliveries_reconcile(&mut store, &config, &id, &outcome, &evidence, &who)
                        .await
                }
            },
            Command::Approvals { .. }
            | Command::Acl { command: None, .. }
            | Command::Service { .. }
            | Command::Web { .. }
            | Command::Exporter => {
                unreachable!("handled above")
            }
            Command::Acl {
                command: Some(AclCommand::Check { real }),
                ..
            } => {
                let (table, ok) = broker::acl::check(&config, &mut store, real).await?;
                if ok {
                    Ok(table)
                } else {
                    print!("{table}");
                    Err(broker::Error::refused(
                        "some permissions are not as expected (SURPRISE rows)",
                    ))
                }
            }
        }
    }
    .await;
    match result {
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
