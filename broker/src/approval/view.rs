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

use crate::config::Config;
use crate::entry::Message;
use crate::error::Result;
use crate::store::Store;

use super::Record;

/// One live approval as approvers see it.
#[derive(Debug, Clone)]
pub struct View {
    pub record: Record,
    /// Whether the approval asks to run a declared action (see [`Record::gated`]).
    pub gated: bool,
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
            shown,
        })
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
