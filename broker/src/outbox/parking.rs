//! Parking: the approval record, its one notification, and the in-memory index
//! of parked entries and their deadlines, with the sweep that repairs it.
//!
//! Invariants:
//! - Parking is three idempotent steps, each safe to repeat after a crash: create
//!   the record if absent (it holds the digest of the one notification it will
//!   write); write that notification unless the record says it was written (after
//!   a crash in between, the notify outbox is searched for it by id, fields and
//!   digest first, and it is written again if it vanished unshown); remember its
//!   id in the record. No step spans two keys, so the protocol works unchanged
//!   on Redis Cluster.
//! - A notification's shown values (destination, subject, reply_to, size,
//!   digest, agent) come from the message this service read itself
//!   ([`OutboxService::framed`]), never from the record, which every surface
//!   of the approval can write.
//! - At recovery a record is read in part ([`OutboxService::recovery_fields`]);
//!   one that needs nothing but tracking is tracked from that part, any other
//!   is read whole, and so is one a wake-up named while recovery had not
//!   reached it (its part may have been read before the change; see
//!   `recovery`). A part is never written back, drawn or sealed.
//! - Approval ids are keyed ([`IdKey`]): stable across restarts, not computable
//!   by an agent.
//! - A parked entry that vanished from its stream (trimmed or deleted) is settled
//!   as failed, at start-up and in the sweep: notice, record closed, card updated.
//! - The sweep (every 30 s) re-reads the parked records that may have changed
//!   unseen (watched, see [`super::parked`]) and a blind slice of two, in one
//!   pipelined round trip, to catch a decision whose wake-up was lost or a card
//!   lost unshown, and the head of each stream to find parked entries trimmed
//!   away; with every card shown its cost does not grow with the number parked.

use super::*;
use crate::approval::Card;

/// A notification entry's fields, as written.
type Notification = Vec<(&'static str, Vec<u8>)>;

impl<S: Sender> OutboxService<S> {
    pub(super) fn approval_id(&self, stream: &str, entry_id: &str) -> Result<String> {
        let key = self.id_key.as_ref().ok_or_else(|| {
            Error::internal("the approval id key is not loaded (prepare was not called)")
        })?;
        Ok(key.id_for(stream, entry_id))
    }

    /// A pending entry whose body is gone from its stream (trimmed by its writer's
    /// `MAXLEN`, or deleted). If it was parked, its approval is settled as failed.
    pub(super) async fn vanished(&mut self, src: SourceId, entry_id: &str) -> Result<()> {
        let source = self.sources[src].clone();
        if self
            .mem
            .sched
            .is_scheduled(&delivery_key(&source.key, entry_id))
        {
            // Its send is under way (it read the entry before it vanished),
            // queued, or waiting for a retry, which reads it again.
            return Ok(());
        }
        if self.bridge.approval.required && source.kind != Kind::Decisions {
            let id = self.approval_id(&source.key, entry_id)?;
            if let Some(record) = Approvals::on(&mut self.store).load(&id).await? {
                tracing::warn!(approval = %id, stream = %source.key, entry = entry_id, "parked entry vanished from its stream; settled as failed");
                if record.is_settled() {
                    return self.finish(src, entry_id, &record, None).await;
                }
                let n = Notice::new(NoticeStatus::Failed, "the parked entry vanished from its stream (trimmed or deleted) before it could be sent; nothing was sent")
                    .approval(&id)
                    .request(record.request_id.as_deref());
                self.notice(src, entry_id, None, n).await?;
                return self.finish(src, entry_id, &record, Some("failed")).await;
            }
            self.mem.parked.untrack(&id);
        }
        tracing::warn!(stream = %source.key, entry = entry_id, "pending entry no longer exists; acked");
        self.ack(&source.key, entry_id).await
    }

    /// A `parked` notice, when the agent asked for progress (`notices =
    /// all`): written once its card is asked for (again after a lost card,
    /// which the agent may hear twice; it says the same).
    async fn tell_parked(
        &mut self,
        src: SourceId,
        entry: &Entry,
        message: &Message,
        record: &Record,
    ) -> Result<()> {
        let told = self.parked_notice(src, entry, message, record);
        self.notices(told.into_iter().collect()).await
    }

    /// The `parked` notice, when the agent asked for progress.
    fn parked_notice(
        &self,
        src: SourceId,
        entry: &Entry,
        message: &Message,
        record: &Record,
    ) -> Option<super::deliver::Told> {
        if !message.progress {
            return None;
        }
        let n = Notice::parked(record, None);
        Some(self.notice_entry(src, &entry.id, Some(entry), n))
    }

    pub(super) async fn park(
        &mut self,
        src: SourceId,
        entry: &Entry,
        message: &Message,
        id: String,
        deliveries: u64,
    ) -> Result<()> {
        let source = self.sources[src].clone();
        let retry = deliveries > 1;
        // Recovery reads what a page's records need to be tracked again and
        // indexes them (see `recovery`): a quiet one is tracked at once; any
        // other is read whole, as is every record outside recovery, and one
        // a wake-up named while its page was read ahead (what was read may
        // be older than the change).
        let early = self
            .mem
            .recovering
            .as_ref()
            .and_then(|r| r.woken.get(&id).copied());
        let (loaded, indexed) = match self.mem.prefetched.remove(&id) {
            Some(Some(few)) if early.is_none() && self.quiet(&few) => {
                self.track_parked(src, &entry.id, &few);
                return Ok(());
            }
            Some(few) => {
                let whole = match few {
                    Some(_) => Approvals::on(&mut self.store).load(&id).await?,
                    None => None,
                };
                let had = whole.is_some();
                (whole, had)
            }
            None => (Approvals::on(&mut self.store).load(&id).await?, false),
        };
        let (record, resumed, indexed) = match loaded {
            // Approved, its send started, and handed out too often since: the send
            // itself kills workers. Set aside rather than tried forever.
            Some(r)
                if self.is_poison(deliveries)
                    && r.delivery_started.is_some()
                    && !r.is_settled() =>
            {
                return self.poison(src, entry, deliveries, Some(&r)).await;
            }
            Some(r) => (r, true, indexed),
            // Parked entries wait through restarts; only one that never got as far
            // as a record counts its deliveries.
            None if self.is_poison(deliveries) => {
                return self.poison(src, entry, deliveries, None).await;
            }
            None => {
                let new = NewPark {
                    source: src,
                    entry: entry.clone(),
                    message: message.clone(),
                    id: id.clone(),
                };
                if self.admit(vec![new]).await?.is_empty() {
                    return Ok(());
                }
                let (record, _) = self.new_record(&id, &source, entry, message);
                // Created and indexed in one round trip.
                let created = Approvals::on(&mut self.store)
                    .create_many(std::slice::from_ref(&record))
                    .await?;
                if created[0] {
                    self.audit(&[self.parked_event(&record)]).await?;
                }
                tracing::info!(approval = %id, stream = %source.key, entry = %entry.id, "entry parked for approval");
                (record, !created[0] || retry, created[0])
            }
        };
        if record.is_settled() {
            // Crashed between settling and acking: only the ack and delete remain.
            return self.finish(src, &entry.id, &record, None).await;
        }
        // An approver's edit is the version approvers are asked about.
        let edited = approval::edit::apply(message.clone(), &record);
        let message = edited.as_ref().unwrap_or(message);
        // In the pending index (again, after a crash between the two steps).
        if !indexed {
            Approvals::on(&mut self.store).index(&[&record]).await?;
        }
        let todo = self.cards_to_notify(&record, resumed).await?;
        if !todo.is_empty() {
            // A card must never show a record a failover can lose.
            self.store.conn.replicated("the approval record").await?;
            // Told before the card is marked asked (see `park_batch`).
            self.tell_parked(src, entry, message, &record).await?;
            if let Err(why) = self.notify(src, &record, &todo, message).await? {
                let reason =
                    format!("the notify bridge's outbox refused the notification: {why}; not sent");
                let n = Notice::new(NoticeStatus::Failed, &reason)
                    .approval(&id)
                    .request(message.request_id.as_deref());
                tracing::warn!(approval = %id, reason, "approval cannot be asked");
                self.notice(src, &entry.id, Some(entry), n).await?;
                self.audit_failed(&id, &reason, None).await?;
                return self.finish(src, &entry.id, &record, Some("failed")).await;
            }
        }
        self.track_parked(src, &entry.id, &record);
        if early == Some(true) {
            // The announced change may land after the read above.
            self.mem.parked.announce(&id);
        }
        if record.state(self.clock.now_secs_f64()) != State::Pending {
            self.settle(id).await?;
        }
        Ok(())
    }

    /// Parks the fresh entries of a batch in three pipelined round trips: records
    /// and index entries; notifications; their ids in the records. The same steps
    /// as [`Self::park`], each for the whole batch, so a crash between two of them
    /// is repaired as for one entry. Anything unusual (a record that already
    /// exists, a refusing notify stream) falls back to [`Self::park`] for that entry.
    pub(super) async fn park_batch(&mut self) -> Result<()> {
        let batch = std::mem::take(&mut self.mem.to_park);
        if batch.is_empty() {
            return Ok(());
        }
        let batch = self.admit(batch).await?;
        if batch.is_empty() {
            return Ok(());
        }
        let (records, notes): (Vec<Record>, Vec<_>) = batch
            .iter()
            .map(|p| self.new_record(&p.id, &self.sources[p.source], &p.entry, &p.message))
            .unzip();
        let created = Approvals::on(&mut self.store).create_many(&records).await?;
        let mut fresh = Vec::with_capacity(batch.len());
        for (((p, record), fields), created) in
            batch.into_iter().zip(records).zip(notes).zip(created)
        {
            if created {
                fresh.push((p, record, fields));
            } else {
                // Its record exists already: the careful path.
                self.park(p.source, &p.entry, &p.message, p.id, 2).await?;
            }
        }
        if fresh.is_empty() {
            return Ok(());
        }
        let parked: Vec<audit::Event> =
            fresh.iter().map(|(_, r, _)| self.parked_event(r)).collect();
        self.audit(&parked).await?;
        // Cards must never show records a failover can lose; if replicas do
        // not confirm them, each entry is parked again by the careful path.
        self.store.conn.replicated("approval records").await?;
        let mut pipe = redis::pipe();
        for (_, _, notes) in &fresh {
            for (card, fields) in notes {
                let mut cmd = redis::cmd("XADD");
                cmd.arg(keys::outbox(&card.bridge)).arg("*");
                for (k, v) in fields {
                    cmd.arg(*k).arg(v.as_slice());
                }
                pipe.add_command(cmd);
            }
        }
        let notified: Vec<String> = match pipe.query_async(&mut self.store.conn).await {
            Ok(ids) => ids,
            Err(e) if refused_by_stream(&e) => {
                // Some may be written: the careful path searches before writing.
                for (p, _, _) in fresh {
                    self.park(p.source, &p.entry, &p.message, p.id, 2).await?;
                }
                return Ok(());
            }
            Err(e) => return Err(Error::from_redis("XADD notifications", e)),
        };
        let marks: Vec<(&str, &Card, &str)> = fresh
            .iter()
            .flat_map(|(_, record, notes)| notes.iter().map(move |(card, _)| (record, card)))
            .zip(&notified)
            .map(|((record, card), entry_id)| (record.id.as_str(), card, entry_id.as_str()))
            .collect();
        // Told before the cards are marked: a crash between the two asks again
        // (and tells again) rather than never telling.
        let told: Vec<_> = fresh
            .iter()
            .filter_map(|(p, record, _)| self.parked_notice(p.source, &p.entry, &p.message, record))
            .collect();
        self.notices(told).await?;
        Approvals::on(&mut self.store)
            .mark_notified_many(&marks)
            .await?;
        for (p, record, _) in fresh {
            tracing::info!(approval = %p.id, stream = %self.sources[p.source].key, entry = %p.entry.id, "entry parked for approval");
            let watch = self.watch_bits(&record);
            self.mem
                .parked
                .track(p.id, p.source, p.entry.id, record.expires_at, watch);
            self.arm_reminder(&record);
            self.arm_escalation(&record);
        }
        Ok(())
    }

    /// Keeps the fresh entries the bridge's limits allow (`approval.max_parked`,
    /// `approval.max_parked_per_agent`, `approval.max_parked_bytes_per_agent`,
    /// content bytes as the agent sent them), in stream order, and refuses the rest
    /// with a dead letter and a `limit_reached` notice: one agent's flood
    /// waits in its own queue, never in Redis or ahead of the others. Counted
    /// from the pending indexes (an agent's at its limit is pruned of records
    /// gone first); workers side by side may overshoot by a batch each.
    async fn admit(&mut self, batch: Vec<NewPark>) -> Result<Vec<NewPark>> {
        let (bridge_limit, agent_limit, bytes_limit) = (
            self.bridge.approval.max_parked as usize,
            self.bridge.approval.max_parked_per_agent as usize,
            self.bridge.approval.max_parked_bytes_per_agent,
        );
        if bridge_limit == 0 && agent_limit == 0 && bytes_limit == 0 {
            return Ok(batch);
        }
        let mut agents: Vec<String> = batch
            .iter()
            .filter_map(|p| self.sources[p.source].agent.clone())
            .collect();
        agents.sort();
        agents.dedup();
        let names: Vec<&str> = agents.iter().map(String::as_str).collect();
        let (mut all, counts) = Approvals::on(&mut self.store)
            .parked_counts(&self.name, &names)
            .await?;
        let sizes = match bytes_limit {
            0 => vec![0; names.len()],
            _ => {
                Approvals::on(&mut self.store)
                    .parked_bytes(&self.name, &names)
                    .await?
            }
        };
        let mut per: HashMap<String, (usize, u64)> = agents
            .into_iter()
            .zip(counts.into_iter().zip(sizes))
            .collect();
        // The largest entry of the batch: an agent whose waiting bytes plus it
        // would pass the limit is pruned first, as one at its count limit is.
        let largest = batch
            .iter()
            .map(|p| p.message.content.len() as u64)
            .max()
            .unwrap_or(0);
        for (agent, (n, bytes)) in per.iter_mut() {
            let full = (agent_limit > 0 && *n >= agent_limit)
                || (bytes_limit > 0 && *bytes + largest > bytes_limit);
            if full {
                *n = Approvals::on(&mut self.store)
                    .prune_agent(&self.name, agent)
                    .await?;
                if bytes_limit > 0 {
                    *bytes = Approvals::on(&mut self.store)
                        .parked_bytes(&self.name, &[agent])
                        .await?
                        .pop()
                        .unwrap_or(0);
                }
            }
        }
        let mut kept = Vec::with_capacity(batch.len());
        for p in batch {
            let agent = self.sources[p.source].agent.clone();
            let (mine, mine_bytes) = agent
                .as_ref()
                .and_then(|a| per.get(a).copied())
                .unwrap_or((0, 0));
            let size = p.message.content.len() as u64;
            let why = if agent_limit > 0 && agent.is_some() && mine >= agent_limit {
                Some(format!(
                    "limit reached: {mine} approvals of this agent are waiting on bridge `{}` (approval.max_parked_per_agent = {agent_limit}); not parked, send it again once some are decided",
                    self.name
                ))
            } else if bytes_limit > 0 && agent.is_some() && mine_bytes + size > bytes_limit {
                Some(format!(
                    "limit reached: this agent's approvals waiting on bridge `{}` hold {mine_bytes} bytes, and this message's {size} would pass approval.max_parked_bytes_per_agent = {bytes_limit}; not parked, send it again once some are decided",
                    self.name
                ))
            } else if bridge_limit > 0 && all >= bridge_limit {
                Some(format!(
                    "limit reached: {all} approvals are waiting on bridge `{}` (approval.max_parked = {bridge_limit}); not parked, send it again once some are decided",
                    self.name
                ))
            } else {
                None
            };
            match why {
                Some(reason) => {
                    let n = Notice::new(NoticeStatus::LimitReached, reason)
                        .request(p.message.request_id.as_deref());
                    self.dead_letter(p.source, &p.entry, n).await?;
                }
                None => {
                    all += 1;
                    if let Some(a) = &agent {
                        let (n, bytes) = per.entry(a.clone()).or_default();
                        *n += 1;
                        *bytes += size;
                    }
                    kept.push(p);
                }
            }
        }
        Ok(kept)
    }

    /// Tracks a parked entry (its deadline, what its cards need watched)
    /// and arms its reminder and escalation.
    fn track_parked(&mut self, src: SourceId, entry_id: &str, record: &Record) {
        let watch = self.watch_bits(record);
        self.mem.parked.track(
            record.id.clone(),
            src,
            entry_id.to_string(),
            record.expires_at,
            watch,
        );
        self.arm_reminder(record);
        self.arm_escalation(record);
    }

    /// Whether a record read at recovery needs nothing but tracking: pending
    /// and undecided, no send begun, and every card it asks for shown or
    /// refused by its platform (so none is to be written or repaired).
    /// Decided on [`Self::recovery_fields`] alone.
    fn quiet(&self, record: &Record) -> bool {
        !record.is_settled()
            && record.delivery_started.is_none()
            && record.state(self.clock.now_secs_f64()) == State::Pending
            && approval::cards_asked(&self.config, record)
                .iter()
                .all(|c| c.unshown || (c.notified.is_some() && c.external_id.is_some()))
    }

    /// The record fields recovery reads: what [`Self::quiet`], the pending
    /// index and [`Self::track_parked`] use, for the card of every surface
    /// this bridge asks on. A fifth of a record's bytes: recovery reads a
    /// hundred thousand of them, and parsing whole records was half its CPU.
    pub(super) fn recovery_fields(&self) -> Vec<String> {
        use approval::field::*;
        let mut fields: Vec<String> = [
            STATUS,
            SOURCE,
            AGENT,
            CONTENT_BYTES,
            CREATED_AT,
            EXPIRES_AT,
            SETTLED_AT,
            DELIVERY_STARTED,
            ESCALATED,
            REMINDED,
            ALSO,
        ]
        .map(String::from)
        .to_vec();
        let primary = self.config.notify_bridge(&self.name);
        let mut prefixes = vec![String::new()];
        for (surface, _) in self.config.surfaces_of(&self.name) {
            let prefix = format!("{surface}.");
            if surface != primary && !prefixes.contains(&prefix) {
                prefixes.push(prefix);
            }
        }
        for prefix in &prefixes {
            for name in [NOTIFY, NOTIFIED, NOTIFY_ENTRY, NOTIFY_EXTERNAL_ID, UNSHOWN] {
                fields.push(card_field(prefix, name));
            }
        }
        fields
    }

    pub(super) fn new_record(
        &self,
        id: &str,
        source: &Source,
        entry: &Entry,
        message: &Message,
    ) -> (Record, Vec<(Card, Notification)>) {
        let now = self.clock.now_secs();
        let timeout = self.bridge.approval.timeout;
        let parked = Record {
            id: id.to_string(),
            status: Status::Pending,
            content_preview: approval::preview(&message.content),
            request_id: message.request_id.clone(),
            created_at: now,
            expires_at: if timeout == 0 { 0 } else { now + timeout },
            stream: source.key.clone(),
            entry_id: entry.id.clone(),
            notify: self.config.notify_bridge(&self.name).to_string(),
            notify_channel: self.bridge.approval.notify_channel.clone(),
            // Every other surface asked at the same time, each its own card
            // (an escalation step adds its own when it is taken).
            also: self
                .bridge
                .approval
                .also
                .iter()
                .map(|s| Card {
                    bridge: s.notify.clone(),
                    channel: s.notify_channel.clone(),
                    ..Card::default()
                })
                .collect(),
            quorum: self.bridge.approval.quorum,
            gated: Some(registry::is_gated(&self.bridge.kind)),
            progress: message.progress,
            // Whose wake-up stream a decision goes to (changed when another worker takes over).
            worker: self.worker.clone(),
            // Unguessable and single-use: notify bridges build reply tokens from it
            // (an email's Message-ID), so knowing the approval id is not enough to answer.
            nonce: uuid::Uuid::new_v4().simple().to_string(),
            ..Record::default()
        };
        let mut record = self.with_shown_values(parked, source.agent.clone(), message);
        // Written with the record, before the notification exists: each notify
        // side shows only the entry with exactly its card's digest.
        // Each notification is rendered once: its digest goes in the record,
        // and the fields are written as they are.
        let shown = message.for_approvers();
        let notes: Vec<(Card, Notification)> = record
            .cards()
            .into_iter()
            .map(|card| {
                let fields = approval::notification_fields(&record, &card.channel, &shown);
                (card, fields)
            })
            .collect();
        for (card, fields) in &notes {
            record.bind_card(card, approval::notification_digest(fields));
        }
        record.version_seal = self.id_key.as_ref().map(|k| k.seal_version(&record));
        (record, notes)
    }

    /// The cards of `record` whose notification is still to be written, each
    /// with whether an earlier attempt may have written it (then its notify
    /// outbox is searched first): never written, or gone unshown.
    pub(super) async fn cards_to_notify(
        &mut self,
        record: &Record,
        resumed: bool,
    ) -> Result<Vec<(Card, bool)>> {
        let mut todo = Vec::new();
        for card in approval::cards_asked(&self.config, record) {
            // Refused by its platform: not asked again (an edit asks anew).
            if card.unshown {
                continue;
            }
            if card.notified.is_none() {
                todo.push((card, resumed));
            } else if self.notification_lost(record, &card).await? {
                todo.push((card, false));
            }
        }
        Ok(todo)
    }

    /// Writes the notifications of cards `todo` of `record` (see
    /// [`Self::cards_to_notify`]). `Ok(Err(why))`: every notify stream asked
    /// refused its entry (a writer of that flat stream gave it an id no later
    /// entry can follow) and no card was written before, so this approval
    /// cannot be asked. A surface that refuses while another asks does not
    /// hold the others up: it is logged, and the approval is asked elsewhere.
    pub(super) async fn notify(
        &mut self,
        src: SourceId,
        record: &Record,
        todo: &[(Card, bool)],
        message: &Message,
    ) -> Result<std::result::Result<(), String>> {
        let shown = message.for_approvers();
        let Some(framed) = self.framed(record, src, message) else {
            return Ok(Err(format!(
                "the record of approval `{}` does not bind the message its entry holds (its digest was changed); no card is written from it",
                record.id
            )));
        };
        let mut refused = Vec::new();
        for (card, resumed) in todo {
            if let Err(why) = self.notify_card(&framed, card, &shown, *resumed).await? {
                tracing::warn!(approval = %record.id, surface = %card.bridge, why, "a surface refused its card");
                refused.push(why);
            }
        }
        let cards = approval::cards_asked(&self.config, record);
        let asked_before = cards.iter().any(|c| c.notified.is_some());
        match refused.len() == cards.len() && !asked_before {
            true => Ok(Err(refused.join("; "))),
            false => Ok(Ok(())),
        }
    }

    /// `record` with the values its cards show taken from what this service
    /// read itself: the message (the agent's entry, as an edit changed it)
    /// and its stream's agent, as [`Self::new_record`] takes them; never the
    /// record's copies, which every surface of the approval can write (Redis
    /// ACLs do not reach inside a hash), so a card written again, or an
    /// escalation step's, says what the first one said.
    /// `None` for a message that is not the one the record binds (a writer
    /// of the record changed its digest; the send refuses it anyway): no
    /// card is drawn from that record, whose other values may have been
    /// changed with it, and nothing is bound or sealed over another digest.
    pub(super) fn framed(
        &self,
        record: &Record,
        src: SourceId,
        message: &Message,
    ) -> Option<Record> {
        if message.sha256() != record.message_sha256 {
            return None;
        }
        let mut framed =
            self.with_shown_values(record.clone(), self.sources[src].agent.clone(), message);
        framed.forget_edit_unless_edited();
        Some(framed)
    }

    /// `record` with what its cards show of the message and whose it is,
    /// from the message as this service read it: the one place this service
    /// sets them, at parking and when a card is written again (an approver's
    /// edit sets its own, `approval::edit`).
    fn with_shown_values(
        &self,
        record: Record,
        agent: Option<String>,
        message: &Message,
    ) -> Record {
        Record {
            source: self.name.clone(),
            agent,
            channel_id: message.channel_id.clone(),
            subject: message.subject.clone(),
            reply_to: message.reply_to.clone(),
            content_bytes: message.content.len() as u64,
            message_sha256: message.sha256(),
            ..record
        }
    }

    /// Writes card `card`'s notification once. When a previous attempt may
    /// have written it (`resumed`), its notify outbox is searched first.
    pub(super) async fn notify_card(
        &mut self,
        record: &Record,
        card: &Card,
        shown: &str,
        resumed: bool,
    ) -> Result<std::result::Result<(), String>> {
        let stream = keys::outbox(&card.bridge);
        let fields = approval::notification_fields(record, &card.channel, shown);
        let digest = approval::notification_digest(&fields);
        if digest != card.sha256 {
            // A record parked by an older version: bind the notification now, before it exists.
            Approvals::on(&mut self.store)
                .bind_notification(&record.id, card, &digest)
                .await?;
        }
        if resumed {
            if let Some(found) = self.find_notification(&stream, record, &digest).await? {
                Approvals::on(&mut self.store)
                    .mark_notified(&record.id, card, &found)
                    .await?;
                return Ok(Ok(()));
            }
        }
        let fields: Vec<(&str, &[u8])> = fields.iter().map(|(k, v)| (*k, v.as_slice())).collect();
        let notification = match self.store.xadd(&stream, &fields).await {
            Ok(id) => id,
            Err(Error::Redis(e)) if refused_by_stream(&e) => return Ok(Err(e.to_string())),
            Err(e) => return Err(e),
        };
        Approvals::on(&mut self.store)
            .mark_notified(&record.id, card, &notification)
            .await?;
        Ok(Ok(()))
    }

    /// Whether the notification `card` says was written is gone before its
    /// notify side took it (someone trimmed the flat notify outbox): then it
    /// must be written again, or nobody is asked there.
    pub(super) async fn notification_lost(&mut self, record: &Record, card: &Card) -> Result<bool> {
        if card.external_id.is_some() {
            return Ok(false);
        }
        if let Some(claimed) = &card.entry {
            // Taken by the notify side and not shown yet: lost only if the
            // entry is gone, which then no worker's recovery will show.
            let stream = keys::outbox(&card.bridge);
            if self.store.entry(&stream, claimed).await?.is_some() {
                return Ok(false);
            }
            let forgot = Approvals::on(&mut self.store)
                .forget_claim(&record.id, card, claimed)
                .await?;
            if forgot {
                tracing::warn!(approval = %record.id, stream, "the notification vanished while the notify side held it, unshown; writing it again");
            }
            return Ok(forgot);
        }
        // An edit clears it before writing the new version's notification.
        let Some(notified) = &card.notified else {
            return Ok(true);
        };
        let stream = keys::outbox(&card.bridge);
        let found = self.store.entry(&stream, notified).await?;
        if found.is_none() {
            tracing::warn!(approval = %record.id, stream, "the notification vanished before it was shown; writing it again");
        }
        Ok(found.is_none())
    }

    pub(super) async fn find_notification(
        &mut self,
        stream: &str,
        record: &Record,
        digest: &str,
    ) -> Result<Option<String>> {
        // Stream ids are millisecond timestamps: start a minute before the record
        // was created to allow for clock skew between this host and Redis.
        let mut start = format!("{}", record.created_at.saturating_sub(60) * 1000);
        loop {
            let page = self.store.range(stream, &start, "+", 500).await?;
            for entry in &page {
                if approval::is_notification_of(entry, &record.id, digest) {
                    return Ok(Some(entry.id.clone()));
                }
            }
            match page.last() {
                Some(last) if page.len() == 500 => start = format!("({}", last.id),
                _ => return Ok(None),
            }
        }
    }

    /// Settles every parked entry whose deadline has passed.
    pub(super) async fn settle_due(&mut self) -> Result<()> {
        for id in self.mem.parked.due(self.clock.now_secs_f64()) {
            self.settle(id).await?;
        }
        Ok(())
    }

    /// Re-reads the watched parked records (a slice of [`SWEEP_SLICE`], round
    /// robin) and a blind slice of any ([`BLIND_SLICE`]), in one pipelined
    /// round trip; settles the decided ones (the fallback for a decision
    /// whose wake-up was lost) and writes again a notification trimmed
    /// unshown (see [`parked`] for what is watched). Then settles as failed
    /// every parked entry that vanished from its stream: one `XRANGE - +
    /// COUNT 1` per stream finds its oldest entry, and an agent can only
    /// drop entries from the head (`XADD MAXLEN`).
    pub(super) async fn sweep(&mut self) -> Result<()> {
        if self.mem.parked.is_empty() {
            return Ok(());
        }
        // What an idle outbox costs Redis must not grow with the number
        // parked: what may have changed is read (announced by a wake-up, or
        // a card not known shown), and a blind slice of the rest.
        let mut ids = self.mem.parked.watched_slice(SWEEP_SLICE);
        for id in self.mem.parked.blind_slice(BLIND_SLICE) {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        let surfaces: Vec<&str> = self
            .config
            .surfaces_of(&self.name)
            .into_iter()
            .skip(1)
            .map(|(b, _)| b)
            .collect();
        let states = Approvals::on(&mut self.store)
            .sweep_read(&ids, &surfaces)
            .await?;
        let mut unclaimed = Vec::new();
        for (id, state) in ids.into_iter().zip(states) {
            if state.status != Some(Status::Pending) {
                // Decided: nothing to watch for (its send may wait a while).
                self.mem.parked.unwatch(&id);
                self.settle(id).await?;
                continue;
            }
            self.mem.parked.read_back(&id, state.shown);
            if !state.shown {
                // Unshown: its notification may have been trimmed (before
                // the notify side took it, or while a worker that crashed
                // held it), or an edit may have stopped before writing the
                // new one.
                unclaimed.push(id);
            }
        }
        for id in unclaimed {
            self.renotify_if_lost(&id).await?;
        }
        let mut vanished = Vec::new();
        for src in self.sources.ids() {
            if !self.mem.parked.any_from(src) {
                continue;
            }
            let first = self
                .store
                .range(&self.sources[src].key, "-", "+", 1)
                .await?;
            let oldest = first.first().and_then(|e| stream_id(&e.id));
            let gone = self.mem.parked.entries_before(src, oldest);
            vanished.extend(gone.into_iter().map(|entry_id| (src, entry_id)));
        }
        for (src, entry_id) in vanished {
            self.vanished(src, &entry_id).await?;
        }
        Ok(())
    }

    /// What parked `record` is watched for: the surfaces whose card it asks
    /// for and no read has found shown (see [`parked`]).
    pub(super) fn watch_bits(&self, record: &Record) -> u16 {
        approval::cards_asked(&self.config, record)
            .iter()
            .filter(|c| c.external_id.is_none() && !c.unshown)
            .fold(0, |bits, c| bits | self.surface_bit(&c.bridge))
    }

    /// The watch bit of surface `bridge` ([`RECHECK`] for one this bridge
    /// does not ask on: only a read tells).
    pub(super) fn surface_bit(&self, bridge: &str) -> u16 {
        let surfaces = self.config.surfaces_of(&self.name);
        match surfaces.iter().position(|(b, _)| *b == bridge) {
            Some(place) => parked::surface_bit(place),
            None => RECHECK,
        }
    }

    /// A wake-up on this worker's decisions stream ([`approval::Wake`]): a
    /// decision settles its entry at once; a card shown ends its surface's
    /// watch, unread; an announced change is read at the next two sweeps. The
    /// two without a read are acked with the next batch of acks. A forged
    /// `shown` can only spare a card a repair, never decide anything: the
    /// blind slice still reaches it.
    pub(super) async fn woken(&mut self, src: SourceId, entry: &Entry) -> Result<()> {
        use crate::fields::decisions::{APPROVAL_ID, SHOWN, STATUS};
        let key = self.sources[src].key.clone();
        let named = entry.text(APPROVAL_ID);
        let id = named.filter(|id| self.mem.parked.contains(id));
        let decided = entry.fields.iter().any(|(k, _)| k == STATUS);
        if let (Some(named), None, Some(recovering)) = (named, id, self.mem.recovering.as_mut()) {
            // Recovering, and its entry not reached yet: its record may have
            // been read ahead already (see `recovery`). A decision or a
            // card shown is in the record before its wake-up; an
            // announcement comes before its change.
            let announced = !decided && entry.text(SHOWN).is_none();
            *recovering.woken.entry(named.to_string()).or_default() |= announced;
        }
        match (id, entry.text(SHOWN)) {
            (Some(id), _) if decided => self.settle(id.to_string()).await?,
            (Some(id), Some(surface)) => {
                let bit = self.surface_bit(surface);
                self.mem.parked.shown(id, bit);
            }
            (Some(id), None) => self.mem.parked.announce(id),
            (None, _) => {}
        }
        if decided {
            return self.ack(&key, &entry.id).await;
        }
        self.mem.acks.push((key, entry.id.clone(), String::new()));
        self.mem.acks_since.get_or_insert_with(Instant::now);
        Ok(())
    }

    /// Writes a parked record's notification again if it vanished unshown.
    pub(super) async fn renotify_if_lost(&mut self, id: &str) -> Result<()> {
        let Some(parked) = self.mem.parked.get(id).cloned() else {
            return Ok(());
        };
        let Some(record) = Approvals::on(&mut self.store).load(id).await? else {
            return Ok(());
        };
        let todo = self.cards_to_notify(&record, true).await?;
        if todo.is_empty() {
            return Ok(());
        }
        let key = self.sources[parked.source].key.clone();
        let Some(entry) = self.store.entry(&key, &parked.entry_id.to_string()).await? else {
            return Ok(()); // the vanished-entry check settles it
        };
        let requested = self.requested(&key, &entry).await;
        match requested.and_then(|m| approval::edit::apply(m, &record)) {
            Ok(message) => {
                // Not written yet, or written by an edit that stopped before
                // noting it: searched before writing.
                if let Err(why) = self.notify(parked.source, &record, &todo, &message).await? {
                    tracing::warn!(approval = %id, why, "the notification cannot be written again");
                }
                Ok(())
            }
            Err(_) => Ok(()), // settled as failed when it is approved
        }
    }
}

/// A stream entry id as (milliseconds, sequence), for ordering.
pub(super) fn stream_id(id: &str) -> Option<(u64, u64)> {
    let (ms, seq) = id.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}
