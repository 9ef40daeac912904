//! Field names of stream entries the broker writes or reads besides the
//! agent's own (`entry::AGENT_FIELDS`) and the record's
//! (`approval::field`): the one place they are spelled.
//!
//! Invariant: these strings are part of the protocol and of digests (a
//! notification's digest covers its field names), so they never change.

/// Fields of a bridge's flat outbox written by the broker: a card
/// (notification) and its outcome.
pub mod outbox {
    /// On a card and on its outcome: the approval they are about.
    pub const APPROVAL_ID: &str = "approval_id";
    /// On a card: the agent's message as approvers see it, framed.
    pub const APPROVAL_CONTENT: &str = "approval_content";
    /// On a card: the record's values its frame shows, as the requesting
    /// service wrote them (a JSON object of record fields, see
    /// `approval::frame_values`). The frame is drawn from these, never from
    /// the record, which every surface of the approval can write.
    pub const APPROVAL_FRAME: &str = "approval_frame";
    /// On an outcome entry: how the approval ended (`approved`, `rejected`,
    /// `expired`, `failed`, `uncertain`, `superseded`, ...).
    pub const APPROVAL_OUTCOME: &str = "approval_outcome";
    /// On a digest of waiting approvals: `{bridge}:{period}`, checked by the
    /// carrying bridge against what the requesting bridge noted it sent.
    pub const DIGEST_OF: &str = "digest_of";
}

/// Fields of a worker's wake-up stream (`{bridge}:decisions[:{worker}]`).
pub mod decisions {
    /// The approval just decided.
    pub const APPROVAL_ID: &str = "approval_id";
    /// What it was decided as.
    pub const STATUS: &str = "status";
    /// The surface that showed its card (a wake-up without a decision).
    pub const SHOWN: &str = "shown";
}
