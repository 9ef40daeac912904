//! Ingest: a gateway connection (serenity) that carries messages from the
//! configured channels (and DMs, if enabled) into the inbox, and turns reactions
//! and replies on approval cards into `resolve_approval`.
//!
//! Invariants:
//! - Intents are only what this needs: guilds (roles, channels and the bot's
//!   own member, for [`crate::perms`]), guild messages, message content
//!   (privileged), guild message reactions, and the DM pair when `dms` is on.
//! - A call the gateway says the bot may not make (reading a channel it may
//!   not read, removing a reaction where it may not manage messages) is not
//!   made: each 403 counts toward Discord's ban. The catch-up waits (at most
//!   [`GUILDS_WAIT`]) for the guilds READY names, so it knows.
//! - The bot's own messages and reactions never count; a reaction from someone
//!   not on `approval.approvers` decides nothing and is removed where the bot may.
//! - Replies to a card are answers, never inbox entries.
//! - Serenity reconnects and resumes the gateway session by itself; handlers may
//!   run concurrently, so each one does its own Redis round trips under a lock.
//! - A resumed session replays what it missed; a new one (after a restart, a
//!   deploy, an outage longer than a resume allows) does not, so on every READY
//!   the ingest reads each live card's reactions and replies over REST and
//!   answers with them ([`Handler::catch_up`]). Answers already counted are
//!   skipped; any other repeat is refused by the asking outbox as already
//!   decided, so catching up twice decides nothing twice.
//! - Messages in listened channels are caught up the same way, from the last
//!   one carried per channel (kept in `{bridge}:ingest:cursor`, written in
//!   one transaction with each inbox entry, so a crash between them carries
//!   nothing twice); none is carried twice by one process (the ids carried
//!   are remembered, checked and recorded under the ingest's lock). The
//!   saved positions are taken up before anything is carried (on READY, or
//!   by the first live message if it comes first). Only a
//!   live message heard while its channel is still being caught up can come
//!   twice, if the process dies before that catch-up ends. The first start
//!   carries nothing from before it. DM channels (with `dms`) are caught up
//!   once the bot has carried a message from them: their positions are saved
//!   with the rest, and Discord confirms each is a DM before it is read.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use broker::approval::{Outcome, Verdict};
use broker::ingest::Ingest;
use broker::{Error, Result, Shutdown};
use serenity::all::{
    ChannelId, Context, EventHandler, GatewayIntents, Guild, Message, MessageId, Reaction,
    ReactionType, Ready, User, UserId,
};
use serenity::async_trait;
use serenity::http::{LightMethod, Route};
use tokio::sync::Mutex;

use crate::config::DiscordSettings;
use crate::perms::{self, Permits};
use crate::render;
use crate::rest::{Kind, Rest};

/// How long the catch-up waits for the guilds READY names to arrive (their
/// GUILD_CREATE carries the permissions it checks).
pub const GUILDS_WAIT: Duration = Duration::from_secs(10);

/// Attempts at an event while Redis is unavailable (about two minutes in all).
const RETRIES: u32 = 10;

/// Runs `step` until it succeeds, [`RETRIES`] times at most (with the
/// broker's back-off, cut short by shutdown): the gateway will not send an
/// event again, so a step that failed while Redis was away waits here. A step
/// given up on is logged, naming `what`.
async fn retried<F, Fut>(what: &str, shutdown: &Shutdown, mut step: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let mut attempt = 0;
    while let Err(e) = step().await {
        attempt += 1;
        // A refusal (a channel the bot cannot read, a revoked token) is the
        // same on every attempt: asking again only counts toward Discord's ban.
        if attempt > RETRIES || !e.is_retriable() {
            tracing::error!(error = %e, "{what}: given up");
            return;
        }
        tracing::warn!(error = %e, attempt, "{what} failed; trying again");
        if !shutdown.sleep(broker::retry::backoff(attempt)).await {
            return;
        }
    }
}

/// A failed Discord request of the catch-up, classified as a send's would be:
/// a rate limit or an outage is worth retrying, a refusal is not.
fn discord_error(what: String, err: serenity::Error) -> Error {
    let message = format!("{what}: {err}");
    match crate::send::classify(err) {
        broker::bridge::SendError::Transient(_) | broker::bridge::SendError::Uncertain(_) => {
            Error::platform(true, message)
        }
        _ => Error::platform(false, message),
    }
}

/// The snowflake of this moment (Discord's epoch is 2015-01-01): a message id
/// every later message exceeds.
fn snowflake_now() -> u64 {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    ms.saturating_sub(1_420_070_400_000) << 22
}

/// What this process carried to the inbox, by channel and message id.
type Carried = broker::carried::Carried<u64, u64>;

/// The gateway intents the ingest asks for.
pub fn intents(dms: bool) -> GatewayIntents {
    let mut i = GatewayIntents::GUILDS
        | GatewayIntents::GUILD_MESSAGES
        | GatewayIntents::MESSAGE_CONTENT
        | GatewayIntents::GUILD_MESSAGE_REACTIONS;
    if dms {
        i |= GatewayIntents::DIRECT_MESSAGES | GatewayIntents::DIRECT_MESSAGE_REACTIONS;
    }
    i
}

/// The event handler.
pub struct Handler {
    ingest: Mutex<Ingest>,
    settings: DiscordSettings,
    channels: HashSet<u64>,
    bot: OnceLock<UserId>,
    carried: std::sync::Mutex<Carried>,
    /// The catch-up's reads and the removal of strangers' reactions, under
    /// Discord's rate limits.
    rest: Rest,
    /// Ends the waits between retries.
    shutdown: Shutdown,
    /// What the bot may do where, as the gateway says.
    permits: Permits,
    /// Rung on every GUILD_CREATE (the catch-up waits for its guilds).
    guild_arrived: tokio::sync::Notify,
    /// The saved positions were taken up ([`Handler::resume_positions`]).
    resumed: AtomicBool,
}

impl Handler {
    pub fn new(
        ingest: Ingest,
        settings: DiscordSettings,
        rest: Rest,
        shutdown: Shutdown,
    ) -> Handler {
        let channels = settings
            .channels
            .iter()
            .filter_map(|c| c.parse().ok())
            .collect();
        Handler {
            ingest: Mutex::new(ingest),
            settings,
            channels,
            bot: OnceLock::new(),
            carried: Default::default(),
            rest,
            shutdown,
            permits: Permits::default(),
            guild_arrived: tokio::sync::Notify::new(),
            resumed: AtomicBool::new(false),
        }
    }

    /// Up to 100 messages of `channel` after `after` (any order).
    async fn messages_after(&self, channel: ChannelId, after: MessageId) -> Result<Vec<Message>> {
        self.rest
            .send_json(
                Kind::ReadMessages,
                channel.get(),
                Route::ChannelMessages {
                    channel_id: channel,
                },
                LightMethod::Get,
                None,
                Some(vec![("limit", "100".into()), ("after", after.to_string())]),
            )
            .await
            .map_err(|err| discord_error(format!("Discord messages in {channel}"), err))
    }

    /// Up to 100 users who reacted `emoji` on `card` after `after`; `burst`
    /// for super reactions (Discord lists the two kinds apart).
    async fn reactors(
        &self,
        channel: ChannelId,
        card: MessageId,
        emoji: &str,
        burst: bool,
        after: Option<UserId>,
    ) -> Result<Vec<User>> {
        let reaction = ReactionType::Unicode(emoji.to_string()).as_data();
        let mut params = vec![
            ("limit", "100".to_string()),
            ("type", u8::from(burst).to_string()),
        ];
        if let Some(after) = after {
            params.push(("after", after.to_string()));
        }
        self.rest
            .send_json(
                Kind::ReadReactions,
                channel.get(),
                Route::ChannelMessageReactionEmoji {
                    channel_id: channel,
                    message_id: card,
                    reaction: &reaction,
                },
                LightMethod::Get,
                None,
                Some(params),
            )
            .await
            .map_err(|err| discord_error(format!("Discord reactions on {card}"), err))
    }

    /// Removes `user`'s `emoji` on `card` (a stranger's answer), where the bot may.
    async fn remove_reaction(
        &self,
        channel: ChannelId,
        card: MessageId,
        user: UserId,
        emoji: &str,
    ) {
        if let Some(missing) = self.permits.lacking(channel, perms::UNREACT) {
            tracing::info!(%channel, %card, %missing, "a stranger's reaction stays: the bot may not remove reactions in this channel");
            return;
        }
        let reaction = ReactionType::Unicode(emoji.to_string()).as_data();
        let removed = self
            .rest
            .send_empty(
                Kind::Unreact,
                channel.get(),
                Route::ChannelMessageReaction {
                    channel_id: channel,
                    message_id: card,
                    user_id: user,
                    reaction: &reaction,
                },
                LightMethod::Delete,
            )
            .await;
        if let Err(e) = removed {
            tracing::debug!(error = %e, "could not remove a stranger's reaction");
        }
    }

    fn is_bot(&self, user: UserId) -> bool {
        self.bot.get() == Some(&user)
    }

    /// Whether `message_id` is one of our live approval cards.
    async fn is_card(&self, message_id: u64) -> Result<bool> {
        let mut ingest = self.ingest.lock().await;
        if !ingest.is_approval_surface() {
            return Ok(false);
        }
        let name = ingest.name().to_string();
        let found = ingest
            .approvals()
            .map_has(&name, &message_id.to_string())
            .await?;
        Ok(found)
    }

    async fn answer(
        &self,
        card: u64,
        verdict: Verdict,
        user: UserId,
        reason: &str,
    ) -> Result<Outcome> {
        self.ingest
            .lock()
            .await
            .answer(&card.to_string(), verdict, &user.get().to_string(), reason)
            .await
    }

    async fn on_message(&self, msg: &Message, caught_up: bool) -> Result<()> {
        if self.is_bot(msg.author.id) {
            return Ok(());
        }
        let listened = self.channels.contains(&msg.channel_id.get())
            || (self.settings.dms && msg.guild_id.is_none());
        if !listened {
            return Ok(());
        }
        let referenced = msg.message_reference.as_ref().and_then(|r| r.message_id);
        if let Some(card) = referenced {
            if self.is_card(card.get()).await? {
                // A reply to a card is an answer (or nothing), never agent mail.
                if let Some((verdict, reason)) = render::reply_verdict(&msg.content) {
                    self.answer(card.get(), verdict, msg.author.id, &reason)
                        .await?;
                } else if let Some((seconds, reason)) = broker::text::reply_later(&msg.content) {
                    let user = msg.author.id.get().to_string();
                    let mut ingest = self.ingest.lock().await;
                    ingest
                        .snooze(&card.get().to_string(), &user, seconds, &reason)
                        .await?;
                }
                return Ok(());
            }
        }
        let (channel_id, message_id, author_id) = (
            msg.channel_id.get().to_string(),
            msg.id.get().to_string(),
            msg.author.id.get().to_string(),
        );
        let timestamp = msg.timestamp.unix_timestamp().to_string();
        let reply_to = referenced.map(|r| r.get().to_string());
        let mut fields: Vec<(&str, &[u8])> = vec![
            ("channel_id", channel_id.as_bytes()),
            ("message_id", message_id.as_bytes()),
            ("author_id", author_id.as_bytes()),
            ("author", msg.author.name.as_bytes()),
            ("content", msg.content.as_bytes()),
            ("timestamp", timestamp.as_bytes()),
        ];
        if let Some(r) = &reply_to {
            fields.push(("reply_to", r.as_bytes()));
        }
        let (channel, id) = (msg.channel_id.get(), msg.id.get());
        // Under the lock: a message caught up and heard live is carried once.
        let mut ingest = self.ingest.lock().await;
        if !self.resumed.load(Ordering::Acquire) {
            self.resume_positions(&mut ingest).await?;
        }
        if self.carried().has(&channel, &id) {
            return Ok(());
        }
        // The entry and the position past it in one transaction: a restart
        // between them would carry the message again.
        let positions = self.carried().positions_after(&channel, &id, caught_up);
        let positions = serde_json::to_string(&positions).unwrap_or_default();
        ingest.inbound_at(None, &fields, &positions).await?;
        self.carried().note(&channel, &id, caught_up);
        Ok(())
    }

    /// Saves the position per channel (under the ingest's lock, so saves
    /// never overtake each other).
    async fn save_positions(&self, ingest: &mut Ingest) -> Result<()> {
        let cursor = serde_json::to_string(self.carried().positions()).unwrap_or_default();
        ingest.save_cursor(&cursor).await
    }

    fn carried(&self) -> std::sync::MutexGuard<'_, Carried> {
        self.carried.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes up the saved positions (under the ingest's lock, which the
    /// caller holds): every configured channel, and with `dms` every other
    /// channel with a position (a DM until Discord says otherwise); a channel
    /// with none yet (a first start, a channel added to the config) starts
    /// from now. Runs before anything is carried in a process: until then a
    /// live message would save positions naming its channel alone, and the
    /// catch-up would start every other channel from now, skipping what was
    /// written there meanwhile. Again on every new session.
    async fn resume_positions(&self, ingest: &mut Ingest) -> Result<BTreeMap<u64, u64>> {
        let stored: BTreeMap<u64, u64> = ingest
            .cursor()
            .await?
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or_default();
        let mut listened: Vec<u64> = self.channels.iter().copied().collect();
        if self.settings.dms {
            listened.extend(stored.keys().filter(|c| !self.channels.contains(c)));
        }
        self.carried().resume(&stored, &listened, &snowflake_now());
        self.save_positions(ingest).await?;
        self.resumed.store(true, Ordering::Release);
        Ok(stored)
    }

    /// Carries what was written in the listened channels since the last
    /// message carried there (nothing on a first start: no cursor yet).
    async fn catch_up_messages(&self) -> Result<()> {
        // DM channels the bot has carried from before (their positions are
        // saved with the rest; Discord lists a bot's DM channels nowhere).
        let candidates: Vec<u64> = self
            .carried()
            .positions()
            .keys()
            .filter(|c| !self.channels.contains(c))
            .copied()
            .collect();
        let dms = self.known_dm_channels(&candidates).await;
        let listened: Vec<u64> = self.channels.iter().copied().chain(dms).collect();
        // Read, merged and marked under the ingest's lock, so no live message
        // is carried between reading the positions and marking the channels.
        let stored = {
            let mut ingest = self.ingest.lock().await;
            let stored = self.resume_positions(&mut ingest).await?;
            for c in candidates.iter().filter(|c| !listened.contains(c)) {
                self.carried().forget(c);
            }
            self.save_positions(&mut ingest).await?;
            stored
        };
        let mut carried = 0;
        for channel in listened {
            let Some(after) = stored.get(&channel).copied().map(MessageId::new) else {
                continue;
            };
            // Each channel on its own: one that cannot be read (no access
            // any more) holds up no other.
            match self.catch_up_channel(channel, after).await {
                Ok(n) => carried += n,
                Err(e) => {
                    tracing::warn!(channel, error = %e, "messages written meanwhile in this channel were not caught up")
                }
            }
            self.carried().caught_up(&channel);
            let mut ingest = self.ingest.lock().await;
            self.save_positions(&mut ingest).await?;
        }
        if carried > 0 {
            tracing::info!(
                carried,
                "messages written while no session was listening were caught up"
            );
        }
        Ok(())
    }

    /// With `dms` on: which of `candidates` (channels with a saved position
    /// that are not configured) Discord says are DMs (type 1). A configured
    /// channel since removed is not one, so it is not read again.
    async fn known_dm_channels(&self, candidates: &[u64]) -> Vec<u64> {
        if !self.settings.dms {
            return Vec::new();
        }
        let mut dms = Vec::new();
        for channel in candidates {
            match self.rest.channel(*channel).await {
                Ok(c) if c["type"].as_u64() == Some(1) => dms.push(*channel),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(channel, error = %e, "a DM channel could not be looked up; its messages written meanwhile are not caught up")
                }
            }
        }
        dms
    }

    /// Carries `channel`'s messages after `after`, oldest first; returns how many.
    async fn catch_up_channel(&self, channel: u64, mut after: MessageId) -> Result<usize> {
        if let Some(missing) = self.permits.lacking(ChannelId::new(channel), perms::READ) {
            return Err(Error::platform(
                false,
                format!("the bot may not read this channel's history (it lacks {missing})"),
            ));
        }
        let mut carried = 0;
        loop {
            let mut page = self.messages_after(ChannelId::new(channel), after).await?;
            page.sort_by_key(|m| m.id);
            for m in &page {
                self.on_message(m, true).await?;
                carried += 1;
            }
            match page.last() {
                Some(last) if page.len() == 100 => after = last.id,
                _ => return Ok(carried),
            }
        }
    }

    /// Answers with what was said on the live cards while no session was
    /// listening: each card's approve and reject reactions and the replies to
    /// it, read over REST. An approver already counted on the record is not
    /// answered for again.
    async fn catch_up(&self) -> Result<()> {
        let (name, cards) = {
            let mut ingest = self.ingest.lock().await;
            if !ingest.is_approval_surface() {
                return Ok(());
            }
            let name = ingest.name().to_string();
            let cards = ingest.approvals().map_entries(&name).await?;
            (name, cards)
        };
        let (mut reactions, mut replies) = (0, 0);
        for (card, approval_id) in cards {
            let Ok(card) = card.parse::<u64>().map(MessageId::new) else {
                continue;
            };
            let record = self
                .ingest
                .lock()
                .await
                .approvals()
                .load(&approval_id)
                .await?;
            let Some(record) = record.filter(|r| !r.is_settled()) else {
                continue;
            };
            let shown_here = record.card(&name).map(|c| c.channel);
            let Some(channel) = shown_here.and_then(|c| crate::send::canonical_snowflake(&c))
            else {
                continue;
            };
            let channel = ChannelId::new(channel);
            if let Some(missing) = self.permits.lacking(channel, perms::READ) {
                tracing::warn!(%channel, %card, %missing, "answers made on this card while no session listened are not caught up: the bot may not read its channel's history");
                continue;
            }
            let counted = |user: UserId| {
                let who = broker::identity::Identity::on("discord", &user.to_string());
                record.approvals.iter().any(|a| a == who.as_str())
            };
            let emoji = self
                .settings
                .approve_emoji
                .iter()
                .map(|e| (e, Verdict::Approved))
                .chain(
                    self.settings
                        .reject_emoji
                        .iter()
                        .map(|e| (e, Verdict::Rejected)),
                );
            // Everything said on the card first, then answered rejections
            // first: one ❌ rejects, whatever order the API lists them in.
            let mut said: Vec<(Verdict, UserId, String, Option<String>)> = Vec::new();
            // Normal and super (burst) reactions are listed apart.
            for ((e, verdict), burst) in emoji.flat_map(|ev| [(ev, false), (ev, true)]) {
                let mut after: Option<UserId> = None;
                loop {
                    let users = self.reactors(channel, card, e, burst, after).await?;
                    for u in &users {
                        if !self.is_bot(u.id) {
                            said.push((verdict, u.id, String::new(), Some(e.clone())));
                        }
                    }
                    match users.last() {
                        Some(last) if users.len() == 100 => after = Some(last.id),
                        _ => break,
                    }
                }
            }
            let mut after = card;
            loop {
                let mut page = self.messages_after(channel, after).await?;
                page.sort_by_key(|m| m.id);
                for m in &page {
                    let to_card =
                        m.message_reference.as_ref().and_then(|r| r.message_id) == Some(card);
                    if !to_card || self.is_bot(m.author.id) {
                        continue;
                    }
                    if let Some((verdict, reason)) = render::reply_verdict(&m.content) {
                        said.push((verdict, m.author.id, reason, None));
                    }
                }
                match page.last() {
                    Some(last) if page.len() == 100 => after = last.id,
                    _ => break,
                }
            }
            said.sort_by_key(|(verdict, ..)| *verdict != Verdict::Rejected);
            for (verdict, user, reason, emoji) in said {
                if verdict == Verdict::Approved && counted(user) {
                    continue;
                }
                match &emoji {
                    Some(_) => reactions += 1,
                    None => replies += 1,
                }
                let outcome = self.answer(card.get(), verdict, user, &reason).await?;
                if let (Outcome::NotAllowed, Some(e)) = (outcome, emoji) {
                    // As when it is seen live: the card stays clean.
                    self.remove_reaction(channel, card, user, &e).await;
                }
            }
        }
        if reactions + replies > 0 {
            tracing::info!(
                reactions,
                replies,
                "answers made while no session was listening were caught up"
            );
        }
        Ok(())
    }

    async fn on_reaction(&self, reaction: &Reaction) -> Result<()> {
        let Some(user) = reaction.user_id else {
            return Ok(());
        };
        if self.is_bot(user) {
            return Ok(());
        }
        let ReactionType::Unicode(emoji) = &reaction.emoji else {
            return Ok(());
        };
        if broker::approval::is_later_emoji(emoji) {
            let card = reaction.message_id.get();
            if !self.is_card(card).await? {
                return Ok(());
            }
            let outcome = self
                .ingest
                .lock()
                .await
                .snooze(&card.to_string(), &user.get().to_string(), None, "")
                .await?;
            if outcome == Outcome::NotAllowed {
                self.remove_reaction(reaction.channel_id, reaction.message_id, user, emoji)
                    .await;
            }
            return Ok(());
        }
        let Some(verdict) = render::reaction_verdict(
            emoji,
            &self.settings.approve_emoji,
            &self.settings.reject_emoji,
        ) else {
            return Ok(());
        };
        if !self.is_card(reaction.message_id.get()).await? {
            return Ok(());
        }
        if self
            .answer(reaction.message_id.get(), verdict, user, "")
            .await?
            == Outcome::NotAllowed
        {
            // Keep the card clean for the real approvers; fine if we lack the permission.
            self.remove_reaction(reaction.channel_id, reaction.message_id, user, emoji)
                .await;
        }
        Ok(())
    }
}

#[async_trait]
impl EventHandler for Handler {
    async fn ready(&self, ctx: Context, ready: Ready) {
        let _ = self.bot.set(ready.user.id);
        self.permits.start(ctx.cache.clone(), ready.user.id);
        tracing::info!(user = %ready.user.name, "connected to the Discord gateway");
        broker::systemd::ready();
        let shutdown = &self.shutdown;
        retried("taking up the saved positions", shutdown, || async {
            let mut ingest = self.ingest.lock().await;
            self.resume_positions(&mut ingest).await.map(|_| ())
        })
        .await;
        let guilds: Vec<_> = ready.guilds.iter().map(|g| g.id).collect();
        let loaded = || guilds.iter().all(|g| ctx.cache.guild(*g).is_some());
        let arrived = tokio::time::timeout(GUILDS_WAIT, async {
            loop {
                let rung = self.guild_arrived.notified();
                tokio::pin!(rung);
                rung.as_mut().enable();
                if loaded() {
                    return;
                }
                rung.await;
            }
        })
        .await;
        if arrived.is_err() {
            tracing::warn!("not every guild arrived within {GUILDS_WAIT:?}; catching up without knowing the bot's permissions there");
        }
        retried("catching up on the channels' messages", shutdown, || {
            self.catch_up_messages()
        })
        .await;
        retried("catching up on the cards' answers", shutdown, || {
            self.catch_up()
        })
        .await;
    }

    async fn guild_create(&self, _ctx: Context, _guild: Guild, _is_new: Option<bool>) {
        self.guild_arrived.notify_waiters();
    }

    async fn message(&self, _ctx: Context, msg: Message) {
        let what = format!("carrying message {}", msg.id);
        retried(&what, &self.shutdown, || self.on_message(&msg, false)).await;
    }

    async fn reaction_add(&self, _ctx: Context, reaction: Reaction) {
        let what = format!("a reaction on message {}", reaction.message_id);
        retried(&what, &self.shutdown, || self.on_reaction(&reaction)).await;
    }
}

/// Runs the gateway client until shutdown, with heartbeats and the watchdog.
pub async fn run(
    mut client: serenity::Client,
    beats: impl std::future::Future<Output = ()>,
    bridge: String,
    shutdown: Shutdown,
) -> Result<()> {
    let shards = client.shard_manager.clone();
    let token_key = format!("bridges.{bridge}.token_file");
    let result = tokio::select! {
        r = client.start() => r.map_err(|e| match e {
            // A wrong or revoked token: restarting cannot help (exit 78).
            serenity::Error::Gateway(serenity::gateway::GatewayError::InvalidAuthentication) => {
                broker::error::ConfigError::invalid(
                    token_key,
                    "Discord refused the token on the gateway (4004 Authentication failed)",
                )
                .into()
            }
            e => Error::platform(true, format!("Discord gateway: {e}")),
        }),
        _ = shutdown.wait() => {
            shards.shutdown_all().await;
            Ok(())
        }
        _ = beats => Ok(()),
    };
    result
}
