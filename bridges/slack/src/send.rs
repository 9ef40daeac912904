//! Delivery to Slack channels, the approval card, and its closing edit.
//!
//! Invariants:
//! - Agent text reaches Slack as rich text (see [`crate::render`]): shown as
//!   written, links not unfurled, mentions only as `mentions` allows.
//! - Slack has no nonce: each part carries metadata naming its delivery
//!   (a digest of the key) and its index. A retry first lists what the bot
//!   posted in the channel and posts only the parts Slack does not have; so
//!   does a post that may have happened (a server error, a lost response),
//!   at once, before the failure is reported: transient only when Slack
//!   certainly does not have it; the same for a thread reply, looked up in
//!   its thread (`conversations.replies` with the metadata). What cannot be
//!   told (more history than the lookup reads, a failed read, or a
//!   `reply_to` naming a reply rather than a thread's parent, whose thread
//!   Slack does not list) is reported `uncertain` instead of posted twice. Only the bot's
//!   own messages count, so another app cannot suppress a delivery by
//!   imitating the metadata.
//! - Long content is split, never cut, and posted in order.

use std::collections::BTreeMap;

use broker::bridge::{CardUpdate, Outgoing, SendError, Sender, Sent};
use slack_morphism::prelude::SlackHistoryMessage;
use tokio::sync::OnceCell;

use crate::api::Api;
use crate::render;

/// How long before its stream entry was written a delivery's first part can
/// be (clocks differ): the lookup reads history from then.
const CLOCK_SLACK_SECS: u64 = 300;
/// How far back the lookup reads when the key names no entry time.
const LOOKBACK_SECS: u64 = 7 * 24 * 3600;
/// Pages of history a retry reads at most (200 messages each).
const LOOKBACK_PAGES: usize = 10;

/// Sends through Slack's Web API.
pub struct SlackSender {
    pub api: Api,
    /// The `mentions` setting: what agent messages may ping.
    pub mentions: Vec<String>,
    /// The bot's user and bot ids (`auth.test`), asked once.
    me: OnceCell<(String, Option<String>)>,
}

/// A Slack channel id as Slack spells it (`C…`, `G…`, `D…`): a `#name` or a
/// user id would be reinterpreted by `chat.postMessage`, so they are refused.
pub fn canonical_channel(raw: &str) -> Result<String, String> {
    if crate::config::is_slack_id(raw, &['C', 'G', 'D']) {
        Ok(raw.to_string())
    } else {
        Err("not a Slack channel id (C…, G… or D…; not a #name or a user id)".into())
    }
}

/// A message `ts` as Slack writes it (digits, a dot, digits).
pub fn is_ts(ts: &str) -> bool {
    ts.split_once('.').is_some_and(|(a, b)| {
        !a.is_empty() && !b.is_empty() && (a.chars().chain(b.chars())).all(|c| c.is_ascii_digit())
    })
}

/// `channel:ts` of an external id.
pub fn parse_external(id: &str) -> Result<(&str, &str), SendError> {
    id.split_once(':')
        .filter(|(c, ts)| canonical_channel(c).is_ok() && is_ts(ts))
        .ok_or_else(|| SendError::Permanent(format!("`{id}` is not a Slack message (channel:ts)")))
}

/// When delivery `key` (`{stream}/{entry id}`, `#card` for a card) could
/// first have been posted: its stream entry's time, less the clocks' slack;
/// a week ago when the key names no time.
fn since(key: &str) -> u64 {
    let entry = key
        .trim_end_matches("#card")
        .rsplit('/')
        .next()
        .unwrap_or("");
    match entry
        .split('-')
        .next()
        .and_then(|ms| ms.parse::<u64>().ok())
    {
        Some(ms) => (ms / 1000).saturating_sub(CLOCK_SLACK_SECS),
        None => broker::now_secs().saturating_sub(LOOKBACK_SECS),
    }
}

impl SlackSender {
    pub fn new(api: Api, mentions: Vec<String>) -> SlackSender {
        SlackSender {
            api,
            mentions,
            me: OnceCell::new(),
        }
    }

    async fn me(&self) -> Result<&(String, Option<String>), SendError> {
        self.me
            .get_or_try_init(|| async {
                let me = self.api.whoami().await?;
                Ok::<_, SendError>((me.user_id.0, me.bot_id.map(|b| b.0)))
            })
            .await
    }

    /// The parts of delivery `key` the bot already posted in `channel`:
    /// index → ts, from the channel's history or, for a thread reply, its
    /// thread's. `None` when that cannot be told (history beyond what is
    /// read; a thread named by a message that is not its parent).
    async fn posted(
        &self,
        channel: &str,
        key: &str,
        thread: Option<&str>,
    ) -> Result<Option<BTreeMap<usize, String>>, SendError> {
        let (user, bot) = self.me().await?.clone();
        let tag = render::delivery_tag(key);
        let ours = |m: &SlackHistoryMessage| {
            let by_bot = m.sender.user.as_ref().is_some_and(|u| u.0 == user)
                || (bot.is_some() && m.sender.bot_id.as_ref().map(|b| &b.0) == bot.as_ref());
            let meta = m.content.metadata.as_ref()?;
            let payload = meta.event_payload.as_ref()?;
            (by_bot
                && meta.event_type == render::DELIVERY_EVENT
                && payload.get("key") == Some(&tag))
            .then(|| payload.get("part")?.parse::<usize>().ok())
            .flatten()
        };
        let mut found = BTreeMap::new();
        let mut cursor = None;
        for page_number in 0..LOOKBACK_PAGES {
            let (page, next) = match thread {
                Some(ts) => {
                    let (page, next) = self.api.replies(channel, ts, cursor).await?;
                    // Only a thread's parent lists its thread: asked with a
                    // reply's ts, Slack lists that reply alone, while a post
                    // to it lands in the parent's thread, unseen here.
                    let parent = page.first().filter(|m| {
                        m.origin.ts.0 == ts && m.origin.thread_ts.as_ref().is_none_or(|t| t.0 == ts)
                    });
                    if page_number == 0 && parent.is_none() {
                        return Ok(None);
                    }
                    (page, next)
                }
                None => {
                    let oldest = since(key);
                    self.api
                        .history(channel, &format!("{oldest}.000000"), cursor)
                        .await?
                }
            };
            for m in &page {
                if let Some(part) = ours(m) {
                    found.insert(part, m.origin.ts.0.clone());
                }
            }
            match next {
                Some(n) => cursor = Some(n),
                None => return Ok(Some(found)),
            }
        }
        // More history than is read: what was posted cannot be told.
        Ok(None)
    }

    /// Posts the parts of one delivery in order, skipping those a retry
    /// finds posted; returns the first part's ts.
    async fn post_parts(
        &self,
        channel: &str,
        key: &str,
        parts: &[(serde_json::Value, String)],
        thread: Option<&str>,
        retry: bool,
    ) -> Result<String, SendError> {
        let mut have = BTreeMap::new();
        if retry {
            match self.posted(channel, key, thread).await? {
                Some(found) => have = found,
                None => {
                    return Err(SendError::Uncertain(
                        "an earlier attempt may have posted this, and the history the bot can read cannot tell (too far back, or `reply_to` names a reply rather than its thread's parent)".into(),
                    ))
                }
            }
        }
        let mut first = None;
        for (i, (blocks, fallback)) in parts.iter().enumerate() {
            let ts = match have.get(&i) {
                Some(ts) => ts.clone(),
                None => {
                    let meta = render::delivery_metadata(key, i);
                    let posted = self
                        .api
                        .post(
                            channel,
                            blocks.clone(),
                            fallback.clone(),
                            thread,
                            Some(meta),
                        )
                        .await;
                    match posted {
                        Ok(ts) => ts,
                        Err((e, false)) => return Err(e),
                        // Slack may have posted it: look before anything
                        // is tried again (a retry after a transient
                        // failure would post blindly).
                        Err((e, true)) => self.found_after(channel, key, thread, i, e).await?,
                    }
                }
            };
            first.get_or_insert(ts);
        }
        first.ok_or_else(|| SendError::Permanent("nothing to send".into()))
    }

    /// After a post that may have happened: its ts when Slack has it; when
    /// Slack certainly has not, the failure as transient (try again); when
    /// that cannot be told (too much history; a reply to a reply), uncertain.
    async fn found_after(
        &self,
        channel: &str,
        key: &str,
        thread: Option<&str>,
        part: usize,
        failure: SendError,
    ) -> Result<String, SendError> {
        let found = match self.posted(channel, key, thread).await {
            Ok(found) => found,
            Err(e) => {
                return Err(SendError::Uncertain(format!(
                    "{failure}; and whether Slack posted it could not be read: {e}"
                )))
            }
        };
        match found {
            Some(found) if found.contains_key(&part) => Ok(found[&part].clone()),
            Some(_) => Err(SendError::Transient(format!(
                "{failure} (Slack does not have it)"
            ))),
            None => Err(SendError::Uncertain(format!(
                "{failure}; whether Slack posted it cannot be told from the history the bot reads (too far back, or `reply_to` names a reply rather than its thread's parent)"
            ))),
        }
    }

    /// `auth.test` with the token: the ping's liveness check.
    pub async fn check(&self) -> Result<(), String> {
        self.api
            .whoami()
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

impl Sender for SlackSender {
    /// Slack has no nonce; retries look for what was posted (see above).
    const DEDUPLICATES: bool = false;

    fn canonical_destination(&self, raw: &str) -> Result<String, String> {
        canonical_channel(raw)
    }

    async fn send(&self, out: Outgoing<'_>) -> Result<Sent, SendError> {
        let m = out.message;
        let channel = canonical_channel(&m.channel_id).map_err(SendError::Permanent)?;
        let ts = match out.approval {
            Some(record) => {
                let content = m.approval_content.as_deref().unwrap_or(&m.content);
                let card = [(
                    render::card_blocks(record, content),
                    render::card_fallback(record),
                )];
                let key = format!("{}#card", out.delivery_key);
                self.post_parts(&channel, &key, &card, None, out.retry)
                    .await?
            }
            None => {
                let thread = match m.reply_to.as_deref() {
                    Some(t) if is_ts(t) => Some(t),
                    Some(t) => {
                        return Err(SendError::Permanent(format!(
                            "reply_to `{t}` is not a Slack message ts"
                        )))
                    }
                    None => None,
                };
                let parts: Vec<_> = render::split(&m.content)
                    .iter()
                    .map(|p| (render::message_blocks(p, &self.mentions), render::escape(p)))
                    .collect();
                self.post_parts(&channel, out.delivery_key, &parts, thread, out.retry)
                    .await?
            }
        };
        Ok(Sent::from(render::external_id(&channel, &ts)))
    }

    async fn update(&self, u: CardUpdate<'_>) -> Result<(), SendError> {
        let (channel, ts) = parse_external(u.external_id)?;
        if u.outcome == "reminder" {
            // A reply in the card's thread, where its answers are given.
            let text = render::reminder(u.record);
            let key = format!("{}#reminder", u.record.id);
            let parts = [(render::message_blocks(&text, &[]), text.clone())];
            self.post_parts(channel, &key, &parts, Some(ts), false)
                .await?;
            return Ok(());
        }
        if let ("snoozed" | "escalated", Some(content)) = (u.outcome, u.content) {
            // Still answerable: the card as it was, with its new deadline.
            let blocks = render::card_blocks(u.record, content);
            let fallback = render::card_fallback(u.record);
            return self.api.update(channel, ts, blocks, fallback).await;
        }
        let status = render::status_line(u.record, u.outcome);
        self.api
            .update(
                channel,
                ts,
                render::closed_blocks(u.record, u.outcome),
                status,
            )
            .await
    }

    async fn delivered_already(&self, out: Outgoing<'_>) -> Option<String> {
        let m = out.message;
        let channel = canonical_channel(&m.channel_id).ok()?;
        let key = match out.approval {
            Some(_) => format!("{}#card", out.delivery_key),
            None => out.delivery_key.to_string(),
        };
        let parts = match out.approval {
            Some(_) => 1,
            None => render::split(&m.content).len(),
        };
        let thread = m.reply_to.as_deref().filter(|t| is_ts(t));
        let found = self.posted(&channel, &key, thread).await.ok()??;
        // Proven only when every part is there.
        (found.len() == parts)
            .then(|| found.get(&0).map(|ts| render::external_id(&channel, ts)))
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_have_one_spelling() {
        assert!(canonical_channel("C0123ABCD").is_ok());
        assert!(canonical_channel("D0123ABCD").is_ok());
        for bad in [
            "#general",
            "general",
            "U0123ABCD",
            "c0123abcd",
            "C0123ABCD ",
        ] {
            assert!(canonical_channel(bad).is_err(), "{bad}");
        }
        assert!(is_ts("1700000000.000100"));
        assert!(!is_ts("1700000000") && !is_ts(".1") && !is_ts("1.a"));
        assert!(parse_external("C0123ABCD:1700000000.000100").is_ok());
        assert!(parse_external("C0123ABCD").is_err());
        assert_eq!(since("ann:sl:outbox/1796323365368-0"), 1796323365 - 300);
        assert_eq!(since("sl:outbox/1796323365368-0#card"), 1796323365 - 300);
        assert!(since("weird") > 1_700_000_000);
    }
}
