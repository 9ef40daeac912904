//! One integration-test binary (fewer links, shared harness). Every test starts
//! its own private redis-server, so they run in parallel and never share state.

mod acl;
mod approval;
mod binaries;
mod consent;
mod deploy;
mod discord;
mod effects;
mod email;
mod email_corpus;
mod invalid;
mod ledger;
mod ping;
mod retention;
mod servers;
mod supervisor;
mod web;
mod workers;

use std::time::Duration;

/// Bounded wait for things that happen within a few hundred milliseconds.
pub const SOON: Duration = Duration::from_secs(10);

/// A requesting bridge `mail` (approval required, notify through `desk`), the
/// approval surface `desk`, and one agent `ann`. `{timeout}` is the approval timeout.
pub fn approval_config(timeout: u64) -> String {
    format!(
        r#"
[agents.ann]

[bridges.mail]
type = "console"
output = "{{dir}}/mail.out"
input = "{{dir}}/mail.in"
destinations = ["*"]
approval = {{ required = true, notify = "desk", notify_channel = "ops", timeout = {timeout}, approvers = ["console:boss", "cli:op"] }}

[bridges.desk]
type = "console"
output = "{{dir}}/desk.out"
input = "{{dir}}/desk.in"
destinations = ["ops"]
"#
    )
}
