//! What approvers are shown of one approval, whichever surface shows it (the
//! CLI's `approvals show`, the page): built here once, rendered by each.
//!
//! Invariants:
//! - A gated approval (a declared action) is shown as the card the bridge
//!   rendered, never as the agent's fields: the card holds what the approval
//!   binds (the command at a commit), the agent's request does not.
//! - A message is shown as the version that would be sent (an approver's edit
//!   applied), parsed by the same rules the outbox parks with, with whether it
//!   still has the digest the approval binds. An entry that no longer parses,
//!   or no longer exists, is said to be so: it will not be sent.
//! - What a surface says of the message (its destination, subject, reply-to,
//!   size and agent: [`View::header`]) comes from the version shown, not from
//!   the record's copies, which every surface of the approval can write. The
//!   record chooses which entry is read, so its bridge must be the one the
//!   id's tag names and its stream an outbox of that bridge (the shared one or
//!   an agent's); the agent shown is the one whose stream it is.
//! - Not covered here: an edited version is the record's `edited_message`,
//!   and the views hold no key to check the bridge's seal over it. A writer
//!   of the record who rewrites it (with the digest and revision) is shown;
//!   the send verifies the seal and refuses it.

use crate::config::Config;
use crate::entry::Message;
use crate::error::Result;
use crate::keys;
use crate::store::Store;

use super::Record;

/// One live approval as approvers see it.
#[derive(Debug, Clone)]
pub struct View {
    pub record: Record,
    /// Whether the approval asks to run a declared action (see [`Record::gated`]).
    pub gated: bool,
    /// The agent whose outbox the entry is read from (`None`: the bridge's
    /// shared outbox, or a record that names no stream of its bridge).
    pub agent: Option<String>,
    pub shown: Shown,
}

/// What the approval would send or run.
#[derive(Debug, Clone, PartialEq)]
pub enum Shown {
    /// A declared action: the card approvers were shown; `None` when it is no
    /// longer kept (then nothing can show what would run).
    Card(Option<String>),
    /// The version that would be sent, and whether its digest is the one the
    /// approval binds (if not, it will not be sent).
    Message { message: Message, matches: bool },
    /// The entry no longer reads as a message (why): it will not be sent.
    Unreadable(String),
    /// The entry is no longer in its stream: it will not be sent.
    Gone,
}

impl View {
    /// Reads what `record` would send or run.
    pub async fn load(store: &mut Store, config: &Config, record: Record) -> Result<View> {
        let gated = record.is_gated(config);
        let agent = match origin(&record) {
            Ok(agent) => agent,
            Err(why) => {
                return Ok(View {
                    record,
                    gated,
                    agent: None,
                    shown: Shown::Unreadable(why),
                })
            }
        };
        let entry = store.entry(&record.stream, &record.entry_id).await?;
        let shown = match entry {
            None => Shown::Gone,
            Some(_) if gated => Shown::Card(super::shown_card(store, config, &record).await?),
            Some(mut entry) => {
                // A re-send's marks are the broker's, not the message's (the
                // outbox verifies their seal before it sends; the digest
                // below still decides whether this is what was approved).
                entry
                    .fields
                    .retain(|(k, _)| k != super::RESEND_OF && k != super::RESEND_SEAL);
                let read = match config.bridges.get(record.source()) {
                    Some(bridge) => Message::from_entry(&entry, bridge),
                    None => Err(format!(
                        "bridge `{}` is no longer configured",
                        record.source()
                    )),
                };
                match read.and_then(|m| super::edit::apply(m, &record)) {
                    Ok(message) => Shown::Message {
                        matches: message.sha256() == record.message_sha256,
                        message,
                    },
                    Err(why) => Shown::Unreadable(why),
                }
            }
        };
        Ok(View {
            record,
            gated,
            agent,
            shown,
        })
    }

    /// The record as a header of what is shown says it: destination,
    /// subject, reply-to and size of the version shown, the agent whose
    /// stream it was read from, and who edited only for an edited version
    /// ([`Record::forget_edit_unless_edited`]); everything else (deadline,
    /// quorum, the digest bound) the record's. Of an entry that will not be
    /// sent (gone, unreadable), the record's values, as the record says them.
    pub fn header(&self) -> Record {
        let mut r = self.record.clone();
        match &self.shown {
            Shown::Message { message, .. } => {
                r.channel_id = message.channel_id.clone();
                r.subject = message.subject.clone();
                r.reply_to = message.reply_to.clone();
                r.content_bytes = message.content.len() as u64;
                r.agent = self.agent.clone();
            }
            Shown::Card(_) => r.agent = self.agent.clone(),
            Shown::Unreadable(_) | Shown::Gone => {}
        }
        r.forget_edit_unless_edited();
        r
    }

    /// Whether what is shown is what the approval binds.
    pub fn matches(&self) -> bool {
        match &self.shown {
            Shown::Card(card) => card.is_some(),
            Shown::Message { matches, .. } => *matches,
            Shown::Unreadable(_) | Shown::Gone => false,
        }
    }
}

/// The agent whose outbox `record` names (`None`: the shared one), or why the
/// record names no entry of its bridge: its bridge is not the one its id's
/// tag names, or its stream is no outbox of that bridge. Read from the
/// stream's name, not the config (a page started before an agent was added
/// still shows that agent's messages).
pub(super) fn origin(record: &Record) -> std::result::Result<Option<String>, String> {
    let source = record.source();
    if !super::is_id_of(&record.id, source) {
        return Err(format!(
            "the record names bridge `{source}`, which is not the one its id is of"
        ));
    }
    keys::outbox_owner(&record.stream, source)
        .map(|agent| agent.map(str::to_string))
        .ok_or_else(|| {
            format!(
                "the record names stream `{}`, which is no outbox of bridge `{source}`",
                record.stream
            )
        })
}
