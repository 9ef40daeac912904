//! Each Redis user's rules, rendered from the config.

use std::path::Path;

use crate::config::{Config, Service};
use crate::error::{ConfigError, Result};
use crate::keys;

/// Commands every user may run: connection set-up and liveness only.
/// `WAIT` lets an agent make sure its `XADD` survives a failover; on a
/// Redis Cluster, clients learn the slots (`CLUSTER SLOTS`/`SHARDS`) and
/// follow a slot in migration (`ASKING`).
const BASE: &str = "+ping +auth +hello +wait +cluster|slots +cluster|shards +asking";

/// Services, the page and the operators also tell a master from a replica
/// the Sentinels named a moment too early (`ROLE`, which shows the replicas).
const SERVICE_BASE: &str = "+ping +auth +hello +wait +cluster|slots +cluster|shards +asking +role";

pub(super) fn password_hash(key: &str, path: &Path) -> Result<String, ConfigError> {
    let password = crate::config::read_secret(key, path)?;
    if password.chars().any(char::is_whitespace) {
        return Err(ConfigError::invalid(
            key,
            "the password may not contain spaces",
        ));
    }
    Ok(crate::approval::sha256_hex(password.as_bytes()))
}

fn selector(keys: &[String], commands: &str) -> String {
    format!("({} resetchannels -@all {commands})", keys.join(" "))
}

/// The rules of an agent: XADD its outboxes; read and ack its inboxes.
pub fn agent_rules(agent: &str, hash: &str) -> String {
    format!(
        "on #{hash} resetkeys resetchannels -@all {BASE} %W~{agent}:*:outbox +xadd {}",
        selector(
            &[format!("~{agent}:*:inbox")],
            "+xreadgroup +xack +xread +xrange +xrevrange +xlen +xinfo|stream +xinfo|groups +xpending"
        )
    )
}

/// The rules of one service of bridge `name`.
pub fn service_rules(config: &Config, name: &str, service: Service, hash: &str) -> String {
    let agents: Vec<&str> = config.agent_names().collect();
    let each =
        |f: &dyn Fn(&str) -> String| -> Vec<String> { agents.iter().map(|a| f(a)).collect() };
    let heartbeat = selector(&[format!("%W~{}", keys::heartbeat(name))], "+hset +expire");
    let mut sels = Vec::new();
    match service {
        Service::Outbox => {
            let mut read = vec![
                format!("~{}", keys::outbox(name)),
                format!("~{}", keys::decisions(name)),
                format!("~{}", keys::worker_decisions_pattern(name)),
            ];
            read.extend(each(&|a| format!("~{}", keys::agent_outbox(a, name))));
            // XINFO CONSUMERS, XPENDING and XCLAIM: taking over a dead worker's entries.
            sels.push(selector(
                &read,
                "+xreadgroup +xack +xgroup|create +xrange +xinfo|consumers +xinfo|groups +xpending +xclaim +xtrim",
            ));
            // XADD notices and dead letters; trim their handled history (group
            // metadata is read for that, never an entry).
            let mut write = vec![
                format!("~{}", keys::inbox(name)),
                format!("~{}", keys::dead(name)),
            ];
            write.extend(each(&|a| format!("~{}", keys::agent_inbox(a, name))));
            sels.push(selector(&write, "+xadd +xtrim +xinfo|groups +xpending"));
            // In-flight marks (one hash beside each outbox stream) and the
            // send gate, through their scripts (which also read the entry's
            // pending state on its stream).
            let mut marks = vec![
                format!("~{}", keys::in_flight_marks(&keys::outbox(name))),
                format!("~{}", keys::in_flight_runs(&keys::outbox(name))),
            ];
            marks.extend(each(&|a| {
                format!("~{}", keys::in_flight_marks(&keys::agent_outbox(a, name)))
            }));
            marks.extend(each(&|a| {
                format!("~{}", keys::in_flight_runs(&keys::agent_outbox(a, name)))
            }));
            sels.push(selector(
                &marks,
                "+hget +hmget +hgetall +hlen +hset +hdel +hexists +hkeys +evalsha +eval +script|load",
            ));
            let mut gated = marks.clone();
            gated.push(format!("~{}", keys::legacy_in_flight(name)));
            gated.push(format!("~{}", keys::outbox(name)));
            gated.extend(each(&|a| format!("~{}", keys::agent_outbox(a, name))));
            sels.push(selector(&gated, "+evalsha +eval +script|load"));
            // The one marks hash of earlier versions, emptied at start (each
            // mark moved by a script that names it and the new hash).
            sels.push(selector(
                &[format!("~{}", keys::legacy_in_flight(name))],
                "+hkeys +hget +hdel",
            ));
            // Its own audit trail and uncertain deliveries: append and add only.
            sels.push(audit_selector(&[name]));
            sels.push(selector(
                &[format!("%W~{}", keys::uncertain(name))],
                "+hset",
            ));
            // Worker leases: its own renewed, the others' looked at before a takeover.
            sels.push(selector(
                &[format!("~{}", keys::worker_lease_pattern(name))],
                "+set +get +pexpire +exists +evalsha +eval +script|load",
            ));
            let parks = config.bridge(name).is_ok_and(|b| b.approval.required);
            if parks {
                // Decisions and edits the operators and the page ask for
                // (`crate::request`): read in a group, answered, applied here;
                // TIME dates a request against the server's clock.
                sels.push(selector(
                    &[format!("~{}", keys::requests(name, "*"))],
                    "+xreadgroup +xack +xgroup|create",
                ));
                sels.push(selector(
                    &[format!("%W~{}", keys::replies(name, "*"))],
                    "+xadd",
                ));
                sels.push(selector(
                    &[
                        format!("%W~{}", keys::decisions(name)),
                        format!("%W~{}", keys::worker_decisions_pattern(name)),
                    ],
                    "+xadd",
                ));
                sels.push("+time".to_string());
                // Every surface it asks on: notifications written, and
                // searched for after a crash.
                let surfaces: Vec<&str> = config
                    .surfaces_of(name)
                    .into_iter()
                    .map(|(b, _)| b)
                    .collect();
                let notify: Vec<String> = surfaces
                    .iter()
                    .map(|b| format!("~{}", keys::outbox(b)))
                    .collect();
                sels.push(selector(&notify, "+xadd +xrange"));
                // Its digest: one per period (a key set once), written as a
                // message to the bridge that carries it.
                if let Some(to) = config.digest_bridge(name).filter(|t| !surfaces.contains(t)) {
                    sels.push(selector(&[format!("~{}", keys::outbox(to))], "+xadd"));
                }
                if config.digest_bridge(name).is_some() {
                    sels.push(selector(
                        &[format!("~{}", keys::digest_sent_pattern(name))],
                        "+set",
                    ));
                }
                sels.push(selector(&[format!("~{}", keys::id_key(name))], "+get +set"));
                // Delegations its operators ask for, sealed and kept here.
                sels.push(selector(
                    &[format!("~{}", keys::delegations(name))],
                    "+hset +hgetall +hdel",
                ));
                // The pending indexes (the bridge's and each agent's): kept
                // beside the records, counted against the parking limits.
                sels.push(selector(
                    &[
                        format!("~{}", keys::pending(name)),
                        format!("~{}", keys::agent_pending(name, "*")),
                    ],
                    "+zadd +zrem +zcard +zrange",
                ));
                sels.push(selector(
                    &[format!("~{}", keys::agent_pending_bytes(name, "*"))],
                    "+hset +hdel +hvals",
                ));
            }
            // A card the platform refused rejects its approval and wakes the requester.
            sels.extend(wake_selector(config, name));
            // Records only of the bridges it parks for or shows cards of (by
            // their ids' tags, see `keys::approval_tag`): elsewhere a forged
            // `approval_id` is refused without reading anything.
            let mut records: Vec<String> = config
                .requesters_of(name)
                .chain(parks.then_some(name))
                .map(|b| format!("~{}", keys::approvals_of(b)))
                .collect();
            records.sort();
            records.dedup();
            // Card maps: its own as a surface; its surface's, whose entry for
            // a settled approval's card it drops when it parks, and whose
            // entry it checks against a surface's answer (only that: a
            // requester that could set entries could point another bridge's
            // card at its approvals).
            if config.is_approval_surface(name) {
                records.push(format!("~{}", keys::approval_map(name)));
            }
            // The digests it carries: what their bridges noted they sent.
            let carried: Vec<String> = config
                .digests_carried_by(name)
                .map(|b| format!("~{}", keys::digest_sent_pattern(b)))
                .collect();
            if !carried.is_empty() {
                sels.push(selector(&carried, "+get"));
            }
            let maps: Vec<String> = config
                .surfaces_of(name)
                .into_iter()
                .filter(|(b, _)| parks && *b != name)
                .map(|(b, _)| format!("~{}", keys::approval_map(b)))
                .collect();
            if !maps.is_empty() {
                sels.push(selector(&maps, "+hget +hdel"));
            }
            if !records.is_empty() {
                sels.push(selector(
                    &records,
                    "+hgetall +hget +hset +hdel +del +exists +hmget +expire +evalsha +eval +script|load +multi +exec",
                ));
            }
        }
        Service::Ingest => {
            let mut inboxes = vec![format!("%W~{}", keys::inbox(name))];
            inboxes.extend(each(&|a| format!("%W~{}", keys::agent_inbox(a, name))));
            sels.push(selector(&inboxes, "+xadd"));
            // Answering only on a bridge that some bridge asks through, and
            // only the approvals of the bridges that ask through it: it reads
            // them and its card map, and hands each answer to the bridge that
            // asked (`crate::request`), whose outbox decides. It writes no
            // record and wakes nobody, so its password cannot decide.
            if config.is_approval_surface(name) {
                let mut records: Vec<String> = config
                    .requesters_of(name)
                    .map(|b| format!("~{}", keys::approvals_of(b)))
                    .collect();
                records.push(format!("~{}", keys::approval_map(name)));
                // Who answers as a delegate (the outbox checks the seals).
                records.extend(
                    config
                        .requesters_of(name)
                        .map(|b| format!("~{}", keys::delegations(b))),
                );
                sels.push(selector(&records, "+hget +hexists +hgetall +hmget +exists"));
                let asks: Vec<String> = config
                    .requesters_of(name)
                    .map(|b| format!("%W~{}", keys::requests(b, &format!("surface:{name}"))))
                    .collect();
                sels.push(selector(&asks, "+xadd"));
                let requesters: Vec<&str> = config.requesters_of(name).collect();
                sels.push(audit_selector(&requesters));
            }
            // MULTI/EXEC: a message and the position after it are written
            // together (`Ingest::inbound_at`).
            sels.push(selector(
                &[format!("~{}", keys::ingest_cursor(name))],
                "+get +set +multi +exec",
            ));
            // The position an earlier version saved, read once at start.
            sels.push(selector(
                &[format!("%R~{}", keys::legacy_ingest_cursor(name))],
                "+get",
            ));
        }
        Service::Ping => {
            let mut inboxes = vec![format!("~{}", keys::inbox(name))];
            inboxes.extend(each(&|a| format!("~{}", keys::agent_inbox(a, name))));
            sels.push(selector(&inboxes, "+xreadgroup +xack +xgroup|create"));
        }
    }
    sels.push(heartbeat);
    format!(
        "on #{hash} resetkeys resetchannels -@all {SERVICE_BASE} {}",
        sels.join(" ")
    )
}

/// What the page and the exporter read: records, the pending index, the
/// trails, the entries behind approvals, and what metrics count. Read-only.
fn reader_selectors(config: &Config) -> Vec<String> {
    let agents: Vec<&str> = config.agent_names().collect();
    let mut read = Vec::new();
    let mut status = Vec::new();
    let mut trails = Vec::new();
    for name in config.bridges.keys() {
        read.push(format!("~{}", keys::outbox(name)));
        read.extend(
            agents
                .iter()
                .map(|a| format!("~{}", keys::agent_outbox(a, name))),
        );
        status.push(format!("~{}", keys::inbox(name)));
        status.extend(
            agents
                .iter()
                .map(|a| format!("~{}", keys::agent_inbox(a, name))),
        );
        status.push(format!("~{}", keys::dead(name)));
        status.push(format!("~{}", keys::uncertain(name)));
        status.push(format!("~{}", keys::heartbeat(name)));
        status.push(format!("~{}", keys::pending(name)));
        status.push(format!("~{}", keys::delegations(name)));
        trails.push(format!("~{}", keys::audit(name)));
    }
    vec![
        selector(&read, "+xrange +xinfo|groups +xlen"),
        selector(&status, "+xinfo|groups +xlen +hlen +hgetall +zrange +zcard"),
        selector(&trails, "+xrange +xread"),
        selector(
            &[format!("~{}*", keys::APPROVAL_PREFIX)],
            "+hgetall +hget +hmget +exists",
        ),
    ]
}

/// Appending to `requester`'s request streams of every bridge that parks, and
/// reading its reply streams ([`crate::request`]): the only way the page and
/// an operator change an approval.
fn request_selectors(config: &Config, requester: &crate::request::Requester) -> Vec<String> {
    let suffix = requester.suffix();
    let parking: Vec<&String> = config
        .bridges
        .iter()
        .filter(|(_, b)| b.approval.required)
        .map(|(n, _)| n)
        .collect();
    if parking.is_empty() {
        return Vec::new();
    }
    let requests: Vec<String> = parking
        .iter()
        .map(|b| format!("%W~{}", keys::requests(b, &suffix)))
        .collect();
    let replies: Vec<String> = parking
        .iter()
        .map(|b| format!("%R~{}", keys::replies(b, &suffix)))
        .collect();
    vec![
        selector(&requests, "+xadd"),
        selector(&replies, "+xread +xrevrange"),
    ]
}

/// The rules of the approval page: read what it shows (see
/// [`reader_selectors`]) and ask, on its own request streams, for the
/// decisions and edits its users make. It writes no record, wake-up stream,
/// trail or card: the requesting bridge's outbox does, for `web:` identities
/// only. Nothing else: no `XACK`, `XTRIM`, `XDEL`, `DEL` or scripts.
pub fn web_rules(config: &Config, hash: &str) -> String {
    let mut sels = reader_selectors(config);
    // The sessions it issued: made at login, read per request, deleted at logout.
    sels.push(selector(
        &[format!("~{}", keys::web_session("*"))],
        "+set +get +del",
    ));
    sels.extend(request_selectors(config, &crate::request::Requester::Web));
    format!(
        "on #{hash} resetkeys resetchannels -@all {SERVICE_BASE} {}",
        sels.join(" ")
    )
}

/// The rules of `cowboy exporter`: exactly what a scrape and the trail's
/// tail read (group metadata, lengths, heartbeats, the pending index's ids and
/// times, the trails), never a message or a record, and nothing it could
/// change anything with.
pub fn exporter_rules(config: &Config, hash: &str) -> String {
    let agents: Vec<&str> = config.agent_names().collect();
    let (mut streams, mut dead, mut uncertain, mut beats, mut pending, mut trails) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for name in config.bridges.keys() {
        streams.push(format!("~{}", keys::outbox(name)));
        streams.push(format!("~{}", keys::inbox(name)));
        for a in &agents {
            streams.push(format!("~{}", keys::agent_outbox(a, name)));
            streams.push(format!("~{}", keys::agent_inbox(a, name)));
        }
        dead.push(format!("~{}", keys::dead(name)));
        uncertain.push(format!("~{}", keys::uncertain(name)));
        beats.push(format!("~{}", keys::heartbeat(name)));
        pending.push(format!("~{}", keys::pending(name)));
        trails.push(format!("~{}", keys::audit(name)));
    }
    let sels = [
        selector(&streams, "+xinfo|groups"),
        selector(&dead, "+xlen"),
        selector(&uncertain, "+hlen"),
        selector(&beats, "+hgetall"),
        selector(&pending, "+zcard +zrange"),
        selector(&trails, "+xread"),
    ];
    format!(
        "on #{hash} resetkeys resetchannels -@all {SERVICE_BASE} {}",
        sels.join(" ")
    )
}

/// The rules of operator NAME: read what `cowboy approvals` shows (the page's
/// reads), and ask for decisions and edits as `cli:NAME` on its own request
/// streams. No write on a record, a wake-up stream, a trail, another user's
/// stream; no `ACL`, `CONFIG` or scripts: one operator cannot act as another.
pub fn operator_rules(config: &Config, name: &str, hash: &str) -> String {
    let mut sels = reader_selectors(config);
    sels.extend(request_selectors(
        config,
        &crate::request::Requester::Operator(name.to_string()),
    ));
    format!(
        "on #{hash} resetkeys resetchannels -@all {SERVICE_BASE} +acl|whoami {}",
        sels.join(" ")
    )
}

/// `XADD` to the `decisions` streams and audit trails of the bridges that ask
/// through `name` (its ingest decides for them; its outbox rejects a card the
/// platform refused and records the cards it showed).
fn wake_selector(config: &Config, name: &str) -> Option<String> {
    let wake: Vec<String> = config
        .requesters_of(name)
        .flat_map(|r| {
            [
                format!("%W~{}", keys::decisions(r)),
                format!("%W~{}", keys::worker_decisions_pattern(r)),
            ]
        })
        .collect();
    (!wake.is_empty()).then(|| {
        let requesters: Vec<&str> = config.requesters_of(name).collect();
        format!(
            "{} {}",
            selector(&wake, "+xadd"),
            audit_selector(&requesters)
        )
    })
}

/// Appending to the audit trails of `bridges`, through the trail's script
/// ([`crate::audit`]). `EVAL` needs read and write rights on the keys it names,
/// so the key rights are whole; the commands are what keeps it append-only:
/// `XADD` (the only one a script may run for this user), no reads, no trims.
fn audit_selector(bridges: &[&str]) -> String {
    let trails: Vec<String> = bridges
        .iter()
        .map(|b| format!("~{}", keys::audit(b)))
        .collect();
    selector(&trails, "+xadd +evalsha +eval +script|load")
}
