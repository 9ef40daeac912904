//! The MCP face of [`Gate`]: five tools, their JSON schemas, and how their
//! results and refusals reach the client.
//!
//! Invariants:
//! - Every tool answers with one JSON text (also as structured content); a
//!   refusal is a tool error (`isError: true`) whose text says why and, for
//!   `send`, that nothing was written. Arguments that do not fit a tool's
//!   schema (a missing or mistyped field, an unknown one) are refused the
//!   same way by the SDK before the tool runs; a number past a bound the
//!   schema states is refused (`wait`) or brought within it (`inbox`'s `max`).
//! - The server asks the client nothing (no elicitation, no sampling): a
//!   client that cannot answer questions loses nothing.

use std::sync::Arc;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{tool, tool_handler, tool_router, ErrorData, ServerHandler};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use crate::gate::{self, Gate, Refused, Request};

/// `send`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SendArgs {
    /// The bridge to send through (see the `destinations` tool).
    pub bridge: String,
    /// Where to: a destination on that bridge's allow-list (an email address, a channel id, ...).
    pub destination: String,
    /// The message, sent verbatim.
    pub content: String,
    /// Subject line, for bridges that have one (email).
    #[serde(default)]
    pub subject: Option<String>,
    /// The platform id of the message this one answers (threads, email In-Reply-To).
    #[serde(default)]
    pub reply_to: Option<String>,
    /// Your id for this request, to ask its status by; one is made when absent.
    #[serde(default)]
    pub request_id: Option<String>,
}

/// `status`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StatusArgs {
    /// The request id `send` returned.
    pub request_id: String,
}

/// `wait`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitArgs {
    /// The request id `send` returned.
    pub request_id: String,
    /// How long to wait for a change, in seconds (default 30, at most 50).
    #[serde(default)]
    #[schemars(range(min = 0, max = 50))]
    pub timeout_seconds: Option<u64>,
}

/// `inbox`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InboxArgs {
    /// Most entries to return (default 20, at most 100).
    #[serde(default)]
    #[schemars(range(min = 1, max = 100))]
    pub max: Option<usize>,
}

/// `destinations` takes nothing.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

/// The MCP server of one agent.
#[derive(Clone)]
pub struct Server {
    gate: Arc<Gate>,
}

impl Server {
    pub fn new(gate: Gate) -> Server {
        Server {
            gate: Arc::new(gate),
        }
    }
}

fn answer(result: Result<Value, Refused>) -> Result<CallToolResult, ErrorData> {
    Ok(match result {
        Ok(v) => {
            let text = serde_json::to_string_pretty(&v).unwrap_or_else(|_| v.to_string());
            let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
            r.structured_content = Some(v);
            r
        }
        Err(Refused(why)) => CallToolResult::error(vec![ContentBlock::text(why)]),
    })
}

#[tool_router]
impl Server {
    /// Send a message through a bridge. It is delivered, or first parked until a human
    /// approves it (see `destinations`); nothing is delivered that the gate does not allow.
    /// Returns the request id to follow it with `status` and `wait`.
    #[tool(name = "send")]
    async fn send(&self, Parameters(a): Parameters<SendArgs>) -> Result<CallToolResult, ErrorData> {
        answer(
            self.gate
                .send(Request {
                    bridge: a.bridge,
                    destination: a.destination,
                    content: a.content,
                    subject: a.subject,
                    reply_to: a.reply_to,
                    request_id: a.request_id,
                })
                .await,
        )
    }

    /// What became of a request: queued, awaiting_approval (since, deadline, approvals
    /// needed), delivered (external id), rejected (reason), expired, failed, uncertain,
    /// invalid or limit_reached.
    #[tool(name = "status")]
    async fn status(
        &self,
        Parameters(a): Parameters<StatusArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(self.gate.status(&a.request_id).await)
    }

    /// Wait until a request's status changes (a human decides, it is delivered) or the
    /// timeout passes; returns the status with `changed`.
    #[tool(name = "wait")]
    async fn wait(&self, Parameters(a): Parameters<WaitArgs>) -> Result<CallToolResult, ErrorData> {
        let seconds = a.timeout_seconds.unwrap_or(30);
        if seconds > gate::MAX_WAIT_SECONDS {
            return answer(Err(Refused(format!(
                "timeout_seconds is {seconds}; at most {} (call wait again to wait longer)",
                gate::MAX_WAIT_SECONDS
            ))));
        }
        answer(self.gate.wait(&a.request_id, seconds).await)
    }

    /// New messages people sent to this agent, and notices about its requests, each
    /// returned once (acknowledged as read).
    #[tool(name = "inbox")]
    async fn inbox(
        &self,
        Parameters(a): Parameters<InboxArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(self.gate.inbox(a.max.unwrap_or(20)).await)
    }

    /// The bridges this agent may send through, their allowed destinations, and which
    /// need a human's approval.
    #[tool(name = "destinations")]
    async fn destinations(
        &self,
        Parameters(_): Parameters<NoArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(Ok(self.gate.destinations()))
    }
}

#[tool_handler]
impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("cowboy", env!("CARGO_PKG_VERSION")))
            .with_instructions(format!(
                "You are agent `{}`. Messages you `send` go out only as the gate allows: some \
                 wait for a human's approval, which you follow with `status` or `wait`. \
                 `destinations` lists where you may send.",
                self.gate.agent()
            ))
    }
}
