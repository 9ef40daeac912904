//! `cowboy mcp --agent NAME`: the gate as an MCP server, for agents that reach
//! the world through MCP tools rather than Redis streams.
//!
//! One process serves one agent over stdio. It connects to Redis as that
//! agent's own ACL user, so it can do exactly what the agent could do with
//! `XADD` and its inbox, nothing more: the approval gate stays in the outbox
//! services, which this server never touches. See `docs/mcp.md`.
//!
//! Modules: [`gate`] (what each tool does in Redis), [`status`] (a request's
//! state from its notices), [`server`] (the tools as MCP sees them).
//!
//! Invariants:
//! - Nothing reaches a platform from here: a `send` is an outbox entry, parked
//!   or delivered by the bridge exactly as one written by the agent itself.
//! - The client is never asked anything (no elicitation): approvals come from
//!   the people on the approval surfaces, never from the agent's client.
//! - A client that does not initialize within the start-up bound, or that
//!   closes its pipe, ends the process with a message on standard error;
//!   each tool call writes at most one entry, whole or not at all.

pub mod gate;
pub mod server;
pub mod status;

use std::time::Duration;

use rmcp::ServiceExt;

/// Serves `agent` over stdin/stdout until the client goes away. `init` bounds
/// how long a client may take to initialize the session.
pub async fn serve_stdio(
    config: broker::Config,
    agent: &str,
    init: Duration,
) -> Result<(), broker::Error> {
    let gate = gate::Gate::connect(config, agent).await?;
    let ended = |why: String| broker::Error::platform(false, why);
    let server = server::Server::new(gate);
    let running = tokio::time::timeout(init, server.serve(rmcp::transport::stdio()))
        .await
        .map_err(|_| {
            ended(format!(
                "no MCP client initialized a session within {} s",
                init.as_secs()
            ))
        })?
        .map_err(|e| ended(format!("the MCP session did not start: {e}")))?;
    running
        .waiting()
        .await
        .map_err(|e| ended(format!("the MCP session ended with an error: {e}")))?;
    Ok(())
}
