//! The Redis key schema: the one place that formats key, group and consumer names.
//!
//! Every other module asks this one for a name, so the public contract of
//! DESIGN.md ("Redis keys") can be read, and changed, in a single file.
//!
//! Names chosen by the broker beyond that contract (`{bridge}:decisions`,
//! `{bridge}:heartbeat`, `{bridge}:id-key`, `{bridge}:audit`,
//! `{bridge}:uncertain`) all start with the bridge name, so an agent's ACL
//! patterns (`{agent}:*`) never reach them as long as agent and bridge names
//! differ, which the config loader enforces. The hash-tagged ones
//! (`{<stream>}:in-flight`, `{<stream>}:in-flight:runs`,
//! `{<bridge>:inbox}:ingest:cursor`: a literal
//! brace, so Redis Cluster keeps them in their stream's slot) start with `{`,
//! which no agent pattern does, and names cannot contain braces.

/// Flat outbox of a bridge: broker notifications and, on a shared Redis, agents.
pub fn outbox(bridge: &str) -> String {
    format!("{bridge}:outbox")
}

/// Per-agent outbox, written by the agent under its own ACL user.
pub fn agent_outbox(agent: &str, bridge: &str) -> String {
    format!("{agent}:{bridge}:outbox")
}

/// Flat inbox of a bridge.
pub fn inbox(bridge: &str) -> String {
    format!("{bridge}:inbox")
}

/// Per-agent inbox: inbound messages and notices for that agent.
pub fn agent_inbox(agent: &str, bridge: &str) -> String {
    format!("{agent}:{bridge}:inbox")
}

/// The inbox that answers a given outbox stream: notices go where the agent reads.
pub fn inbox_for(agent: Option<&str>, bridge: &str) -> String {
    match agent {
        Some(agent) => agent_inbox(agent, bridge),
        None => inbox(bridge),
    }
}

/// The outbox a given agent (or nobody: the flat stream) writes for a bridge.
pub fn outbox_for(agent: Option<&str>, bridge: &str) -> String {
    match agent {
        Some(agent) => agent_outbox(agent, bridge),
        None => outbox(bridge),
    }
}

/// Whose outbox of `bridge` `stream` is, the inverse of [`outbox_for`]:
/// `Some(None)` for the flat one, `Some(Some(agent))` for an agent's (a
/// name of letters, digits, `-` and `_`, as the config allows), `None` for
/// any other key.
pub fn outbox_owner<'a>(stream: &'a str, bridge: &str) -> Option<Option<&'a str>> {
    if stream == outbox(bridge) {
        return Some(None);
    }
    let agent = stream.strip_suffix(&format!(":{bridge}:outbox"))?;
    is_name(agent).then_some(Some(agent))
}

/// Whether `name` is one the config allows for an agent (or a Redis user
/// it renders): ASCII letters, digits, `-` and `_`, not empty. Key names
/// built from such a name parse back unambiguously.
pub fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// Dead letters: entries refused as invalid, with the reason.
pub fn dead(bridge: &str) -> String {
    format!("{bridge}:dead")
}

/// Wake-up stream of a requesting bridge: one entry per decision taken on one
/// of its approvals, read in the same blocking call as its outbox streams.
pub fn decisions(bridge: &str) -> String {
    format!("{bridge}:decisions")
}

/// Liveness hash of a bridge: one field per running service, with an expiry.
pub fn heartbeat(bridge: &str) -> String {
    format!("{bridge}:heartbeat")
}

/// Where an ingest keeps its position: the console file's offset, the mail
/// folder's UID, the last Discord message carried per listened channel.
/// Hash-tagged with the flat inbox's name, so on Redis Cluster a message to
/// the flat inbox and the position after it are still one transaction.
pub fn ingest_cursor(bridge: &str) -> String {
    format!("{{{}}}:ingest:cursor", inbox(bridge))
}

/// Where earlier versions kept the position: read when the new key is
/// still missing ([`crate::ingest::Ingest::cursor`]).
pub fn legacy_ingest_cursor(bridge: &str) -> String {
    format!("{bridge}:ingest:cursor")
}

/// The secret approval ids of a requesting bridge are derived with
/// ([`crate::approval::IdKey`]); only that bridge's outbox user may read it.
pub fn id_key(bridge: &str) -> String {
    format!("{bridge}:id-key")
}

/// The running delegations of a requesting bridge's approvers (a hash:
/// delegator person → sealed JSON, see [`crate::approval::delegation`]),
/// written by that bridge's outbox only.
pub fn delegations(bridge: &str) -> String {
    format!("{bridge}:delegations")
}

/// Set (with a time to live) by the outbox worker that sent bridge
/// `bridge`'s digest of period `n`, so one digest goes out per period.
pub fn digest_sent(bridge: &str, n: u64) -> String {
    format!("{bridge}:digest:{n}")
}

/// Every [`digest_sent`] key of `bridge` (an ACL pattern).
pub fn digest_sent_pattern(bridge: &str) -> String {
    format!("{bridge}:digest:*")
}

/// The in-flight marks of the deliveries of one outbox stream
/// (`outbox::inflight`), field = delivery key. Hash-tagged with the stream's
/// whole name, so on Redis Cluster it lives in the stream's slot: the mark
/// and the gate read the entry's pending state and write the mark in one
/// script. (Names carry no braces, so the tag is exactly the stream.)
pub fn in_flight_marks(stream: &str) -> String {
    format!("{{{stream}}}:in-flight")
}

/// The marks of the runs of sends of one outbox stream whose gate was
/// passed together (`outbox::inflight`): run mark → `writing:{worker}`, a
/// newline, then the entry ids it passed. Beside [`in_flight_marks`], in
/// the stream's slot.
pub fn in_flight_runs(stream: &str) -> String {
    format!("{{{stream}}}:in-flight:runs")
}

/// Where one hash per bridge held every stream's marks, before they moved
/// beside their streams: read once at start and moved
/// (`OutboxService::prepare`).
pub fn legacy_in_flight(bridge: &str) -> String {
    format!("{bridge}:in-flight")
}

/// The stable identity of one stream entry's delivery (`{stream}/{entry
/// id}`): the field of its in-flight mark, and what senders that deduplicate
/// recognise a retry by. Stream ids hold no `/`, so the last one splits it.
/// The send gate's Lua (`outbox::inflight`, `GATE_RUN`) builds the same
/// shape from a stream and its ids: change both or neither.
pub fn delivery_key(stream: &str, entry_id: &str) -> String {
    format!("{stream}/{entry_id}")
}

/// A delivery key's stream and entry id ([`delivery_key`]).
pub fn split_delivery(delivery_key: &str) -> Option<(&str, &str)> {
    delivery_key.rsplit_once('/')
}

/// The stream a delivery key belongs to.
pub fn stream_of_delivery(delivery_key: &str) -> Option<&str> {
    split_delivery(delivery_key).map(|(stream, _)| stream)
}

/// The index of a requesting bridge's pending approvals: a sorted set of
/// approval ids scored by `created_at`, so listing and prefix lookups read it
/// instead of scanning the keyspace.
pub fn pending(bridge: &str) -> String {
    format!("{bridge}:pending")
}

/// The pending approvals of one agent on a requesting bridge (ids scored by
/// `created_at`), beside [`pending`]: what `approval.max_parked_per_agent`
/// counts.
pub fn agent_pending(bridge: &str, agent: &str) -> String {
    format!("{bridge}:pending:{agent}")
}

/// The sizes of one agent's pending approvals on a requesting bridge (a hash:
/// approval id → content bytes), beside [`agent_pending`] and kept with it:
/// what `approval.max_parked_bytes_per_agent` sums.
pub fn agent_pending_bytes(bridge: &str, agent: &str) -> String {
    format!("{bridge}:pending-bytes:{agent}")
}

/// The audit trail of a requesting bridge: every step of its approvals and gated
/// deliveries, appended by the services and the CLI, never read by an agent
/// (see [`crate::audit`]).
pub fn audit(bridge: &str) -> String {
    format!("{bridge}:audit")
}

/// Deliveries of a bridge whose outcome is unknown (sent, maybe, and no answer),
/// by delivery id, until an operator reconciles them
/// (see [`crate::deliveries`]).
pub fn uncertain(bridge: &str) -> String {
    format!("{bridge}:uncertain")
}

/// Decision requests for a requesting bridge's approvals from one requester
/// (`cli:NAME` for an operator, `web` for the page): only that requester's Redis
/// user may append, only the bridge's outbox reads (see [`crate::request`]).
pub fn requests(bridge: &str, requester: &str) -> String {
    format!("{bridge}:requests:{requester}")
}

/// The outbox's answers to [`requests`], read by that requester alone.
pub fn replies(bridge: &str, requester: &str) -> String {
    format!("{bridge}:replies:{requester}")
}

/// The prefix every approval key starts with.
pub const APPROVAL_PREFIX: &str = "approval:";

/// Approval record of one parked entry.
pub fn approval(id: &str) -> String {
    format!("{APPROVAL_PREFIX}{id}")
}

/// The eight hex digits every approval id of requesting bridge `bridge` ends
/// with (see [`crate::approval::IdKey`]). They let an ACL key pattern
/// ([`approvals_of`]) give a service the records of the bridges it serves and
/// no others, while each key stays `approval:<uuid>`. Derived from the name
/// alone; the config refuses two bridges with one tag.
pub fn approval_tag(bridge: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"cowboy approval tag\n");
    h.update(bridge.as_bytes());
    hex::encode(&h.finalize()[..4])
}

/// The records of requesting bridge `bridge`'s approvals, as an ACL key pattern.
pub fn approvals_of(bridge: &str) -> String {
    format!("{APPROVAL_PREFIX}*{}", approval_tag(bridge))
}

/// A well-formed approval id of `bridge` that no record has: what the ACL
/// probes try their rights on.
pub fn probe_approval_id(bridge: &str) -> String {
    format!("00000000-0000-4000-8000-0000{}", approval_tag(bridge))
}

/// External message id → approval id and the digest of the version the card
/// shows, owned by the notify bridge `source`.
pub fn approval_map(source: &str) -> String {
    format!("{APPROVAL_PREFIX}{source}_map")
}

/// The approval id inside an `approval:*` key, when the key is a record (not a map).
pub fn approval_id_of(key: &str) -> Option<&str> {
    let id = key.strip_prefix(APPROVAL_PREFIX)?;
    (!id.ends_with("_map")).then_some(id)
}

/// Consumer group of every outbox stream of a bridge (and of its decisions stream).
pub fn outbox_group(bridge: &str) -> String {
    format!("{bridge}-outbox")
}

/// The worker name of an outbox service started without `--worker`.
pub const DEFAULT_WORKER: &str = "worker";

/// Whether `name` may be a worker name: it becomes part of a consumer name and of
/// a stream key, so 1 to 64 letters, digits, `-` or `_`.
pub fn valid_worker(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The consumer of outbox worker `worker` within [`outbox_group`]. The default
/// worker's is `{bridge}-worker`, as before workers had names.
pub fn outbox_consumer(bridge: &str, worker: &str) -> String {
    format!("{bridge}-{worker}")
}

/// The field of [`heartbeat`] an outbox worker beats in: `outbox` for the
/// default worker, `outbox:{worker}` for a named one.
pub fn outbox_heartbeat_field(worker: &str) -> String {
    if worker == DEFAULT_WORKER {
        "outbox".to_string()
    } else {
        format!("outbox:{worker}")
    }
}

/// The lease of outbox worker `worker`: holds the running process's instance id
/// and expires `claim_idle_seconds` after its last renewal. Only a worker whose
/// lease is gone is dead.
pub fn worker_lease(bridge: &str, worker: &str) -> String {
    format!("{bridge}:worker:{worker}")
}

/// A key pattern matching every worker lease of a bridge (ACL rules).
pub fn worker_lease_pattern(bridge: &str) -> String {
    format!("{bridge}:worker:*")
}

/// A key pattern matching every named worker's wake-up stream (ACL rules).
pub fn worker_decisions_pattern(bridge: &str) -> String {
    format!("{bridge}:decisions:*")
}

/// The wake-up stream of one outbox worker: where a decision on an approval it
/// holds is announced. The default worker's is [`decisions`].
pub fn decisions_for(bridge: &str, worker: &str) -> String {
    if worker.is_empty() || worker == DEFAULT_WORKER {
        decisions(bridge)
    } else {
        format!("{bridge}:decisions:{worker}")
    }
}

/// Consumer group of the ping service on the bridge's inbox streams.
pub fn ping_group(bridge: &str) -> String {
    format!("{bridge}-ping")
}

/// The ping service's consumer within [`ping_group`].
pub fn ping_consumer(bridge: &str) -> String {
    format!("{bridge}-pinger")
}

/// Consumer group an agent reads its inbox with (created by the ping service,
/// since the agent's ACL user may not create groups).
pub fn agent_group(agent: &str) -> String {
    agent.to_string()
}

/// Redis ACL user of the approval page and exporter (`cowboy web`).
pub const WEB_USER: &str = "cowboy-web";

/// The record of one session the approval page issued (`user|fingerprint`,
/// expiring with the session); logout deletes it.
pub fn web_session(nonce: &str) -> String {
    format!("{WEB_USER}:session:{nonce}")
}

/// Redis ACL user of `cowboy exporter`: reads what the metrics count, nothing else.
pub const EXPORTER_USER: &str = "cowboy-exporter";

/// Redis ACL user of one service of a bridge.
pub fn service_user(bridge: &str, service: &str) -> String {
    format!("cowboy-{bridge}-{service}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_keys_are_not_records() {
        assert_eq!(approval_id_of(&approval("abc")), Some("abc"));
        assert_eq!(approval_id_of(&approval_map("discord")), None);
        assert_eq!(approval_id_of("discord:outbox"), None);
    }

    #[test]
    fn notices_follow_the_stream_layout() {
        assert_eq!(inbox_for(Some("ann"), "mail"), "ann:mail:inbox");
        assert_eq!(inbox_for(None, "mail"), "mail:inbox");
        assert_eq!(outbox_for(Some("ann"), "mail"), "ann:mail:outbox");
    }
}
