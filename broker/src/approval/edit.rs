//! Edit before send: an approver corrects a parked message instead of
//! rejecting it and asking the agent again. An edit is a new question.
//!
//! Invariants:
//! - Only an approver of the requesting bridge edits, and only a message bridge
//!   (a declared action binds its command to a commit, not to text).
//! - The edited message passes the same checks as an agent's entry (it is
//!   parsed as one) and the bridge's `destinations`.
//! - One server-side step ([`super::repo`]'s `EDIT`) replaces the version,
//!   only while the record is pending or approved, in its window, its send not
//!   started, and still at the digest the editor started from: an edit racing
//!   another edit, a decision or the send cannot both win. The step revokes any
//!   decision and counted approvals, keeps the agent's version beside the new
//!   one, and lists the card that was shown as superseded, so an answer to it
//!   is late.
//! - The record's message fields always describe the version that will be
//!   sent. The requester rebuilds that version from the entry and
//!   `edited_message` ([`apply`]) and sends it only if its digest is the
//!   record's.

use serde::{Deserialize, Serialize};

use super::record::{field, Record, State, Status};
use super::repo::{Approvals, EditAnswer};
use crate::audit;
use crate::clock::Clock;
use crate::config::Config;
use crate::entry::Message;
use crate::error::{Error, Result};
use crate::keys;
use crate::store::{Entry, Store};

/// What an edit replaced, kept in the record (`edited_message`, JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EditedMessage {
    pub channel_id: String,
    #[serde(default)]
    pub subject: Option<String>,
    pub content: String,
}

/// The version of `message` (built from the agent's entry) that `record`
/// approves: the agent's, or the last edit's.
pub fn apply(message: Message, record: &Record) -> std::result::Result<Message, String> {
    let Some(json) = &record.edited_message else {
        return Ok(message);
    };
    let edited: EditedMessage = serde_json::from_str(json)
        .map_err(|e| format!("the approval's edited message is unreadable ({e}); not sent"))?;
    Ok(Message {
        channel_id: edited.channel_id,
        subject: edited.subject,
        content: edited.content,
        ..message
    })
}

/// What the approver changes; `None` keeps the field.
#[derive(Debug, Clone, Default)]
pub struct Change {
    pub content: Option<String>,
    pub subject: Option<String>,
    pub channel_id: Option<String>,
    /// The digest of the version the editor started from (a page, an editor
    /// session): another edit since makes this one refused, not lost.
    pub seen: Option<String>,
}

/// An edit that took effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edited {
    pub old_digest: String,
    pub new_digest: String,
    pub revision: u32,
}

/// Edits approval `id` as `editor` (a qualified identity, e.g. `cli:ann`):
/// the new version replaces the old, any decision is revoked, the old card is
/// marked superseded and a new one is written to the notify bridge.
pub async fn edit(
    store: &mut Store,
    config: &Config,
    clock: &Clock,
    id: &str,
    change: &Change,
    editor: &str,
) -> Result<Edited> {
    let refuse = |why: String| Err(Error::refused(why));
    let Some(record) = Approvals::on(store).load(id).await? else {
        return refuse(format!("no approval {id}"));
    };
    let bridge = config.bridge(record.source())?;
    if record.is_gated(config) {
        return refuse(format!(
            "{id} asks to run a declared action: its command is bound to a commit, not to text; reject it and ask the agent instead"
        ));
    }
    // The edit seals what it keeps of the record: only a record the bridge
    // sealed (version, quorum, deadline, escalation steps), so an edit never
    // launders a field written outside the broker. A bridge without a key
    // parked nothing (its outbox makes the key before its first park): a
    // record naming it was written outside the broker.
    let Some(key) = super::IdKey::existing(store, record.source()).await? else {
        return refuse(format!(
            "{id} names bridge `{}`, which has parked nothing; not edited",
            record.source()
        ));
    };
    let sealed = record
        .version_seal
        .as_deref()
        .is_some_and(|s| super::same_secret(&key.seal_version(&record), s));
    // The new cards name the agent the record names: only the one whose
    // stream and entry the id was derived from (the seal does not cover
    // them, and a writer of the record could put a "From:" of its choosing).
    let bound = key.id_for(&record.stream, &record.entry_id) == id
        && keys::outbox_for(record.agent(), record.source()) == record.stream;
    if !sealed || !bound {
        let what = if sealed {
            "agent or stream"
        } else {
            "version seal"
        };
        tracing::error!(
            approval = id,
            "a record changed outside the broker ({what}); not edited"
        );
        return refuse(format!("{id} was changed outside the broker; not edited"));
    }
    if !bridge.approval.allows_at(editor, record.escalated) {
        return refuse(format!(
            "{editor} is not on the approvers list of bridge `{}`: only approvers edit",
            record.source()
        ));
    }
    if change
        .seen
        .as_ref()
        .is_some_and(|s| *s != record.message_sha256)
    {
        return refuse(format!(
            "{id} changed since you started editing (another edit): look at it again"
        ));
    }
    let now = clock.now_secs_f64();
    let state = record.state(now);
    if record.is_settled() || !matches!(state, State::Pending | State::Approved) {
        return refuse(format!("{id} is {}: too late to edit", state.as_str()));
    }
    let Some(entry) = store.entry(&record.stream, &record.entry_id).await? else {
        return refuse(format!("{id}: the entry is gone from its stream"));
    };
    let current = Message::from_entry(&entry, bridge)
        .and_then(|m| apply(m, &record))
        .map_err(Error::refused)?;
    let new = edited(&entry, &current, change, bridge)?;
    let new_digest = new.sha256();
    if new_digest == record.message_sha256 {
        return refuse(format!("{id}: the edit changes nothing"));
    }

    // The record as the edit leaves it, to render the new card from.
    let revision = record.revision + 1;
    let saved = EditedMessage {
        channel_id: new.channel_id.clone(),
        subject: new.subject.clone(),
        content: new.content.clone(),
    };
    let editor_counts_as = config.counting_key(editor);
    let mut next = Record {
        status: super::Status::Pending,
        channel_id: new.channel_id.clone(),
        subject: new.subject.clone(),
        // The entry's, as the send takes it: the record's copy is any
        // surface's to write, and the new cards show this one.
        reply_to: new.reply_to.clone(),
        content_preview: super::preview(&new.content),
        content_sha256: record
            .content_sha256
            .as_ref()
            .map(|_| super::sha256_hex(new.content.as_bytes())),
        content_bytes: new.content.len() as u64,
        message_sha256: new_digest.clone(),
        revision,
        edited_message: Some(
            serde_json::to_string(&saved).map_err(|e| Error::internal(e.to_string()))?,
        ),
        edited_by: Some(editor.to_string()),
        edited_at: Some(now as u64),
        // As the step appends it (sealed with the version, so it cannot be shortened).
        editors: match record.editors.is_empty() {
            true => editor_counts_as.clone(),
            false => format!("{}\n{editor_counts_as}", record.editors),
        },
        approvals: Vec::new(),
        approval_people: String::new(),
        approval_proofs: String::new(),
        count_seal: None,
        decision_seal: None,
        approver: None,
        reason: None,
        decided_at: None,
        notified: None,
        notify_entry: None,
        notify_external_id: None,
        // A new reply token: the new card is a new message (an email's
        // Message-ID is built from it), and answers to the old one stay late.
        nonce: uuid::Uuid::new_v4().simple().to_string(),
        // As the step keeps them: the agent's version, from the first edit.
        original_sha256: record
            .original_sha256
            .clone()
            .or(Some(record.message_sha256.clone())),
        original_channel_id: record
            .original_channel_id
            .clone()
            .or(Some(record.channel_id.clone())),
        original_subject: record.original_subject.clone().or(record.subject.clone()),
        original_preview: record
            .original_preview
            .clone()
            .or(Some(record.content_preview.clone())),
        ..record.clone()
    };
    // One new notification per surface the approval is asked on, each bound
    // by its digest before it exists.
    for card in &mut next.also {
        card.notified = None;
        card.entry = None;
        card.external_id = None;
    }
    let shown = new.for_approvers();
    let mut notifications = Vec::new();
    for card in super::cards_asked(config, &next) {
        let fields = super::notification_fields(&next, &card.channel, &shown);
        let digest = super::notification_digest(&fields);
        notifications.push((card, fields, digest));
    }
    for (card, _, digest) in &notifications {
        next.bind_card(card, digest.clone());
    }
    let mut pairs: Vec<(&str, String)> = vec![
        (field::STATUS, next.status.as_str().to_string()),
        (field::CHANNEL_ID, next.channel_id.clone()),
        (field::CONTENT_PREVIEW, next.content_preview.clone()),
        (field::CONTENT_BYTES, next.content_bytes.to_string()),
        (field::MESSAGE_SHA256, new_digest.clone()),
        (
            field::EDITED_MESSAGE,
            next.edited_message.clone().unwrap_or_default(),
        ),
        (field::EDITED_BY, editor.to_string()),
        (field::EDITED_AT, (now as u64).to_string()),
        (field::REVISION, revision.to_string()),
        (field::NONCE, next.nonce.clone()),
    ];
    if let Some(subject) = &next.subject {
        pairs.push((field::SUBJECT, subject.clone()));
    }
    if let Some(reply_to) = &next.reply_to {
        pairs.push((field::REPLY_TO, reply_to.clone()));
    }
    if let Some(digest) = &next.content_sha256 {
        pairs.push((field::CONTENT_SHA256, digest.clone()));
    }
    // The new version is sealed like a parked one (only the asking bridge's
    // services and the administrator hold the key).
    pairs.push((field::VERSION_SEAL, key.seal_version(&next)));
    let mut pairs: Vec<(String, String)> =
        pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    for (card, _, digest) in &notifications {
        pairs.push((card.field(field::NOTIFY_SHA256), digest.clone()));
    }
    // Announced first, as a decision is (see `approval::apply`): an editor
    // that dies before writing the new cards still has the requester read
    // the record, find them unwritten and write them.
    super::wake(
        store,
        record.source(),
        &record.worker,
        id,
        super::Wake::Changed,
    )
    .await?;
    let answer = Approvals::on(store)
        .edit(
            id,
            &record.message_sha256,
            now,
            &editor_counts_as,
            (
                record.expires_at,
                record.escalated,
                record.version_seal.as_deref().unwrap_or(""),
            ),
            &pairs,
        )
        .await?;
    let old_cards = match answer {
        EditAnswer::Edited { superseded_cards } => superseded_cards,
        refused => {
            let why = match refused {
                EditAnswer::Changed => "it changed meanwhile (another edit); show it again",
                EditAnswer::Sending => "its send has started",
                EditAnswer::Missing => "it is missing",
                EditAnswer::Settled => "it is settled",
                EditAnswer::Expired => "it is expired",
                EditAnswer::Closed(Status::Approved) => "it is approved",
                _ => "it is rejected",
            };
            return refuse(format!("{id} was not edited: {why}"));
        }
    };

    // Answers to the old cards are late now; disarm them and tell their surfaces.
    for (bridge, old_card) in &old_cards {
        if notifications.iter().any(|(c, _, _)| c.bridge == *bridge) {
            Approvals::on(store).map_delete(bridge, old_card).await?;
        }
    }
    for (card, notification, _) in &notifications {
        let notify = keys::outbox(&card.bridge);
        let fields: Vec<(&str, &[u8])> = notification
            .iter()
            .map(|(k, v)| (*k, v.as_slice()))
            .collect();
        // The edit is made: a surface that cannot take its new card now
        // does not make it read as failed, nor hold up the other surfaces;
        // the requester's sweep writes the card (the record is pending, this
        // card unnotified, its digest bound).
        let asked = async {
            let written = store.xadd(&notify, &fields).await?;
            Approvals::on(store)
                .mark_notified(id, card, &written)
                .await?;
            if old_cards.iter().any(|(b, _)| *b == card.bridge) {
                let superseded: Vec<(&str, &[u8])> = vec![
                    (crate::fields::outbox::APPROVAL_ID, id.as_bytes()),
                    (crate::fields::outbox::APPROVAL_OUTCOME, b"superseded"),
                ];
                store.xadd(&notify, &superseded).await?;
            }
            Ok::<(), Error>(())
        };
        if let Err(e) = asked.await {
            tracing::warn!(approval = id, surface = %card.bridge, error = %e, "the edited version's card was not written; the sweep writes it");
        }
    }
    let event = audit::Event::new(record.source(), audit::Kind::Edited, id, now)
        .with(audit::field::BY, editor)
        .with(audit::field::OLD_DIGEST, &record.message_sha256)
        .with(audit::field::DIGEST, &new_digest)
        .with(audit::field::DESTINATION, &new.channel_id)
        .with(audit::field::COUNT, revision.to_string());
    audit::append(store, config, &[event]).await?;
    store.conn.replicated("the edit").await?;
    tracing::info!(
        approval = id,
        editor,
        revision,
        "approval edited; asked again"
    );
    Ok(Edited {
        old_digest: record.message_sha256,
        new_digest,
        revision,
    })
}

/// The new version, validated as if the agent had written it.
fn edited(
    entry: &Entry,
    current: &Message,
    change: &Change,
    bridge: &crate::config::BridgeConfig,
) -> Result<Message> {
    let channel = change.channel_id.as_ref().unwrap_or(&current.channel_id);
    if !bridge.allows_destination(channel) {
        return Err(Error::refused(format!(
            "`{}` is not on the bridge's destinations: the edit is refused",
            super::display_safe(channel)
        )));
    }
    let subject = change.subject.as_ref().or(current.subject.as_ref());
    let content = change.content.as_ref().unwrap_or(&current.content);
    // Parsed as the agent's entry would be: the same limits and checks.
    let mut fields: Vec<(String, Vec<u8>)> = vec![
        ("channel_id".into(), channel.as_bytes().to_vec()),
        ("content".into(), content.as_bytes().to_vec()),
    ];
    for (k, v) in [
        ("subject", subject),
        ("reply_to", current.reply_to.as_ref()),
        ("request_id", current.request_id.as_ref()),
    ] {
        if let Some(v) = v.filter(|v| !v.is_empty()) {
            fields.push((k.into(), v.as_bytes().to_vec()));
        }
    }
    let synthetic = Entry {
        id: entry.id.clone(),
        fields,
    };
    Message::from_entry(&synthetic, bridge)
        .map_err(|e| Error::refused(format!("the edited message is refused: {e}")))
}
