//! Ingest over Socket Mode: messages in listened channels (and DMs, with
//! `dms`) to the inbox; Approve / Reject presses, the reject modal's reason,
//! reactions and thread replies on approval cards to the asking bridge.
//!
//! Invariants:
//! - Nothing from a workspace other than `team_id` is carried or counted
//!   (the envelope's team, and the presser's own team where Slack gives it).
//! - The bot's own messages and reactions, and other apps' messages, never
//!   count and are never carried.
//! - A press counts for the version its button showed: the button carries
//!   the digest, and an answer to another version is late. The reject modal
//!   carries the same digest to its submission.
//! - An event is acknowledged only once it is written (or deliberately
//!   ignored): a failure leaves it unacknowledged, so Slack sends it again.
//!   Each message is carried once per process (the ts carried are kept under
//!   the ingest's lock), and its channel's position is saved in the same
//!   transaction as its inbox entry.
//! - On every new connection (Slack's `hello`) the ingest catches up: each
//!   listened channel's messages after its saved position, oldest first, and
//!   each live card's reactions and thread replies. A live message heard
//!   while its channel is caught up does not move the saved position past
//!   older messages not yet carried. Button presses made while no connection
//!   was open are not caught up: Slack shows the presser an error and keeps
//!   no record of the press.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use broker::approval::{Outcome, Verdict};
use broker::ingest::Ingest;
use broker::{Error, Result};
use slack_morphism::prelude::*;
use tokio::sync::Mutex;

use crate::api::Api;
use crate::config::SlackSettings;
use crate::render;

/// A Slack ts as a number pair, for ordering (`"17.000100"` → (17, 100)).
pub fn ts_key(ts: &str) -> (u64, u64) {
    let (a, b) = ts.split_once('.').unwrap_or((ts, "0"));
    (a.parse().unwrap_or(0), b.parse().unwrap_or(0))
}

fn later(a: &str, b: &str) -> bool {
    ts_key(a) > ts_key(b)
}

/// A message's ts as Slack orders them (kept as written: it is the id).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
struct Ts(String);

impl Ord for Ts {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        ts_key(&self.0)
            .cmp(&ts_key(&other.0))
            .then_with(|| self.0.cmp(&other.0))
    }
}

impl PartialOrd for Ts {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// What this process carried, by channel and ts, and the positions to save.
type Carried = broker::carried::Carried<String, Ts>;

/// The event handler of one ingest.
pub struct Handler {
    ingest: Mutex<Ingest>,
    settings: SlackSettings,
    api: Api,
    /// The bot's user id and bot id, from `auth.test`.
    bot_user: String,
    bot_id: Option<String>,
    carried: std::sync::Mutex<Carried>,
    /// (card, user, verdict) answers a catch-up handed on.
    handed: std::sync::Mutex<HashSet<(String, String, bool)>>,
}

/// Slack's text of a message with its three entities decoded, so the agent
/// reads what the person typed (mentions stay `<@U…>`).
fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

fn failed(what: &str, e: broker::bridge::SendError) -> Error {
    let retriable = matches!(
        e,
        broker::bridge::SendError::Transient(_) | broker::bridge::SendError::Uncertain(_)
    );
    Error::platform(retriable, format!("{what}: {e}"))
}

impl Handler {
    pub fn new(
        ingest: Ingest,
        settings: SlackSettings,
        api: Api,
        bot_user: String,
        bot_id: Option<String>,
    ) -> Handler {
        Handler {
            ingest: Mutex::new(ingest),
            settings,
            api,
            bot_user,
            bot_id,
            carried: Default::default(),
            handed: Default::default(),
        }
    }

    fn carried(&self) -> std::sync::MutexGuard<'_, Carried> {
        self.carried.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ours(&self, team: &str) -> bool {
        team == self.settings.team_id
    }

    /// Whether a message was written by the bot or by any app.
    fn by_app(&self, sender: &SlackMessageSender) -> bool {
        sender.bot_id.is_some()
            || sender.user.as_ref().is_some_and(|u| u.0 == self.bot_user)
            || (self.bot_id.is_some()
                && sender.bot_id.as_ref().map(|b| &b.0) == self.bot_id.as_ref())
    }

    /// The approval card at `channel:ts`, if it is one of ours and live.
    async fn is_card(&self, external: &str) -> Result<bool> {
        let mut ingest = self.ingest.lock().await;
        if !ingest.is_approval_surface() {
            return Ok(false);
        }
        let name = ingest.name().to_string();
        ingest.approvals().map_has(&name, external).await
    }

    async fn answer(
        &self,
        card: &str,
        verdict: Verdict,
        user: &str,
        reason: &str,
        digest: &str,
    ) -> Result<Outcome> {
        self.ingest
            .lock()
            .await
            .answer_seeing(card, verdict, user, reason, digest)
            .await
    }

    /// A message event or a message of a catch-up.
    async fn on_message(
        &self,
        channel: &str,
        m: &SlackMessageOrigin,
        sender: &SlackMessageSender,
        text: &str,
        subtype: bool,
        caught_up: bool,
    ) -> Result<()> {
        if subtype || self.by_app(sender) {
            return Ok(());
        }
        let Some(user) = sender.user.as_ref().map(|u| u.0.clone()) else {
            return Ok(());
        };
        let ts = m.ts.0.as_str();
        let thread = m
            .thread_ts
            .as_ref()
            .map(|t| t.0.as_str())
            .filter(|t| *t != ts);
        // First: a card's thread is answered in wherever the card is, a
        // listened channel or not.
        if let Some(parent) = thread {
            let card = render::external_id(channel, parent);
            if self.is_card(&card).await? {
                // A reply in a card's thread is an answer (or nothing), never agent mail.
                let text = unescape(text);
                if let Some((verdict, reason)) = broker::text::reply_verdict(&text) {
                    self.answer(&card, verdict, &user, &reason, "").await?;
                } else if let Some((seconds, reason)) = broker::text::reply_later(&text) {
                    let mut ingest = self.ingest.lock().await;
                    ingest.snooze(&card, &user, seconds, &reason).await?;
                }
                return Ok(());
            }
        }
        let dm = channel.starts_with('D');
        if !(self.settings.channels.iter().any(|c| c == channel) || (self.settings.dms && dm)) {
            return Ok(());
        }
        let content = unescape(text);
        let seconds = ts.split('.').next().unwrap_or("0").to_string();
        let mut fields: Vec<(&str, &[u8])> = vec![
            ("channel_id", channel.as_bytes()),
            ("message_id", ts.as_bytes()),
            ("author_id", user.as_bytes()),
            ("author", user.as_bytes()),
            ("content", content.as_bytes()),
            ("timestamp", seconds.as_bytes()),
        ];
        if let Some(parent) = thread {
            fields.push(("reply_to", parent.as_bytes()));
        }
        let mut ingest = self.ingest.lock().await;
        let (channel, ts) = (channel.to_string(), Ts(ts.to_string()));
        if self.carried().has(&channel, &ts) {
            return Ok(());
        }
        let positions = self.carried().positions_after(&channel, &ts, caught_up);
        let positions = serde_json::to_string(&positions).unwrap_or_default();
        ingest.inbound_at(None, &fields, &positions).await?;
        self.carried().note(&channel, &ts, caught_up);
        Ok(())
    }

    async fn on_reaction(&self, r: &SlackReactionAddedEvent) -> Result<()> {
        if r.user.0 == self.bot_user {
            return Ok(());
        }
        let SlackReactionsItem::Message(item) = &r.item else {
            return Ok(());
        };
        let Some(channel) = item.origin.channel.as_ref() else {
            return Ok(());
        };
        let Some(verdict) = render::reaction_verdict(
            &r.reaction.0,
            &self.settings.approve_emoji,
            &self.settings.reject_emoji,
        ) else {
            return Ok(());
        };
        let card = render::external_id(&channel.0, &item.origin.ts.0);
        if self.is_card(&card).await? {
            self.answer(&card, verdict, &r.user.0, "", "").await?;
        }
        Ok(())
    }

    /// An event of the Events API.
    pub async fn on_push(&self, ev: SlackPushEventCallback) -> Result<()> {
        if !self.ours(&ev.team_id.0) {
            tracing::warn!(team = %ev.team_id.0, "an event from another workspace ignored");
            return Ok(());
        }
        match &ev.event {
            SlackEventCallbackBody::Message(m) => {
                let Some(channel) = m.origin.channel.as_ref() else {
                    return Ok(());
                };
                let text = m
                    .content
                    .as_ref()
                    .and_then(|c| c.text.clone())
                    .unwrap_or_default();
                self.on_message(
                    &channel.0,
                    &m.origin,
                    &m.sender,
                    &text,
                    m.subtype.is_some(),
                    false,
                )
                .await
            }
            SlackEventCallbackBody::ReactionAdded(r) => self.on_reaction(r).await,
            _ => Ok(()),
        }
    }

    /// A press or a modal's submission.
    pub async fn on_interaction(&self, ev: SlackInteractionEvent) -> Result<()> {
        match ev {
            SlackInteractionEvent::BlockActions(b) => {
                let Some(user) = b.user.as_ref() else {
                    return Ok(());
                };
                let user_team = user.team_id.as_ref().map(|t| t.0.as_str());
                if !self.ours(&b.team.id.0) || user_team.is_some_and(|t| !self.ours(t)) {
                    tracing::warn!(team = %b.team.id.0, user = %user.id.0, "a press from another workspace decides nothing");
                    return Ok(());
                }
                let SlackInteractionActionContainer::Message(container) = &b.container else {
                    return Ok(());
                };
                let Some(channel) = container.channel_id.as_ref() else {
                    return Ok(());
                };
                let card = render::external_id(&channel.0, &container.message_ts.0);
                for action in b.actions.iter().flatten() {
                    let digest = action.value.clone().unwrap_or_default();
                    if digest.is_empty() {
                        continue;
                    }
                    match action.action_id.0.as_str() {
                        render::APPROVE if self.is_card(&card).await? => {
                            self.answer(&card, Verdict::Approved, &user.id.0, "", &digest)
                                .await?;
                        }
                        render::LATER if self.is_card(&card).await? => {
                            let mut ingest = self.ingest.lock().await;
                            ingest.snooze(&card, &user.id.0, None, "").await?;
                        }
                        render::REJECT => {
                            // The reason is asked first; the answer is the
                            // submission's (checked then like any answer).
                            self.api
                                .open_modal(&b.trigger_id.0, render::reason_modal(&card, &digest))
                                .await
                                .map_err(|e| failed("opening the reject modal", e))?;
                        }
                        _ => {}
                    }
                }
                Ok(())
            }
            SlackInteractionEvent::ViewSubmission(v) => {
                let user_team = v.user.team_id.as_ref().map(|t| t.0.as_str());
                if !self.ours(&v.team.id.0) || user_team.is_some_and(|t| !self.ours(t)) {
                    tracing::warn!(team = %v.team.id.0, "a submission from another workspace decides nothing");
                    return Ok(());
                }
                let SlackView::Modal(modal) = &v.view.view else {
                    return Ok(());
                };
                if modal.callback_id.as_ref().map(|c| c.0.as_str()) != Some(render::REASON_MODAL) {
                    return Ok(());
                }
                let Some((card, digest)) = modal
                    .private_metadata
                    .as_deref()
                    .and_then(render::modal_target)
                else {
                    return Ok(());
                };
                let reason = v
                    .view
                    .state_params
                    .state
                    .as_ref()
                    .and_then(|s| s.values.get(&SlackBlockId(render::REASON_INPUT.into())))
                    .and_then(|b| b.get(&SlackActionId(render::REASON_INPUT.into())))
                    .and_then(|x| x.value.clone())
                    .unwrap_or_default();
                if self.is_card(&card).await? {
                    self.answer(&card, Verdict::Rejected, &v.user.id.0, &reason, &digest)
                        .await?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// On every new connection: what was said while none was open.
    pub async fn catch_up(&self) -> Result<()> {
        self.catch_up_messages().await?;
        self.catch_up_cards().await
    }

    async fn save_positions(&self, ingest: &mut Ingest) -> Result<()> {
        let cursor = serde_json::to_string(self.carried().positions()).unwrap_or_default();
        ingest.save_cursor(&cursor).await
    }

    async fn catch_up_messages(&self) -> Result<()> {
        let mut listened = self.settings.channels.clone();
        let stored = {
            let mut ingest = self.ingest.lock().await;
            let stored: BTreeMap<String, Ts> = ingest
                .cursor()
                .await?
                .and_then(|s| serde_json::from_str(&s).ok())
                .unwrap_or_default();
            if self.settings.dms {
                // DM channels the bot carried from before (Slack lists
                // them only to a user token with im:read).
                listened.extend(stored.keys().filter(|c| c.starts_with('D')).cloned());
            }
            // A first start (or a channel added) begins now.
            let now = Ts(format!("{}.000000", broker::now_secs()));
            self.carried().resume(&stored, &listened, &now);
            self.save_positions(&mut ingest).await?;
            stored
        };
        let mut carried = 0;
        for channel in &listened {
            let Some(after) = stored.get(channel) else {
                continue;
            };
            match self.catch_up_channel(channel, &after.0).await {
                Ok(n) => carried += n,
                Err(e) => {
                    tracing::warn!(channel = %channel, error = %e, "messages written meanwhile in this channel were not caught up")
                }
            }
            self.carried().caught_up(channel);
            let mut ingest = self.ingest.lock().await;
            self.save_positions(&mut ingest).await?;
        }
        if carried > 0 {
            tracing::info!(
                carried,
                "messages written while no connection was open were caught up"
            );
        }
        Ok(())
    }

    async fn catch_up_channel(&self, channel: &str, after: &str) -> Result<usize> {
        let mut all = Vec::new();
        let mut cursor = None;
        loop {
            let (page, next) = self
                .api
                .history(channel, after, cursor)
                .await
                .map_err(|e| failed("conversations.history", e))?;
            all.extend(page);
            match next {
                Some(n) => cursor = Some(n),
                None => break,
            }
        }
        all.retain(|m| later(&m.origin.ts.0, after));
        all.sort_by_key(|m| ts_key(&m.origin.ts.0));
        for m in &all {
            let text = m.content.text.clone().unwrap_or_default();
            self.on_message(
                channel,
                &m.origin,
                &m.sender,
                &text,
                m.subtype.is_some(),
                true,
            )
            .await?;
        }
        Ok(all.len())
    }

    /// Each live card's reactions and thread replies, answered as if heard
    /// live; an approver already counted is not answered for again.
    async fn catch_up_cards(&self) -> Result<()> {
        let cards = {
            let mut ingest = self.ingest.lock().await;
            if !ingest.is_approval_surface() {
                return Ok(());
            }
            let name = ingest.name().to_string();
            ingest.approvals().map_entries(&name).await?
        };
        let mut answers = 0;
        for (card, approval_id) in cards {
            // Each card on its own: one that cannot be read (deleted by an
            // admin, say) holds up no other.
            match self.catch_up_card(&card, &approval_id).await {
                Ok(n) => answers += n,
                Err(e) => {
                    tracing::warn!(card = %card, error = %e, "answers given meanwhile on this card were not caught up")
                }
            }
        }
        if answers > 0 {
            tracing::info!(
                answers,
                "answers made while no connection was open were caught up"
            );
        }
        Ok(())
    }

    /// One card's reactions and thread replies, answered as if heard live;
    /// returns how many answers were handed on.
    async fn catch_up_card(&self, card: &str, approval_id: &str) -> Result<usize> {
        let Ok((channel, ts)) = crate::send::parse_external(card) else {
            return Ok(0);
        };
        let record = self
            .ingest
            .lock()
            .await
            .approvals()
            .load(approval_id)
            .await?;
        let Some(record) = record.filter(|r| !r.is_settled()) else {
            return Ok(0);
        };
        let counted = |user: &str| {
            let who = broker::identity::Identity::on("slack", user);
            record.approvals.iter().any(|a| a == who.as_str())
        };
        let mut said: Vec<(Verdict, String, String)> = Vec::new();
        let reactions = self
            .api
            .reactions(channel, ts)
            .await
            .map_err(|e| failed("reactions.get", e))?;
        for r in reactions {
            let Some(verdict) = render::reaction_verdict(
                &r.name.0,
                &self.settings.approve_emoji,
                &self.settings.reject_emoji,
            ) else {
                continue;
            };
            for u in r.users.iter().filter(|u| u.0 != self.bot_user) {
                said.push((verdict, u.0.clone(), String::new()));
            }
        }
        // As live: no edited reply, none with a subtype (a file, a reply
        // also sent to the channel), no app's.
        let plain = |m: &&SlackHistoryMessage| {
            m.origin.ts.0 != ts
                && !self.by_app(&m.sender)
                && m.subtype.is_none()
                && m.edited.is_none()
        };
        let mut cursor = None;
        loop {
            let (page, next) = self
                .api
                .replies(channel, ts, cursor)
                .await
                .map_err(|e| failed("conversations.replies", e))?;
            for m in page.iter().filter(plain) {
                let (Some(user), Some(text)) = (&m.sender.user, &m.content.text) else {
                    continue;
                };
                if let Some((verdict, reason)) = broker::text::reply_verdict(&unescape(text)) {
                    said.push((verdict, user.0.clone(), reason));
                }
            }
            match next {
                Some(n) => cursor = Some(n),
                None => break,
            }
        }
        // One rejection rejects, whatever order Slack lists them in.
        said.sort_by_key(|(verdict, ..)| *verdict != Verdict::Rejected);
        let mut answers = 0;
        for (verdict, user, reason) in said {
            if verdict == Verdict::Approved && counted(&user) {
                continue;
            }
            // Handed on once per process: a stranger's reaction is not
            // audited again on every reconnection.
            let key = (card.to_string(), user.clone(), verdict == Verdict::Approved);
            if !self.handed().insert(key) {
                continue;
            }
            answers += 1;
            self.answer(card, verdict, &user, &reason, "").await?;
        }
        Ok(answers)
    }

    fn handed(&self) -> std::sync::MutexGuard<'_, HashSet<(String, String, bool)>> {
        self.handed.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The handler the listener's state holds.
async fn handler(state: &SlackClientEventsUserState) -> Option<Arc<Handler>> {
    state.read().await.get_user_state::<Arc<Handler>>().cloned()
}

/// A new connection: ready, and catch up beside it.
async fn on_hello<E: Send + 'static>(
    _ev: E,
    _client: Arc<crate::api::Client>,
    state: SlackClientEventsUserState,
) {
    tracing::info!("connected to Slack over Socket Mode");
    broker::systemd::ready();
    if let Some(h) = handler(&state).await {
        // Beside the connection, which must keep reading (and acking).
        tokio::spawn(async move {
            if let Err(e) = h.catch_up().await {
                tracing::error!(error = %e, "catching up after connecting failed");
            }
        });
    }
}

async fn on_push(
    ev: SlackPushEventCallback,
    _client: Arc<crate::api::Client>,
    state: SlackClientEventsUserState,
) -> UserCallbackResult<()> {
    match handler(&state).await {
        Some(h) => h.on_push(ev).await.map_err(|e| e.into()),
        None => Err("no handler".into()),
    }
}

async fn on_interaction(
    ev: SlackInteractionEvent,
    _client: Arc<crate::api::Client>,
    state: SlackClientEventsUserState,
) -> UserCallbackResult<()> {
    match handler(&state).await {
        Some(h) => h.on_interaction(ev).await.map_err(|e| e.into()),
        None => Err("no handler".into()),
    }
}

/// The listener's callbacks; each reads the [`Handler`] from the listener's
/// user state. An event is acknowledged only when its callback succeeded.
pub fn callbacks() -> SlackSocketModeListenerCallbacks<crate::api::Connector> {
    SlackSocketModeListenerCallbacks::new()
        .with_hello_events(on_hello)
        .with_push_events(on_push)
        .with_interaction_events(on_interaction)
}
