//! What every bridge's ingest shares: writing inbound messages to the right inbox,
//! and handing a human's answer to a card to the bridge that asked.
//!
//! Invariants: an answer's approver is always qualified with the bridge type
//! (`discord:1234`), so an id from one platform never approves on another. An
//! ingest never decides: its Redis user cannot write an approval record. It
//! resolves the card in its own map (`approval:{name}_map`), turns away
//! strangers itself, and writes the answer to the requesting bridge's
//! `requests:surface:{name}` stream, which that bridge's outbox applies under
//! the rules every surface follows (see [`crate::request`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::approval::{self, Answer, Approvals, Outcome, Verdict};
use crate::clock::Clock;
use crate::config::Config;
use crate::error::Result;
use crate::keys;
use crate::shutdown::Shutdown;
use crate::store::Store;
use crate::systemd::Watchdog;
use crate::timing::Timing;

/// The ingest side of one bridge.
pub struct Ingest {
    config: Arc<Config>,
    name: String,
    kind: String,
    /// Redis: bridges reach it only through this type (cursor, inbox, answers).
    store: Store,
    /// When answers are given.
    clock: Clock,
    liveness: Liveness,
}

impl Ingest {
    pub fn new(config: Arc<Config>, name: &str, store: Store) -> Result<Ingest> {
        let kind = config.bridge(name)?.kind.clone();
        Ok(Ingest {
            config,
            name: name.to_string(),
            kind,
            store,
            clock: Clock::system(),
            liveness: Liveness::new(Timing::default().heartbeat_every),
        })
    }

    /// Beats at these intervals.
    pub fn with_timing(mut self, timing: Timing) -> Ingest {
        self.liveness.every = timing.heartbeat_every;
        self
    }

    /// Reads time from `clock` instead of the wall clock (tests).
    pub fn with_clock(mut self, clock: Clock) -> Ingest {
        self.clock = clock;
        self
    }

    /// The approval repository over this ingest's connection.
    pub fn approvals(&mut self) -> Approvals<'_> {
        Approvals::on(&mut self.store)
    }

    /// The deployment config.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Where this ingest stopped reading its platform, as the bridge wrote it
    /// with [`Self::save_cursor`]; `None` on a first start.
    pub async fn cursor(&mut self) -> Result<Option<String>> {
        // The position an earlier version saved counts until the first save
        // under the new name (reading from the start would carry all again).
        for key in [
            keys::ingest_cursor(&self.name),
            keys::legacy_ingest_cursor(&self.name),
        ] {
            let at: Option<String> = redis::AsyncCommands::get(&mut self.store.conn, &key)
                .await
                .map_err(|e| crate::Error::from_redis(&format!("GET {key}"), e))?;
            if at.is_some() {
                return Ok(at);
            }
        }
        Ok(None)
    }

    /// Saves where this ingest stopped reading. Call it only once what was
    /// read up to there is written, so a restart carries nothing twice and
    /// skips nothing.
    pub async fn save_cursor(&mut self, at: &str) -> Result<()> {
        let key = keys::ingest_cursor(&self.name);
        redis::AsyncCommands::set(&mut self.store.conn, &key, at)
            .await
            .map_err(|e| crate::Error::from_redis(&format!("SET {key}"), e))
    }

    /// This bridge's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Writes an inbound message to the agent's inbox (the flat inbox when `agent`
    /// is not a configured agent). `kind = message` is added first.
    pub async fn inbound(
        &mut self,
        agent: Option<&str>,
        fields: &[(&str, &[u8])],
    ) -> Result<String> {
        let (stream, all) = self.inbound_entry(agent, fields);
        self.store.xadd(&stream, &all).await
    }

    /// [`Self::inbound`] and [`Self::save_cursor`]`(cursor)` in one
    /// transaction: a crash or a lost connection leaves both written or
    /// neither, so a restart neither carries the message twice nor skips it.
    pub async fn inbound_at(
        &mut self,
        agent: Option<&str>,
        fields: &[(&str, &[u8])],
        cursor: &str,
    ) -> Result<String> {
        let (stream, all) = self.inbound_entry(agent, fields);
        let key = keys::ingest_cursor(&self.name);
        if !self.store.conn.same_slot(&stream, &key) {
            // A cluster with the inbox and the cursor on different slots
            // (no transaction spans them): the entry first, then the cursor,
            // so a crash between carries the message twice, never skips it.
            let id = self.store.xadd(&stream, &all).await?;
            self.save_cursor(cursor).await?;
            return Ok(id);
        }
        let (id,): (String,) = redis::pipe()
            .atomic()
            .xadd(&stream, "*", &all)
            .set(&key, cursor)
            .ignore()
            .query_async(&mut self.store.conn)
            .await
            .map_err(|e| crate::Error::from_redis(&format!("XADD {stream} with SET {key}"), e))?;
        Ok(id)
    }

    /// The inbox an inbound message goes to, and its fields (`kind = message` first).
    fn inbound_entry<'f>(
        &self,
        agent: Option<&str>,
        fields: &[(&'f str, &'f [u8])],
    ) -> (String, Vec<(&'f str, &'f [u8])>) {
        let agent = agent.filter(|a| self.config.agents.contains_key(*a));
        let stream = keys::inbox_for(agent, &self.name);
        let mut all: Vec<(&str, &[u8])> = vec![("kind", b"message")];
        all.extend(fields.iter().filter(|(k, _)| *k != "kind"));
        (stream, all)
    }

    /// Whether this bridge carries some bridge's approval notifications. Only then
    /// may it decide (its Redis user has no rights on approvals otherwise).
    pub fn is_approval_surface(&self) -> bool {
        self.config.is_approval_surface(&self.name)
    }

    /// Whether `identity` may answer `record` here: an approver of its bridge,
    /// or someone a running delegation names (the asking bridge's outbox
    /// checks the delegation's seal and decides). Every surface asks this.
    pub async fn may_answer(
        &mut self,
        record: &crate::approval::Record,
        identity: &str,
    ) -> Result<bool> {
        let approver = self
            .config
            .bridges
            .get(record.source())
            .is_some_and(|b| b.approval.allows_at(identity, record.escalated));
        if approver {
            return Ok(true);
        }
        crate::approval::delegation::may_be_delegate(
            &mut self.store,
            &self.config,
            record.source(),
            identity,
            self.clock.now_secs_f64(),
            record.created_at,
        )
        .await
    }

    /// A human answered the notification this bridge delivered as `external_id`.
    /// `user` is the platform's id of the human, without the type prefix.
    /// `NotAllowed` for someone neither on the approvers list nor named by a
    /// running delegation (audited here),
    /// `Unknown` for no live card, otherwise `Submitted`: the requesting
    /// bridge's outbox applies it.
    pub async fn answer(
        &mut self,
        external_id: &str,
        verdict: Verdict,
        user: &str,
        reason: &str,
    ) -> Result<Outcome> {
        self.answer_seeing(external_id, verdict, user, reason, "")
            .await
    }

    /// [`Self::answer`], bound to the digest the card showed the approver
    /// (a button that carries it): an answer to another version is late.
    /// An empty digest binds to the record's current version.
    pub async fn answer_seeing(
        &mut self,
        external_id: &str,
        verdict: Verdict,
        user: &str,
        reason: &str,
        digest: &str,
    ) -> Result<Outcome> {
        let (id, record, approver) = match self.card_answerable(external_id, user).await? {
            Ok(found) => found,
            Err(outcome) => return Ok(outcome),
        };
        // The version on the card: the card itself binds it too (an edit
        // lists the old card as superseded).
        let shown = match digest {
            "" => record.message_sha256.as_str(),
            d => d,
        };
        let answer = Answer::new(&self.clock, verdict, &approver, reason).seeing(shown);
        let requester = crate::request::Requester::surface(&self.config, &self.name)?;
        crate::request::answer_card(
            &mut self.store,
            &requester,
            record.source(),
            &id,
            external_id,
            &answer,
        )
        .await?;
        tracing::info!(bridge = %self.name, external_id, approver = %approver, "answer to a notification handed to the asking bridge");
        Ok(Outcome::Submitted)
    }

    /// A human asked for "later" on the notification delivered as
    /// `external_id`: the deadline moves by `seconds` (the asking bridge's
    /// `approval.snooze` when `None`), under the rules of
    /// [`crate::approval::snooze`], which the asking bridge's outbox applies.
    /// The same outcomes as [`Self::answer`]; a snooze never decides.
    pub async fn snooze(
        &mut self,
        external_id: &str,
        user: &str,
        seconds: Option<u64>,
        reason: &str,
    ) -> Result<Outcome> {
        let (_, record, who) = match self.card_answerable(external_id, user).await? {
            Ok(found) => found,
            Err(outcome) => return Ok(outcome),
        };
        let requester = crate::request::Requester::surface(&self.config, &self.name)?;
        crate::request::snooze_card(
            &mut self.store,
            &requester,
            &record,
            external_id,
            who.as_str(),
            seconds,
            reason,
        )
        .await?;
        tracing::info!(bridge = %self.name, external_id, by = %who, "snooze of a notification handed to the asking bridge");
        Ok(Outcome::Submitted)
    }

    /// The live card `external_id` of this surface, its record, and who
    /// `user` is; or the outcome for anything else: no card (`Unknown`),
    /// its record gone, or someone who may not answer it (`NotAllowed`,
    /// audited here). A delegate passes when a running delegation names
    /// them; the asking bridge's outbox checks its seal and decides.
    async fn card_answerable(
        &mut self,
        external_id: &str,
        user: &str,
    ) -> Result<std::result::Result<(String, approval::Record, crate::identity::Identity), Outcome>>
    {
        if !self.is_approval_surface() {
            return Ok(Err(Outcome::Unknown));
        }
        let name = self.name.clone();
        let Some(id) = self.approvals().map_get(&name, external_id).await? else {
            return Ok(Err(Outcome::Unknown));
        };
        if !approval::asked_through(&self.config, &self.name, &id) {
            return Ok(Err(Outcome::Unknown));
        }
        let Some(record) = self.approvals().load(&id).await? else {
            return Ok(Err(Outcome::Late(crate::approval::Late::Missing)));
        };
        let who = crate::identity::Identity::on(&self.kind, user);
        if !self.may_answer(&record, &who).await? {
            tracing::warn!(approval = %id, approver = %who, "answer from someone not on approval.approvers ignored");
            self.refused_answer(&id, user, "not an approver").await?;
            return Ok(Err(Outcome::NotAllowed));
        }
        Ok(Ok((id, record, who)))
    }

    /// An answer this bridge refused before the decision rules saw it (its
    /// sender is not an approver, or failed the platform's own checks, such as
    /// DKIM): kept in the trail of the approval's bridge as ignored, with why,
    /// like every other answer that changed nothing. `user` as in [`Self::answer`].
    pub async fn refused_answer(&mut self, approval_id: &str, user: &str, why: &str) -> Result<()> {
        if !self.is_approval_surface() {
            return Ok(());
        }
        let Some(record) = self.approvals().load(approval_id).await? else {
            return Ok(());
        };
        let by = crate::identity::Identity::on(&self.kind, user);
        let event = crate::audit::Event::new(
            record.source(),
            crate::audit::Kind::Ignored,
            approval_id,
            self.clock.now_secs_f64(),
        )
        .with(crate::audit::field::BY, by)
        .with(crate::audit::field::WHY, why);
        crate::audit::append(&mut self.store, &self.config, &[event]).await
    }

    /// Refreshes this bridge's ingest heartbeat.
    pub async fn heartbeat(&mut self) -> Result<()> {
        let name = self.name.clone();
        let ttl = self.liveness.every * 3;
        self.store
            .heartbeat(&name, "ingest", ttl, &self.clock)
            .await
    }

    /// Tells the supervisor this ingest is alive (the watchdog) and refreshes
    /// its heartbeat when one is due. Call it on every turn of the loop.
    pub async fn tick(&mut self) -> Result<()> {
        self.liveness.watchdog.tick();
        if self.liveness.due() {
            self.heartbeat().await?;
            self.liveness.last_beat = Some(tokio::time::Instant::now());
        }
        Ok(())
    }

    /// The longest a loop may wait before its next [`Self::tick`] is due.
    pub fn tick_within(&self) -> Duration {
        self.liveness.within()
    }

    /// Keeps the heartbeat and the watchdog alone until shutdown, over a
    /// connection of its own: for an ingest whose platform client runs its
    /// own loop (Discord), or that has no platform to read. A failed beat is
    /// logged; the next one tries again.
    pub fn keep_alive(&self, shutdown: Shutdown) -> impl Future<Output = ()> + Send + 'static {
        let (mut store, name, clock) = (self.store.clone(), self.name.clone(), self.clock);
        let mut liveness = Liveness::new(self.liveness.every);
        async move {
            loop {
                liveness.watchdog.tick();
                if let Err(e) = store
                    .heartbeat(&name, "ingest", liveness.every * 3, &clock)
                    .await
                {
                    tracing::warn!(error = %e, "heartbeat failed");
                }
                liveness.last_beat = Some(tokio::time::Instant::now());
                if !shutdown.sleep(liveness.within()).await {
                    return;
                }
            }
        }
    }
}

/// The watchdog and the heartbeat of one ingest: the one copy of what every
/// bridge's loop did by hand.
struct Liveness {
    watchdog: Watchdog,
    last_beat: Option<tokio::time::Instant>,
    /// How often the heartbeat is refreshed (its time to live is three times this).
    every: Duration,
}

impl Liveness {
    fn new(every: Duration) -> Liveness {
        Liveness {
            watchdog: Watchdog::from_env(),
            last_beat: None,
            every,
        }
    }

    fn due(&self) -> bool {
        self.last_beat.is_none_or(|t| t.elapsed() >= self.every)
    }

    /// Until the next beat or watchdog ping is due.
    fn within(&self) -> Duration {
        let beat = match self.last_beat {
            Some(t) => self.every.saturating_sub(t.elapsed()),
            None => Duration::ZERO,
        };
        match self.watchdog.interval() {
            Some(w) => beat.min(w),
            None => beat,
        }
    }
}
