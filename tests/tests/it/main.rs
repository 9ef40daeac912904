//! One integration-test binary (fewer links, shared harness). Every test starts
//! its own private redis-server, so they run in parallel and never share state.

mod acl;
mod approval;
mod binaries;
mod cluster;
mod consent;
mod deploy;
mod discord;
mod effects;
mod email;
mod email_corpus;
mod escalation;
mod fanout;
mod inflight;
mod invalid;
mod later;
mod ledger;
mod mcp;
mod ping;
mod retention;
mod servers;
mod slack;
mod soak;
mod supervisor;
mod web;
mod workers;

use std::time::Duration;

/// Bounded wait for things that happen within a few hundred milliseconds.
pub const SOON: Duration = Duration::from_secs(10);

/// The standard approval deployment ([`harness::setup::Setup`]) with approval
/// timeout `timeout`.
pub fn approval_config(timeout: u64) -> String {
    harness::setup::Setup::approval(timeout).toml()
}
