//! The `cowboy` command line, typed: what the binary parses and
//! [`super::run`] carries out.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::acl::Format;
use crate::config::Service;

#[derive(Parser)]
#[command(
    name = "cowboy",
    about = "Operate the cowboy bridges: approvals, sending, status"
)]
pub struct Args {
    /// The deployment config file.
    #[arg(
        long,
        env = "COWBOY_CONFIG",
        global = true,
        default_value = "/etc/cowboy/cowboy.toml"
    )]
    pub config: PathBuf,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Inspect and decide approvals.
    Approvals {
        #[command(subcommand)]
        command: Approvals,
    },
    /// Write an outbox entry as an agent would.
    Send(super::SendArgs),
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
    /// An MCP server over stdio for one agent (`cowboy mcp --agent NAME`),
    /// connected as that agent's Redis user; runs `cowboy-mcp`.
    Mcp {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run one service of a bridge (exec's `cowboy-{type}-{service}`), for unit templates.
    Service {
        service: Service,
        #[arg(long)]
        bridge: String,
        /// Outbox only: the worker name (see the outbox binaries' `--worker`).
        #[arg(long)]
        worker: Option<String>,
    },
    /// Render the Redis ACL users of the deployment, or check them on a live server.
    Acl {
        /// What to print: a users file, or `ACL SETUSER` lines for redis-cli.
        #[arg(long, value_enum, default_value_t = Format::Aclfile)]
        format: Format,
        #[command(subcommand)]
        command: Option<AclCommand>,
    },
}

#[derive(Subcommand)]
pub enum AclCommand {
    /// Connect as every configured user and verify what it can and cannot do.
    Check {
        /// Run destructive forbidden commands for real instead of `ACL DRYRUN`
        /// (only on a throwaway server: a broken ACL would let them through).
        #[arg(long)]
        real: bool,
    },
}

#[derive(Subcommand)]
pub enum Deliveries {
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
pub enum Approvals {
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
    /// Hand your answers to another person while you are away: until then
    /// theirs count for you (under a quorum, the two of you count once).
    /// Made by each requesting bridge you approve on (or --bridge).
    Delegate {
        /// Yourself (checked: nobody delegates another's approvals).
        #[arg(long)]
        from: Option<String>,
        /// The person (of [people]) who answers for you.
        #[arg(long, required_unless_present = "end")]
        to: Option<String>,
        /// Unix seconds, or a time from now: 90m, 8h, 3d.
        #[arg(long, required_unless_present = "end")]
        until: Option<String>,
        /// Take your answers back now.
        #[arg(long, conflicts_with_all = ["to", "until"])]
        end: bool,
        #[arg(long)]
        bridge: Option<String>,
        #[arg(long = "as", env = "COWBOY_OPERATOR")]
        operator: Option<String>,
    },
    /// The delegations recorded: running ones, and ended ones not taken back.
    Delegations,
    /// Not now: move the deadline later (approvers only; never a decision),
    /// by --for or the bridge's approval.snooze, within approval.max_snooze
    /// and at most approval.max_snoozes times.
    Later {
        id: String,
        /// How much later: 90m, 2h, 1d.
        #[arg(long = "for")]
        span: Option<String>,
        /// Why (kept in the audit trail).
        #[arg(long, default_value = "")]
        reason: String,
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
