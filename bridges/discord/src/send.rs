//! Delivery to Discord channels, the approval card, and its closing edit.
//!
//! Invariants: every create-message carries a nonce derived from the stream
//! entry with `enforce_nonce`, so a retry after a lost response returns the
//! message Discord already made instead of posting twice; long content is split,
//! never cut; 429s and 5xx are retried by the broker's backoff; 4xx (unknown
//! channel, missing access) are permanent and carry Discord's own message.

use std::sync::Arc;

use broker::bridge::{CardUpdate, Outgoing, SendError, Sender, Sent};
use serenity::builder::{CreateAllowedMentions, CreateMessage, EditMessage};
use serenity::http::{Http, HttpError, LightMethod, Route};
use serenity::model::channel::Message;
use serenity::model::channel::{MessageReference, Nonce, ReactionType};
use serenity::model::id::{ChannelId, MessageId};

use crate::render;
use crate::rest::{Kind, Rest};

/// Classifies a serenity error for the retry policy.
pub fn classify(e: serenity::Error) -> SendError {
    match e {
        serenity::Error::Http(HttpError::UnsuccessfulRequest(r)) => {
            let status = r.status_code.as_u16();
            let what = format!(
                "Discord {status}: {} (code {})",
                r.error.message, r.error.code
            );
            if status == 429 || status >= 500 {
                SendError::Transient(what)
            } else if status == 401 {
                SendError::Credentials(format!("{what}; check token_file"))
            } else {
                SendError::Permanent(what)
            }
        }
        serenity::Error::Http(HttpError::Request(e)) => {
            SendError::Transient(format!("Discord request: {e}"))
        }
        serenity::Error::Model(e) => SendError::Permanent(format!("Discord: {e}")),
        other => SendError::Transient(format!("Discord: {other}")),
    }
}

/// The one spelling of a snowflake: ASCII digits, no sign, no leading zero,
/// not zero, within 64 bits. `u64::from_str` also takes `+123` and `0123`,
/// which would name channel 123 behind a string that differs from it.
pub fn canonical_snowflake(id: &str) -> Option<u64> {
    let n = id.parse::<u64>().ok().filter(|n| *n != 0)?;
    (n.to_string() == id).then_some(n)
}

fn channel(id: &str) -> Result<ChannelId, SendError> {
    canonical_snowflake(id)
        .map(ChannelId::new)
        .ok_or_else(|| SendError::Permanent(format!("`{id}` is not a Discord channel id")))
}

fn message_id(id: &str) -> Result<MessageId, SendError> {
    id.parse::<u64>()
        .ok()
        .filter(|n| *n != 0)
        .map(MessageId::new)
        .ok_or_else(|| SendError::Permanent(format!("`{id}` is not a Discord message id")))
}

/// Sends through Discord's REST API.
pub struct DiscordSender {
    /// Every call, under Discord's rate limits.
    pub rest: Arc<Rest>,
    /// The `mentions` setting: what agent messages may ping.
    pub mentions: Vec<String>,
    /// Channels Discord refused (Unknown Channel, Missing Access, no DMs):
    /// when, and what it said. Not asked again for [`REFUSAL_KEPT`]: Discord
    /// bans an address that makes 10,000 invalid requests in 10 minutes.
    refused: std::sync::Mutex<std::collections::HashMap<u64, (tokio::time::Instant, String)>>,
}

/// How long a channel Discord refused is refused without asking again.
pub const REFUSAL_KEPT: std::time::Duration = std::time::Duration::from_secs(600);

/// Pings that a message may make: none on cards; on deliveries, the kinds the
/// bridge's `mentions` setting names.
fn allowed(kinds: &[String]) -> CreateAllowedMentions {
    let on = |k: &str| kinds.iter().any(|m| m == k);
    CreateAllowedMentions::new()
        .all_users(on("users"))
        .all_roles(on("roles"))
        .everyone(on("everyone"))
}

impl DiscordSender {
    pub fn new(rest: Arc<Rest>, mentions: Vec<String>) -> DiscordSender {
        DiscordSender {
            rest,
            mentions,
            refused: Default::default(),
        }
    }

    fn http(&self) -> &Http {
        &self.rest.http
    }

    /// Creates one message, once its channel's bucket allows (see [`Rest`]).
    async fn create(
        &self,
        channel_id: ChannelId,
        msg: &CreateMessage,
    ) -> Result<Message, SendError> {
        let remembered = {
            let mut refused = self.refused.lock().unwrap_or_else(|p| p.into_inner());
            refused.retain(|_, (at, _)| at.elapsed() < REFUSAL_KEPT);
            refused
                .get(&channel_id.get())
                .map(|(at, why)| (at.elapsed(), why.clone()))
        };
        if let Some((ago, why)) = remembered {
            return Err(SendError::Permanent(format!(
                "{why} (answered {} s ago; not asked again for {} s, so refused requests do not pile up toward Discord's ban)",
                ago.as_secs(),
                REFUSAL_KEPT.as_secs()
            )));
        }
        let body = serde_json::to_vec(msg)
            .map_err(|e| SendError::Permanent(format!("cannot encode the message: {e}")))?;
        let request =
            serenity::http::Request::new(Route::ChannelMessages { channel_id }, LightMethod::Post)
                .body(Some(body));
        let response = match self
            .rest
            .call(Kind::Post, channel_id.get(), request, LightMethod::Post)
            .await
        {
            Ok(r) => r,
            Err(e) => {
                // Only refusals of the channel itself (Unknown Channel,
                // Missing Access, no DMs with that user): a 403 for one
                // message (Missing Permissions to reply, say) stays its own.
                let refusal = match &e {
                    serenity::Error::Http(HttpError::UnsuccessfulRequest(r)) => {
                        matches!(r.error.code, 10003 | 50001 | 50007)
                    }
                    _ => false,
                };
                let e = classify(e);
                if refusal {
                    let mut refused = self.refused.lock().unwrap_or_else(|p| p.into_inner());
                    refused.insert(
                        channel_id.get(),
                        (tokio::time::Instant::now(), e.to_string()),
                    );
                }
                return Err(e);
            }
        };
        // Created: a body lost now is found again by its nonce on the retry.
        let bytes = response.bytes().await.map_err(|e| {
            SendError::Transient(format!("Discord: reading the created message: {e}"))
        })?;
        serde_json::from_slice(&bytes)
            .map_err(|e| SendError::Transient(format!("Discord: the created message: {e}")))
    }

    /// Posts `parts` in order; returns the first message's id.
    async fn post(
        &self,
        channel_id: ChannelId,
        parts: &[String],
        delivery_key: &str,
        reply_to: Option<MessageId>,
        mentions: &[String],
    ) -> Result<MessageId, SendError> {
        let mut first = None;
        for (i, part) in parts.iter().enumerate() {
            let mut msg = CreateMessage::new()
                .content(part)
                .allowed_mentions(allowed(mentions))
                .nonce(Nonce::String(render::nonce(delivery_key, i)))
                .enforce_nonce(true);
            if let (0, Some(r)) = (i, reply_to) {
                msg = msg.reference_message(MessageReference::from((channel_id, r)));
            }
            let sent = self.create(channel_id, &msg).await?;
            first.get_or_insert(sent.id);
        }
        first.ok_or_else(|| SendError::Permanent("nothing to send".into()))
    }

    /// `GET users/@me` with the token: the ping's liveness check.
    pub async fn check(&self) -> Result<(), String> {
        self.http()
            .get_current_user()
            .await
            .map(|_| ())
            .map_err(|e| format!("Discord users/@me: {e}"))
    }
}

impl Sender for DiscordSender {
    fn canonical_destination(&self, raw: &str) -> Result<String, String> {
        canonical_snowflake(raw)
            .map(|n| n.to_string())
            .ok_or_else(|| {
                "not a Discord channel id (decimal digits, no sign or leading zero)".to_string()
            })
    }

    async fn send(&self, out: Outgoing<'_>) -> Result<Sent, SendError> {
        self.deliver(out).await.map(Sent::from)
    }

    async fn update(&self, outcome: CardUpdate<'_>) -> Result<(), SendError> {
        let channel_id = channel(outcome.channel_id)?;
        let id = message_id(outcome.external_id)?;
        if outcome.outcome == "reminder" {
            // A reply to the card: new activity where the approvers look.
            let text = render::reminder(outcome.record);
            let key = format!("{}#reminder", outcome.record.id);
            self.post(channel_id, &[text], &key, Some(id), &[]).await?;
            return Ok(());
        }
        let text = match (outcome.outcome, outcome.content) {
            // Still answerable: the card as it was, with its new deadline.
            ("snoozed" | "escalated", Some(content)) => {
                let redrawn = render::card(outcome.record, content);
                let unsnoozed = broker::approval::Record {
                    snoozed_until: None,
                    escalated: 0,
                    ..outcome.record.clone()
                };
                // The snooze's line must not push the content into parts
                // that were never posted: then the card stays as it is.
                if redrawn.len() != render::card(&unsnoozed, content).len() {
                    tracing::info!(approval = %outcome.record.id, "a snoozed card not redrawn: it would no longer fit its messages");
                    return Ok(());
                }
                redrawn.into_iter().next().unwrap_or_default()
            }
            _ => render::closed_card(outcome.record, outcome.outcome),
        };
        let body = serde_json::to_vec(
            &EditMessage::new()
                .content(text)
                .allowed_mentions(allowed(&[])),
        )
        .map_err(|e| SendError::Permanent(format!("cannot encode the edit: {e}")))?;
        let _: Message = self
            .rest
            .send_json(
                Kind::Edit,
                channel_id.get(),
                Route::ChannelMessage {
                    channel_id,
                    message_id: id,
                },
                LightMethod::Patch,
                Some(body),
                None,
            )
            .await
            .map_err(classify)?;
        Ok(())
    }
}

impl DiscordSender {
    /// One delivery; returns its external id.
    async fn deliver(&self, out: Outgoing<'_>) -> Result<String, SendError> {
        let m = out.message;
        let channel_id = channel(&m.channel_id)?;
        match out.approval {
            Some(record) => {
                let content = m.approval_content.as_deref().unwrap_or(&m.content);
                let card = render::card(record, content);
                let key = format!("{}#card", out.delivery_key);
                let head = self.post(channel_id, &card, &key, None, &[]).await?;
                // One click decides: the bot's own reactions (never counted as answers).
                for emoji in ["✅", "❌"] {
                    let reaction = ReactionType::Unicode(emoji.to_string()).as_data();
                    self.rest
                        .send_empty(
                            Kind::React,
                            channel_id.get(),
                            Route::ChannelMessageReactionMe {
                                channel_id,
                                message_id: head,
                                reaction: &reaction,
                            },
                            LightMethod::Put,
                        )
                        .await
                        .map_err(classify)?;
                }
                Ok(head.get().to_string())
            }
            None => {
                let reply_to = m.reply_to.as_deref().map(message_id).transpose()?;
                let parts = render::split(&m.content, render::LIMIT);
                let id = self
                    .post(
                        channel_id,
                        &parts,
                        out.delivery_key,
                        reply_to,
                        &self.mentions,
                    )
                    .await?;
                Ok(id.get().to_string())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_snowflake_has_one_spelling() {
        assert_eq!(
            super::canonical_snowflake("222222222222222222"),
            Some(222222222222222222)
        );
        for raw in [
            "+222222222222222222",
            "0222222222222222222",
            "0",
            " 1",
            "1 ",
            "١٢",
            "18446744073709551616",
        ] {
            assert_eq!(super::canonical_snowflake(raw), None, "{raw}");
        }
    }
}
