//! Delivery to Discord channels, the approval card, and its closing edit.
//!
//! Invariants: every create-message carries a nonce derived from the stream
//! entry with `enforce_nonce`, so a retry after a lost response returns the
//! message Discord already made instead of posting twice; long content is split,
//! never cut; 429s and 5xx are retried by the broker's backoff; 4xx (unknown
//! channel, missing access) are permanent and carry Discord's own message.

use std::sync::Arc;

use broker::outbox::{Outcome, Outgoing, SendError, Sender, Sent};
use serenity::builder::{CreateAllowedMentions, CreateMessage, EditMessage};
use serenity::http::{Http, HttpError};
use serenity::model::channel::{MessageReference, Nonce, ReactionType};
use serenity::model::id::{ChannelId, MessageId};

use crate::render;

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
    pub http: Arc<Http>,
    /// The `mentions` setting: what agent messages may ping.
    pub mentions: Vec<String>,
}

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
            let sent = channel_id
                .send_message(&*self.http, msg)
                .await
                .map_err(classify)?;
            first.get_or_insert(sent.id);
        }
        first.ok_or_else(|| SendError::Permanent("nothing to send".into()))
    }

    /// `GET users/@me` with the token: the ping's liveness check.
    pub async fn check(&self) -> Result<(), String> {
        self.http
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

    async fn update(&self, outcome: Outcome<'_>) -> Result<(), SendError> {
        let channel_id = channel(outcome.channel_id)?;
        let id = message_id(outcome.external_id)?;
        let text = render::closed_card(outcome.record, outcome.outcome);
        channel_id
            .edit_message(
                &*self.http,
                id,
                EditMessage::new()
                    .content(text)
                    .allowed_mentions(allowed(&[])),
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
                    channel_id
                        .create_reaction(
                            &*self.http,
                            head,
                            ReactionType::Unicode(emoji.to_string()),
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
