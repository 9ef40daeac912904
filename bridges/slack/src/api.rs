//! Every Web API call the bridge makes, over slack-morphism's client, paced
//! by the bridge's own buckets ([`crate::limits`]: per method, and per
//! channel for posts) and waiting out a 429's `Retry-After` on its own bucket
//! before the call is made again; and every failure classified for the retry
//! policy.
//!
//! Invariant: a failure is [`SendError::Credentials`] only when Slack refused
//! the bridge's own token, so a revoked token stops the service (exit 78)
//! instead of dead-lettering messages for the deployment's fault.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use broker::bridge::SendError;
use serde_json::Value;
use slack_morphism::errors::SlackClientError;
use slack_morphism::prelude::*;

/// The HTTP connector: https to slack.com (system roots), or `api_base`.
pub type Connector = SlackClientHyperConnector<SlackHyperHttpsConnector>;
/// The Web API client.
pub type Client = SlackClient<Connector>;

/// Retries of one call after a 429, each after Slack's `Retry-After`.
const RATE_LIMIT_RETRIES: usize = 3;
/// The longest `Retry-After` waited out inside one call; a longer one holds
/// the bucket and fails the call (the broker's back-off takes over).
const LONGEST_WAIT: Duration = Duration::from_secs(60);

use crate::limits::{self, Limits};

/// The client for `api_base` (or slack.com). slack-morphism's rate control
/// stays off: it paces every post of a workspace as one, so one busy channel
/// would hold up the others ([`crate::limits`] keeps the buckets instead).
pub fn client(api_base: Option<&str>) -> Result<Arc<Client>, String> {
    broker::topology::install_tls_provider();
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_native_roots()
        .map_err(|e| format!("the system's TLS roots: {e}"))?
        .https_or_http()
        .enable_http1()
        .build();
    let mut connector = SlackClientHyperConnector::with_connector(https);
    if let Some(base) = api_base {
        connector = connector.with_slack_api_url(base.trim_end_matches('/'));
    }
    Ok(Arc::new(SlackClient::new(connector)))
}

/// Slack's error codes that mean the token itself was refused.
const TOKEN_REFUSED: &[&str] = &[
    "not_authed",
    "invalid_auth",
    "account_inactive",
    "token_revoked",
    "token_expired",
    "no_permission",
    "missing_scope",
    "not_allowed_token_type",
];

/// Codes worth another try later.
const PASSING: &[&str] = &[
    "ratelimited",
    "internal_error",
    "fatal_error",
    "service_unavailable",
    "request_timeout",
    "team_added_to_org",
];

/// Classifies a failed call named `what`.
pub fn classify(what: &str, e: SlackClientError) -> SendError {
    match e {
        SlackClientError::ApiError(api) => {
            let message = format!("Slack {what}: {}", api.code);
            if TOKEN_REFUSED.contains(&api.code.as_str()) {
                SendError::Credentials(format!(
                    "{message}; check bot_token_file and the app's scopes"
                ))
            } else if PASSING.contains(&api.code.as_str()) {
                SendError::Transient(message)
            } else {
                SendError::Permanent(message)
            }
        }
        SlackClientError::RateLimitError(r) => SendError::Transient(format!(
            "Slack {what}: rate limited (retry after {:?})",
            r.retry_after
        )),
        SlackClientError::HttpError(h) if h.status_code.is_client_error() => {
            SendError::Permanent(format!("Slack {what}: HTTP {}", h.status_code))
        }
        other => SendError::Transient(format!("Slack {what}: {other}")),
    }
}

/// Whether a failed call may still have done its work: Slack answered with
/// a server error, a response that could not be read, or nothing at all
/// (a connection lost after the request went out). A refusal, a rate limit
/// or a client error certainly did nothing.
pub fn maybe_done(e: &SlackClientError) -> bool {
    match e {
        SlackClientError::ApiError(api) => {
            matches!(
                api.code.as_str(),
                "internal_error" | "fatal_error" | "request_timeout"
            )
        }
        SlackClientError::RateLimitError(_) => false,
        SlackClientError::HttpError(h) => h.status_code.is_server_error(),
        _ => true,
    }
}

/// The cursor of the page after this one, if Slack says there is one.
fn next_cursor(meta: Option<SlackResponseMetadata>, has_more: Option<bool>) -> Option<String> {
    meta.and_then(|m| m.next_cursor)
        .map(|c| c.0)
        .filter(|c| !c.is_empty() && has_more != Some(false))
}

/// The bot token's session on one client.
#[derive(Clone)]
pub struct Api {
    pub client: Arc<Client>,
    token: SlackApiToken,
    limits: Arc<Limits>,
}

fn blocks(value: Value) -> Result<Vec<SlackBlock>, SendError> {
    serde_json::from_value(value)
        .map_err(|e| SendError::Permanent(format!("cannot build the message's blocks: {e}")))
}

impl Api {
    pub fn new(client: Arc<Client>, token: &str) -> Api {
        Api {
            client,
            token: SlackApiToken::new(SlackApiTokenValue(token.to_string())),
            limits: Arc::new(Limits::default()),
        }
    }

    /// Makes one call of `method` (about `channel`, for posts) once its
    /// bucket allows; after a 429, holds that bucket for the `Retry-After`
    /// and calls again, [`RATE_LIMIT_RETRIES`] times at most.
    async fn call<T, F, Fut>(&self, method: &str, channel: &str, f: F) -> ClientResult<T>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = ClientResult<T>>,
    {
        let key = limits::key(method, channel);
        let rate = limits::rate(method);
        let mut attempt = 0;
        loop {
            self.limits.take(&key, rate).await;
            match f().await {
                Err(SlackClientError::RateLimitError(r)) => {
                    let wait = r.retry_after.unwrap_or(Duration::from_secs(1));
                    self.limits.hold(&key, wait);
                    attempt += 1;
                    if attempt > RATE_LIMIT_RETRIES || wait > LONGEST_WAIT {
                        return Err(SlackClientError::RateLimitError(r));
                    }
                    tracing::debug!(method, ?wait, "rate limited; waiting it out");
                }
                other => return other,
            }
        }
    }

    fn session(&self) -> SlackClientSession<'_, Connector> {
        self.client.open_session(&self.token)
    }

    /// `auth.test`: who the bot is, in which workspace.
    pub async fn whoami(&self) -> Result<SlackApiAuthTestResponse, SendError> {
        let session = &self.session();
        self.call("auth.test", "", || session.auth_test())
            .await
            .map_err(|e| classify("auth.test", e))
    }

    /// `chat.postMessage`; returns the message's `ts`, or the failure and
    /// whether Slack may have posted it anyway ([`maybe_done`]). Links are
    /// not unfurled and nothing in `fallback` is parsed (it is escaped).
    pub async fn post(
        &self,
        channel: &str,
        content: Value,
        fallback: String,
        thread_ts: Option<&str>,
        metadata: Option<Value>,
    ) -> Result<String, (SendError, bool)> {
        let definite = |e| (e, false);
        let mut content = SlackMessageContent::new()
            .with_text(fallback)
            .with_blocks(blocks(content).map_err(definite)?);
        if let Some(m) = metadata {
            let m: SlackMessageMetadata = serde_json::from_value(m)
                .map_err(|e| definite(SendError::Permanent(format!("metadata: {e}"))))?;
            content = content.with_metadata(m);
        }
        let mut req = SlackApiChatPostMessageRequest::new(SlackChannelId(channel.into()), content)
            .with_unfurl_links(false)
            .with_unfurl_media(false)
            .with_link_names(false)
            .with_parse("none".into());
        if let Some(t) = thread_ts {
            req = req.with_thread_ts(SlackTs(t.into()));
        }
        let (session, req) = (&self.session(), &req);
        let post = || session.chat_post_message(req);
        let sent = self
            .call("chat.postMessage", channel, post)
            .await
            .map_err(|e| {
                let maybe = maybe_done(&e);
                (classify("chat.postMessage", e), maybe)
            })?;
        Ok(sent.ts.0)
    }

    /// `chat.update` of the bot's message `ts`.
    pub async fn update(
        &self,
        channel: &str,
        ts: &str,
        content: Value,
        fallback: String,
    ) -> Result<(), SendError> {
        let content = SlackMessageContent::new()
            .with_text(fallback)
            .with_blocks(blocks(content)?);
        let req = SlackApiChatUpdateRequest::new(
            SlackChannelId(channel.into()),
            content,
            SlackTs(ts.into()),
        )
        .with_link_names(false)
        .with_parse("none".into());
        let (session, req) = (&self.session(), &req);
        self.call("chat.update", channel, || session.chat_update(req))
            .await
            .map(|_| ())
            .map_err(|e| classify("chat.update", e))
    }

    /// One page of `conversations.history` after `oldest` (newest first, as
    /// Slack lists it), with the messages' metadata; and the next page's cursor.
    pub async fn history(
        &self,
        channel: &str,
        oldest: &str,
        cursor: Option<String>,
    ) -> Result<(Vec<SlackHistoryMessage>, Option<String>), SendError> {
        let mut req = SlackApiConversationsHistoryRequest::new()
            .with_channel(SlackChannelId(channel.into()))
            .with_oldest(SlackTs(oldest.into()))
            .with_limit(200)
            .with_include_all_metadata(true);
        if let Some(c) = cursor {
            req = req.with_cursor(SlackCursorId(c));
        }
        let (session, req) = (&self.session(), &req);
        let page = self
            .call("conversations.history", channel, || {
                session.conversations_history(req)
            })
            .await
            .map_err(|e| classify("conversations.history", e))?;
        let next = next_cursor(page.response_metadata, page.has_more);
        Ok((page.messages, next))
    }

    /// One page of the replies in the thread of `ts` (the parent first),
    /// with the messages' metadata; and the next page's cursor.
    ///
    /// Slack lists metadata only when asked (`include_all_metadata`), and
    /// slack-morphism's request for this method has no such field: the
    /// call goes through the session's own `GET` with it added, and is
    /// read into the crate's response type.
    pub async fn replies(
        &self,
        channel: &str,
        ts: &str,
        cursor: Option<String>,
    ) -> Result<(Vec<SlackHistoryMessage>, Option<String>), SendError> {
        let params: Vec<(&str, Option<String>)> = vec![
            ("channel", Some(channel.to_string())),
            ("ts", Some(ts.to_string())),
            ("limit", Some("200".to_string())),
            ("include_all_metadata", Some("true".to_string())),
            ("cursor", cursor),
        ];
        let (session, params) = (&self.session(), &params);
        let page: SlackApiConversationsRepliesResponse = self
            .call("conversations.replies", channel, || {
                session.http_session_api.http_get::<_, _, String>(
                    "conversations.replies",
                    params,
                    None,
                )
            })
            .await
            .map_err(|e| classify("conversations.replies", e))?;
        let next = next_cursor(page.response_metadata, page.has_more);
        Ok((page.messages, next))
    }

    /// The reactions on message `ts`, with every user of each.
    pub async fn reactions(
        &self,
        channel: &str,
        ts: &str,
    ) -> Result<Vec<SlackReaction>, SendError> {
        let req = SlackApiReactionsGetRequest::new()
            .with_channel(SlackChannelId(channel.into()))
            .with_timestamp(SlackTs(ts.into()))
            .with_full(true);
        let (session, req) = (&self.session(), &req);
        let got = self
            .call("reactions.get", channel, || session.reactions_get(req))
            .await
            .map_err(|e| classify("reactions.get", e))?;
        Ok(match got {
            SlackApiReactionsGetResponse::Message(m) => {
                m.message.content.reactions.unwrap_or_default()
            }
            SlackApiReactionsGetResponse::File(_) => Vec::new(),
        })
    }

    /// `views.open`: a modal for the person who pressed (within the
    /// trigger's three seconds).
    pub async fn open_modal(&self, trigger_id: &str, view: Value) -> Result<(), SendError> {
        let view: SlackView = serde_json::from_value(view)
            .map_err(|e| SendError::Permanent(format!("cannot build the modal: {e}")))?;
        let req = SlackApiViewsOpenRequest::new(SlackTriggerId(trigger_id.into()), view);
        let (session, req) = (&self.session(), &req);
        self.call("views.open", "", || session.views_open(req))
            .await
            .map(|_| ())
            .map_err(|e| classify("views.open", e))
    }
}
