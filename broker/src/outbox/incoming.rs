//! What an entry read by the outbox is, decided in one place from the stream
//! it came from and the fields it has.
//!
//! Invariants:
//! - Presence decides, not validity: a card whose `approval_id` is not UTF-8
//!   is still a card (and refused as one), never an agent's message.
//! - Only the flat outbox carries cards, outcomes and digests: an `approval_id` on an
//!   agent's own stream is an agent entry (and refused as a reserved field).
//! - Everything on the wake-up stream is a decision.

use crate::fields::outbox::{APPROVAL_ID, APPROVAL_OUTCOME, DIGEST_OF};

use super::source::Kind;

/// The kinds of entry an outbox worker reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
    /// An agent's message, to deliver or to park.
    Agent,
    /// A card this bridge shows for another bridge's (or its own) approval.
    Notification,
    /// How an approval whose card this bridge showed ended.
    Outcome,
    /// Another bridge's digest of waiting approvals, to carry.
    Digest,
    /// A wake-up: an approval of this worker was decided.
    Decision,
}

impl Class {
    /// The class of an entry of a stream of `kind` with these field names.
    pub fn of<'a>(kind: Kind, names: impl IntoIterator<Item = &'a str>) -> Class {
        match kind {
            Kind::Decisions => Class::Decision,
            Kind::Agent => Class::Agent,
            Kind::Flat => {
                let (mut id, mut outcome, mut digest) = (false, false, false);
                for name in names {
                    id |= name == APPROVAL_ID;
                    outcome |= name == APPROVAL_OUTCOME;
                    digest |= name == DIGEST_OF;
                }
                match (id, outcome, digest) {
                    (_, true, _) => Class::Outcome,
                    (_, false, true) => Class::Digest,
                    (true, false, false) => Class::Notification,
                    (false, false, false) => Class::Agent,
                }
            }
        }
    }

    /// Of raw stream fields.
    pub fn of_fields(kind: Kind, fields: &[(String, Vec<u8>)]) -> Class {
        Class::of(kind, fields.iter().map(|(k, _)| k.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stream decides first, then the presence of the two broker fields.
    #[test]
    fn entries_are_classified_by_stream_and_field_presence() {
        let of = |kind, names: &[&str]| Class::of(kind, names.iter().copied());
        assert_eq!(of(Kind::Flat, &["channel_id", "content"]), Class::Agent);
        assert_eq!(
            of(Kind::Flat, &["approval_id", "approval_content"]),
            Class::Notification
        );
        assert_eq!(
            of(Kind::Flat, &["approval_id", "approval_outcome"]),
            Class::Outcome
        );
        assert_eq!(of(Kind::Flat, &["approval_outcome"]), Class::Outcome);
        assert_eq!(of(Kind::Flat, &["digest_of", "content"]), Class::Digest);
        assert_eq!(of(Kind::Agent, &["digest_of", "content"]), Class::Agent);
        assert_eq!(
            of(Kind::Agent, &["approval_id", "content"]),
            Class::Agent,
            "only the flat stream carries cards"
        );
        assert_eq!(of(Kind::Decisions, &["approval_id"]), Class::Decision);
        assert_eq!(of(Kind::Decisions, &[]), Class::Decision);
    }
}
