//! Redis ACL rules for a deployment, and the probes that prove them.
//!
//! Rendered from the config: `user default off`; the administrator (`[redis]
//! username`) with full access, which renders and loads these rules and is never
//! an approver; each `[operators.NAME]` user and the page (`cowboy-web`) reading
//! approvals and asking for decisions on request streams of their own, never
//! writing one; the exporter (`cowboy-exporter`) reading only; one user per
//! agent, allowed only `XADD` to its own outbox streams and reading/acking its
//! own inbox streams; one user per bridge service (`cowboy-{bridge}-{service}`)
//! with only the keys and commands its job uses.
//!
//! Invariants:
//! - Commands and keys are paired with selectors (`(...)`), never in one flat rule
//!   set: a flat set would let a user run any of its commands on any of its keys
//!   (e.g. an agent `XACK`ing the broker's group on its own outbox).
//! - Every key pattern starts with a name (`ann:`, `mail:`, `approval:`): a bare `*`
//!   pattern would match the literal key `STREAMS` that Redis before 7.2.16 checks
//!   for a consumer named `STREAMS`.
//! - Passwords never appear: rules carry `#<sha256>` of the password read from
//!   its file, so the users file can be world-readable. No `#` comment lines are
//!   written (Redis refuses to start with one in an aclfile).

use std::fmt::Write as _;
use std::path::Path;

use crate::config::{Config, Service};
use crate::error::{ConfigError, Error, Result};
use crate::keys;
use crate::store::Store;

/// Commands every user may run: connection set-up and liveness only.
const BASE: &str = "+ping +auth +hello";

/// One Redis user and its rules (without the `user NAME` head).
#[derive(Debug, Clone, PartialEq)]
pub struct User {
    pub name: String,
    pub rules: String,
}

/// Output formats of `cowboy acl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// An `aclfile` users file.
    Aclfile,
    /// `ACL SETUSER` commands for `redis-cli`.
    Commands,
}

fn password_hash(key: &str, path: &Path) -> Result<String, ConfigError> {
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
            // In-flight marks and the send gate, through their scripts (which
            // also read the entry's pending state on its stream).
            sels.push(selector(
                &[format!("~{}", keys::in_flight(name))],
                "+hget +hset +hdel +hexists +hkeys +evalsha +eval +script|load",
            ));
            let mut gated = vec![format!("~{}", keys::in_flight(name))];
            gated.push(format!("~{}", keys::outbox(name)));
            gated.extend(each(&|a| format!("~{}", keys::agent_outbox(a, name))));
            sels.push(selector(&gated, "+evalsha +eval +script|load"));
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
                let notify = keys::outbox(config.notify_bridge(name));
                sels.push(selector(&[format!("~{notify}")], "+xadd +xrange"));
                sels.push(selector(&[format!("~{}", keys::id_key(name))], "+get +set"));
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
            if parks && config.notify_bridge(name) != name {
                sels.push(selector(
                    &[format!(
                        "~{}",
                        keys::approval_map(config.notify_bridge(name))
                    )],
                    "+hget +hdel",
                ));
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
                sels.push(selector(&records, "+hget +hexists +hgetall +hmget +exists"));
                let asks: Vec<String> = config
                    .requesters_of(name)
                    .map(|b| format!("%W~{}", keys::requests(b, &format!("surface:{name}"))))
                    .collect();
                sels.push(selector(&asks, "+xadd"));
                let requesters: Vec<&str> = config.requesters_of(name).collect();
                sels.push(audit_selector(&requesters));
            }
            sels.push(selector(
                &[format!("~{}", keys::ingest_cursor(name))],
                "+get +set",
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
        "on #{hash} resetkeys resetchannels -@all {BASE} {}",
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
        "on #{hash} resetkeys resetchannels -@all {BASE} {}",
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
        "on #{hash} resetkeys resetchannels -@all {BASE} {}",
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
        "on #{hash} resetkeys resetchannels -@all {BASE} +acl|whoami {}",
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

/// Every user of the deployment. Fails naming the key of a missing password file.
pub fn users(config: &Config) -> Result<Vec<User>, ConfigError> {
    let mut users = vec![User {
        name: "default".into(),
        rules: "off resetkeys resetchannels -@all".into(),
    }];
    let operator = config.redis.username.as_ref().ok_or_else(|| {
        ConfigError::invalid(
            "redis.username",
            "the operator's user is needed: the rendered rules turn `default` off",
        )
    })?;
    let file = config.redis.password_file.as_ref().ok_or_else(|| {
        ConfigError::invalid(
            "redis.password_file",
            "the operator's password file is needed",
        )
    })?;
    let hash = password_hash("redis.password_file", file)?;
    users.push(User {
        name: operator.clone(),
        rules: format!("on #{hash} ~* &* +@all"),
    });
    for (name, op) in &config.operators {
        if Some(name) == config.redis.username.as_ref() {
            continue;
        }
        let key = format!("operators.{name}.password_file");
        users.push(User {
            name: name.clone(),
            rules: operator_rules(config, name, &password_hash(&key, &op.password_file)?),
        });
    }
    if let Some(web) = &config.web {
        let file = web.redis_password_file.as_ref().ok_or_else(|| {
            ConfigError::invalid(
                "web.redis_password_file",
                "the page needs its own Redis user's password file",
            )
        })?;
        users.push(User {
            name: keys::WEB_USER.into(),
            rules: web_rules(config, &password_hash("web.redis_password_file", file)?),
        });
        if let Some(file) = &web.exporter_password_file {
            users.push(User {
                name: keys::EXPORTER_USER.into(),
                rules: exporter_rules(config, &password_hash("web.exporter_password_file", file)?),
            });
        }
    }
    for (agent, a) in &config.agents {
        let key = format!("agents.{agent}.password_file");
        let file = a
            .password_file
            .as_ref()
            .ok_or_else(|| ConfigError::invalid(&key, "every agent needs a password file"))?;
        users.push(User {
            name: agent.clone(),
            rules: agent_rules(agent, &password_hash(&key, file)?),
        });
    }
    for (name, bridge) in &config.bridges {
        for service in Service::ALL {
            let key = format!("bridges.{name}.redis_password_files.{}", service.as_str());
            let file = bridge
                .redis_password_files
                .of(service)
                .ok_or_else(|| ConfigError::invalid(&key, "every service needs a password file"))?;
            users.push(User {
                name: keys::service_user(name, service.as_str()),
                rules: service_rules(config, name, service, &password_hash(&key, file)?),
            });
        }
    }
    Ok(users)
}

/// Renders the users in the chosen format.
pub fn render(config: &Config, format: Format) -> Result<String, ConfigError> {
    let mut out = String::new();
    for u in users(config)? {
        let _ = match format {
            Format::Aclfile => writeln!(out, "user {} {}", u.name, u.rules),
            Format::Commands => writeln!(out, "ACL SETUSER {} reset {}", u.name, u.rules),
        };
    }
    Ok(out)
}

/// Whether a probe must be allowed or refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    Allowed,
    Refused,
}

/// One command tried as one user.
#[derive(Debug, Clone)]
pub struct Probe {
    pub user: String,
    pub expect: Expect,
    pub args: Vec<String>,
    /// Would change or damage state if wrongly allowed: `cowboy acl check` asks
    /// `ACL DRYRUN` instead of running it.
    pub destructive: bool,
}

fn probe(user: &str, expect: Expect, destructive: bool, args: &[&str]) -> Probe {
    Probe {
        user: user.to_string(),
        expect,
        args: args.iter().map(|s| s.to_string()).collect(),
        destructive,
    }
}

/// The probe stream keys: within the agent's patterns, but read by no service
/// (bridge names may not start with `cowboy-`).
pub fn probe_outbox(agent: &str) -> String {
    keys::agent_outbox(agent, "cowboy-acl-check")
}

/// See [`probe_outbox`].
pub fn probe_inbox(agent: &str) -> String {
    keys::agent_inbox(agent, "cowboy-acl-check")
}

/// What an agent must be able to do and must never do. `other` is another
/// agent's name (it need not exist), `bridge` a configured bridge.
pub fn agent_probes(agent: &str, other: &str, bridge: &str) -> Vec<Probe> {
    use Expect::*;
    let id = "00000000-0000-4000-8000-000000000000";
    let rec = keys::approval(id);
    let map = keys::approval_map(bridge);
    let own_in = probe_inbox(agent);
    let own_out = probe_outbox(agent);
    let flat = keys::outbox(bridge);
    let their_out = keys::agent_outbox(other, bridge);
    let their_in = keys::agent_inbox(other, bridge);
    let group = keys::agent_group(agent);
    let mut p = vec![
        probe(
            agent,
            Allowed,
            false,
            &["XADD", &own_out, "*", "acl_check", "1"],
        ),
        probe(
            agent,
            Allowed,
            false,
            &[
                "XREADGROUP",
                "GROUP",
                &group,
                "probe",
                "COUNT",
                "1",
                "STREAMS",
                &own_in,
                ">",
            ],
        ),
        probe(agent, Allowed, false, &["XLEN", &own_in]),
    ];
    for key in [&rec, &map] {
        p.push(probe(
            agent,
            Refused,
            true,
            &["HSET", key, "status", "approved"],
        ));
        p.push(probe(agent, Refused, false, &["HGET", key, "status"]));
        p.push(probe(agent, Refused, false, &["HGETALL", key]));
        p.push(probe(agent, Refused, true, &["DEL", key]));
        p.push(probe(agent, Refused, true, &["EXPIRE", key, "1"]));
    }
    for key in [&flat, &their_out, &their_in] {
        p.push(probe(
            agent,
            Refused,
            true,
            &["XADD", key, "*", "channel_id", "x", "content", "forged"],
        ));
    }
    for key in [&their_out, &their_in] {
        p.push(probe(
            agent,
            Refused,
            false,
            &["XREADGROUP", "GROUP", &group, "probe", "STREAMS", key, ">"],
        ));
        p.push(probe(agent, Refused, false, &["XRANGE", key, "-", "+"]));
    }
    // Multi-stream reads mixing an allowed and a forbidden key, in both orders.
    for (a, b) in [(&own_in, &their_in), (&their_in, &own_in)] {
        p.push(probe(
            agent,
            Refused,
            false,
            &[
                "XREADGROUP",
                "GROUP",
                &group,
                "probe",
                "STREAMS",
                a,
                b,
                ">",
                ">",
            ],
        ));
    }
    p.push(probe(
        agent,
        Refused,
        false,
        &["XREAD", "STREAMS", &own_in, &flat, "0", "0"],
    ));
    let broker_group = keys::outbox_group(bridge);
    // Its real outbox first: acking the broker's group there would release a parked entry.
    let real_out = keys::agent_outbox(agent, bridge);
    for key in [&real_out, &own_out, &flat, &their_in] {
        p.push(probe(
            agent,
            Refused,
            true,
            &["XACK", key, &broker_group, "0-1"],
        ));
        p.push(probe(
            agent,
            Refused,
            true,
            &["XGROUP", "DESTROY", key, &broker_group],
        ));
        p.push(probe(
            agent,
            Refused,
            true,
            &["XCLAIM", key, &broker_group, "probe", "0", "0-1"],
        ));
        p.push(probe(
            agent,
            Refused,
            true,
            &["XAUTOCLAIM", key, &broker_group, "probe", "0", "0"],
        ));
        p.push(probe(agent, Refused, true, &["XTRIM", key, "MAXLEN", "0"]));
        p.push(probe(agent, Refused, true, &["XDEL", key, "0-1"]));
    }
    let admin: &[&[&str]] = &[
        &["KEYS", "*"],
        &["SCAN", "0"],
        &["FLUSHALL"],
        &["FLUSHDB"],
        &["CONFIG", "GET", "*"],
        &["CONFIG", "SET", "appendonly", "no"],
        &["ACL", "WHOAMI"],
        &["ACL", "SETUSER", agent, "+@all"],
        &["EVAL", "return 1", "0"],
        &["EVALSHA", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db", "0"],
        &["FUNCTION", "LIST"],
        &["SCRIPT", "FLUSH"],
        &["MODULE", "LIST"],
        &["DEBUG", "SLEEP", "0"],
        &["SHUTDOWN", "NOSAVE"],
        &["CLIENT", "KILL", "TYPE", "normal"],
        &["MONITOR"],
        &["SUBSCRIBE", "anything"],
        &["PSUBSCRIBE", "*"],
        &["SELECT", "1"],
        &["MIGRATE", "127.0.0.1", "1", &own_out, "0", "1"],
        &["RENAME", &own_out, &flat],
        &["COPY", &own_out, &flat],
    ];
    for args in admin {
        p.push(probe(agent, Refused, true, args));
    }
    // The key approval ids are derived with: an agent that read it could compute them.
    p.push(probe(
        agent,
        Refused,
        false,
        &["GET", &keys::id_key(bridge)],
    ));
    // The audit trail: an agent can neither read who approved nor write history.
    let audit = keys::audit(bridge);
    p.push(probe(agent, Refused, false, &["XRANGE", &audit, "-", "+"]));
    p.push(probe(
        agent,
        Refused,
        true,
        &[
            "XADD", &audit, "*", "event", "decided", "verdict", "approved",
        ],
    ));
    p.push(probe(
        agent,
        Refused,
        true,
        &["XTRIM", &audit, "MAXLEN", "0"],
    ));
    // Uncertain deliveries: a forged one could be "reconciled" into a fresh send.
    let uncertain = keys::uncertain(bridge);
    p.push(probe(
        agent,
        Refused,
        true,
        &["HSET", &uncertain, "x", "{}"],
    ));
    p.push(probe(agent, Refused, false, &["HGETALL", &uncertain]));
    p
}

/// `user` setting record `rec` to approved by hand: refused.
fn approving(user: &str, rec: &str) -> Probe {
    probe(
        user,
        Expect::Refused,
        true,
        &["HSET", rec, "status", "approved"],
    )
}

/// `user` changing record `rec` by hand, or through a script of its own: all refused.
fn writing_record(user: &str, rec: &str) -> [Probe; 3] {
    use Expect::Refused;
    [
        approving(user, rec),
        probe(user, Refused, true, &["DEL", rec]),
        probe(
            user,
            Refused,
            true,
            &[
                "EVAL",
                "return redis.call('HSET', KEYS[1], 'status', 'approved')",
                "1",
                rec,
            ],
        ),
    ]
}

/// What one service user must be able to do, and a few things it must not.
pub fn service_probes(config: &Config, name: &str, service: Service) -> Vec<Probe> {
    use Expect::*;
    let user = keys::service_user(name, service.as_str());
    let u = user.as_str();
    let mut p = vec![probe(
        u,
        Allowed,
        true,
        &["HSET", &keys::heartbeat(name), service.as_str(), "0"],
    )];
    let first_agent = config.agent_names().next();
    let parks = config.bridge(name).is_ok_and(|b| b.approval.required);
    // Who is alive decides takeovers: only the outbox may renew a worker lease.
    let lease = keys::worker_lease(name, "acl-check");
    p.push(probe(
        u,
        if service == Service::Outbox {
            Allowed
        } else {
            Refused
        },
        true,
        &["SET", &lease, "0", "PX", "1"],
    ));
    let surface = config.is_approval_surface(name);
    let when = |yes: bool| if yes { Allowed } else { Refused };
    // The bridges whose approval records this bridge's services touch: its
    // own when it parks, those that ask through it when it shows cards.
    let served: Vec<&str> = config
        .requesters_of(name)
        .chain((parks && service == Service::Outbox).then_some(name))
        .collect();
    let record_of = |b: &str| keys::approval(&keys::probe_approval_id(b));
    if service != Service::Ping {
        for b in &served {
            p.push(probe(u, Allowed, false, &["HGETALL", &record_of(b)]));
        }
        // Another bridge's approvals are out of reach, whatever the id says.
        for b in config
            .bridges
            .keys()
            .filter(|b| !served.contains(&b.as_str()))
        {
            let rec = record_of(b);
            p.push(probe(u, Refused, false, &["HGETALL", &rec]));
            p.push(approving(u, &rec));
        }
    }
    match service {
        Service::Outbox => {
            p.push(probe(
                u,
                Allowed,
                false,
                &["XRANGE", &keys::outbox(name), "-", "+", "COUNT", "1"],
            ));
            p.push(probe(
                u,
                Allowed,
                true,
                &["XADD", &keys::dead(name), "*", "acl_check", "1"],
            ));
            // The audit trail is append-only, even for the service that writes it.
            let audit = keys::audit(name);
            p.push(probe(
                u,
                Allowed,
                true,
                &["XADD", &audit, "*", "acl_check", "1"],
            ));
            p.push(probe(u, Refused, false, &["XRANGE", &audit, "-", "+"]));
            p.push(probe(u, Refused, true, &["XTRIM", &audit, "MAXLEN", "0"]));
            p.push(probe(u, Refused, true, &["XDEL", &audit, "0-1"]));
            p.push(probe(u, when(parks), false, &["GET", &keys::id_key(name)]));
            p.push(probe(
                u,
                Allowed,
                false,
                &["HEXISTS", &keys::in_flight(name), "acl-check"],
            ));
            if parks {
                p.push(probe(
                    u,
                    Allowed,
                    true,
                    &[
                        "XADD",
                        &keys::outbox(config.notify_bridge(name)),
                        "*",
                        "acl_check",
                        "1",
                    ],
                ));
                // Its surface's card map: drop a settled card, never point one.
                let notify = config.notify_bridge(name);
                if notify != name {
                    let map = keys::approval_map(notify);
                    p.push(probe(u, Allowed, true, &["HDEL", &map, "acl-check"]));
                    p.push(probe(u, Refused, true, &["HSET", &map, "acl-check", "x"]));
                }
            }
            p.push(probe(u, Refused, true, &["FLUSHALL"]));
            p.push(probe(u, Refused, false, &["KEYS", "*"]));
            p.push(probe(
                u,
                Refused,
                true,
                &["CONFIG", "SET", "appendonly", "no"],
            ));
            p.push(probe(u, Refused, true, &["DEL", &keys::outbox(name)]));
            if let Some(a) = first_agent {
                p.push(probe(
                    u,
                    Refused,
                    true,
                    &["XADD", &keys::agent_outbox(a, name), "*", "acl_check", "1"],
                ));
            }
        }
        Service::Ingest => {
            p.push(probe(
                u,
                Allowed,
                true,
                &["XADD", &keys::inbox(name), "*", "acl_check", "1"],
            ));
            p.push(probe(
                u,
                when(surface),
                false,
                &["HGET", &keys::approval_map(name), "acl-check"],
            ));
            p.push(probe(
                u,
                Refused,
                false,
                &["XRANGE", &keys::outbox(name), "-", "+"],
            ));
            p.push(probe(u, Refused, false, &["GET", &keys::id_key(name)]));
            // Answers are audited on the trail of the bridge that asked.
            for r in config.requesters_of(name) {
                let audit = keys::audit(r);
                p.push(probe(
                    u,
                    Allowed,
                    true,
                    &["XADD", &audit, "*", "acl_check", "1"],
                ));
                p.push(probe(u, Refused, false, &["XRANGE", &audit, "-", "+"]));
            }
            // It decides nothing itself: no write on a record, no wake-up, no
            // script; its answers go to the asking bridge's request stream.
            for b in &served {
                p.extend(writing_record(u, &record_of(b)));
                p.push(probe(
                    u,
                    Refused,
                    true,
                    &["XADD", &keys::decisions(b), "*", "approval_id", "x"],
                ));
                let asks = keys::requests(b, &format!("surface:{name}"));
                p.push(probe(
                    u,
                    Allowed,
                    true,
                    &["XADD", &asks, "*", "acl_check", "1"],
                ));
                // Nor as another requester.
                p.push(probe(
                    u,
                    Refused,
                    true,
                    &["XADD", &keys::requests(b, "web"), "*", "acl_check", "1"],
                ));
            }
            p.push(probe(u, Refused, true, &["FLUSHALL"]));
            p.push(probe(
                u,
                Refused,
                true,
                &[
                    "XACK",
                    &keys::outbox(name),
                    &keys::outbox_group(name),
                    "0-1",
                ],
            ));
        }
        Service::Ping => {
            p.push(probe(
                u,
                Allowed,
                false,
                &[
                    "XREADGROUP",
                    "GROUP",
                    &keys::ping_group(name),
                    "acl-check",
                    "COUNT",
                    "0",
                    "STREAMS",
                    &keys::inbox(name),
                    "0",
                ],
            ));
            p.push(probe(u, Refused, false, &["HGETALL", &record_of(name)]));
            p.push(probe(
                u,
                Refused,
                true,
                &["XADD", &keys::outbox(name), "*", "acl_check", "1"],
            ));
            p.push(probe(u, Refused, true, &["FLUSHALL"]));
        }
    }
    p
}

/// What a user that must never change an approval by itself (an operator,
/// the page, the exporter) is refused: writing records, wake-ups, trails, the
/// cards' stream, administration and scripts. `reads_records`: whether it
/// may read a record (the exporter may not); `asks` is its request stream
/// (allowed), `other` another requester's (refused).
fn decider_probes(
    config: &Config,
    user: &str,
    reads_records: bool,
    asks: Option<&str>,
    other: Option<&str>,
) -> Vec<Probe> {
    use Expect::*;
    let rec = keys::approval(
        &config
            .bridges
            .keys()
            .next()
            .map(|b| keys::probe_approval_id(b))
            .unwrap_or_else(|| "00000000-0000-4000-8000-000000000000".into()),
    );
    let read = if reads_records { Allowed } else { Refused };
    let mut p = vec![probe(user, read, false, &["HGETALL", &rec])];
    p.extend(writing_record(user, &rec));
    p.extend([
        probe(
            user,
            Refused,
            true,
            &["ACL", "SETUSER", "cowboy-acl-probe", "on", ">x"],
        ),
        probe(user, Refused, true, &["CONFIG", "SET", "maxmemory", "1"]),
        probe(user, Refused, true, &["FLUSHALL"]),
    ]);
    for (name, bridge) in &config.bridges {
        p.push(probe(
            user,
            Refused,
            true,
            &["XADD", &keys::decisions(name), "*", "approval_id", "x"],
        ));
        p.push(probe(
            user,
            Refused,
            true,
            &["XADD", &keys::audit(name), "*", "acl_check", "1"],
        ));
        p.push(probe(
            user,
            Refused,
            true,
            &["XADD", &keys::outbox(name), "*", "acl_check", "1"],
        ));
        if !bridge.approval.required {
            continue;
        }
        if let Some(requests) = asks {
            p.push(probe(
                user,
                Allowed,
                true,
                &[
                    "XADD",
                    &keys::requests(name, requests),
                    "*",
                    "acl_check",
                    "1",
                ],
            ));
            p.push(probe(
                user,
                Refused,
                true,
                &[
                    "XADD",
                    &keys::replies(name, requests),
                    "*",
                    "acl_check",
                    "1",
                ],
            ));
        }
        if let Some(other) = other {
            p.push(probe(
                user,
                Refused,
                true,
                &["XADD", &keys::requests(name, other), "*", "acl_check", "1"],
            ));
        }
    }
    p
}

/// Every probe of the deployment.
pub fn all_probes(config: &Config) -> Vec<Probe> {
    let mut probes = Vec::new();
    let agents: Vec<&str> = config.agent_names().collect();
    let bridge = config
        .bridges
        .keys()
        .next()
        .map(String::as_str)
        .unwrap_or("none");
    for (i, agent) in agents.iter().enumerate() {
        let other = agents
            .get(i + 1)
            .or(agents.first())
            .filter(|o| *o != agent)
            .copied()
            .unwrap_or("cowboy-nobody");
        probes.extend(agent_probes(agent, other, bridge));
    }
    for name in config.bridges.keys() {
        for service in Service::ALL {
            probes.extend(service_probes(config, name, service));
        }
    }
    let operators: Vec<&String> = config.operators.keys().collect();
    for (i, name) in operators.iter().enumerate() {
        let own = crate::identity::Identity::cli(name).to_string();
        let other = operators
            .get(i + 1)
            .or(operators.first())
            .filter(|o| *o != name)
            .map(|o| crate::identity::Identity::cli(o).to_string())
            .unwrap_or_else(|| "web".to_string());
        probes.extend(decider_probes(config, name, true, Some(&own), Some(&other)));
    }
    if let Some(web) = &config.web {
        if web.redis_password_file.is_some() {
            let other = operators
                .first()
                .map(|o| crate::identity::Identity::cli(o).to_string());
            probes.extend(decider_probes(
                config,
                keys::WEB_USER,
                true,
                Some("web"),
                other.as_deref(),
            ));
        }
        if web.exporter_password_file.is_some() {
            // Metrics never read a record or a message.
            let mut p = decider_probes(config, keys::EXPORTER_USER, false, None, Some("web"));
            if let Some(bridge) = config.bridges.keys().next() {
                p.push(probe(
                    keys::EXPORTER_USER,
                    Expect::Refused,
                    false,
                    &["XRANGE", &keys::outbox(bridge), "-", "+"],
                ));
            }
            probes.extend(p);
        }
    }
    probes
}

/// The result of one probe.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub probe: Probe,
    /// `ok`, `NOPERM ...`, or the other error.
    pub got: String,
    pub allowed: bool,
    pub as_expected: bool,
}

/// Whether a reply means "the ACL refused it".
pub fn is_refusal(e: &redis::RedisError) -> bool {
    e.code() == Some("NOPERM") || e.to_string().contains("NOPERM")
}

/// Runs one probe as its user over `conn`. Destructive probes go through
/// `ACL DRYRUN` on `admin` unless `real` is set.
pub async fn run_probe(
    probe: &Probe,
    conn: &mut redis::aio::MultiplexedConnection,
    admin: &mut Store,
    real: bool,
) -> Verdict {
    let result: redis::RedisResult<redis::Value> = if probe.destructive && !real {
        redis::cmd("ACL")
            .arg("DRYRUN")
            .arg(&probe.user)
            .arg(&probe.args)
            .query_async(&mut admin.conn)
            .await
            .and_then(|v| match v {
                redis::Value::Okay => Ok(v),
                redis::Value::SimpleString(ref s) if s == "OK" => Ok(v),
                other => Err(redis::RedisError::from((
                    redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm),
                    "NOPERM",
                    format!("{other:?}"),
                ))),
            })
    } else {
        let mut cmd = redis::cmd(&probe.args[0]);
        cmd.arg(&probe.args[1..]);
        cmd.query_async(conn).await
    };
    let (allowed, got) = match result {
        Ok(_) => (true, "ok".to_string()),
        Err(e) if is_refusal(&e) => (false, "NOPERM".to_string()),
        // Another error (no such group, wrong type...) means the ACL let it through.
        Err(e) => (true, format!("passed the ACL, then: {e}")),
    };
    let as_expected = allowed == (probe.expect == Expect::Allowed);
    Verdict {
        probe: probe.clone(),
        got,
        allowed,
        as_expected,
    }
}

/// Connects as `user` with the password in `file`.
pub async fn connect_as(
    config: &Config,
    user: &str,
    file: &Path,
) -> Result<redis::aio::MultiplexedConnection> {
    let mut redis = config.redis.clone();
    redis.username = Some(user.to_string());
    redis.password_file = Some(file.to_path_buf());
    let client = crate::store::client_for(&redis)?;
    let conn = client
        .get_multiplexed_async_connection_with_config(
            &redis::AsyncConnectionConfig::new()
                .set_response_timeout(Some(std::time::Duration::from_secs(5))),
        )
        .await
        .map_err(|e| Error::Permission {
            command: format!("AUTH as {user}"),
            message: e.to_string(),
        })?;
    Ok(conn)
}

/// `cowboy acl check`: connects as every configured user and runs its probes.
/// Returns the table and whether everything was as expected.
pub async fn check(config: &Config, admin: &mut Store, real: bool) -> Result<(String, bool)> {
    // The probe inbox gives the agents something real to read and ack.
    for agent in config.agent_names() {
        let inbox = probe_inbox(agent);
        admin
            .ensure_group(&inbox, &keys::agent_group(agent))
            .await?;
        admin.xadd(&inbox, &[("acl_check", b"1")]).await?;
    }
    let mut table = format!(
        "{:<28} {:<8} {:<10} {:<8} {}\n",
        "user", "expect", "got", "result", "command"
    );
    let mut all_ok = true;
    let mut current: Option<(String, redis::aio::MultiplexedConnection)> = None;
    for probe in all_probes(config) {
        if current.as_ref().map(|(u, _)| u) != Some(&probe.user) {
            let file = password_file_of(config, &probe.user)
                .ok_or_else(|| Error::usage(format!("no password file for {}", probe.user)))?;
            current = Some((
                probe.user.clone(),
                connect_as(config, &probe.user, &file).await?,
            ));
        }
        let Some((_, conn)) = current.as_mut() else {
            continue;
        };
        let v = run_probe(&probe, conn, admin, real).await;
        all_ok &= v.as_expected;
        let _ = writeln!(
            table,
            "{:<28} {:<8} {:<10} {:<8} {}",
            v.probe.user,
            match v.probe.expect {
                Expect::Allowed => "allowed",
                Expect::Refused => "refused",
            },
            if v.allowed { "allowed" } else { "refused" },
            if v.as_expected { "ok" } else { "SURPRISE" },
            v.probe.args.join(" ")
                + if v.probe.destructive && !real {
                    "  (dry run)"
                } else {
                    ""
                },
        );
    }
    for agent in config.agent_names() {
        let _: () = redis::cmd("DEL")
            .arg(probe_inbox(agent))
            .arg(probe_outbox(agent))
            .query_async(&mut admin.conn)
            .await
            .map_err(|e| Error::from_redis("DEL probe streams", e))?;
    }
    Ok((table, all_ok))
}

/// The password file configured for a user name.
pub fn password_file_of(config: &Config, user: &str) -> Option<std::path::PathBuf> {
    if let Some(a) = config.agents.get(user) {
        return a.password_file.clone();
    }
    if user == keys::WEB_USER {
        return config.web.as_ref()?.redis_password_file.clone();
    }
    if user == keys::EXPORTER_USER {
        return config.web.as_ref()?.exporter_password_file.clone();
    }
    if let Some(op) = config.operators.get(user) {
        return Some(op.password_file.clone());
    }
    for (name, bridge) in &config.bridges {
        for service in Service::ALL {
            if keys::service_user(name, service.as_str()) == user {
                return bridge.redis_password_files.of(service).cloned();
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rights on approvals follow the approval flow: only a bridge that some
    /// bridge asks through may decide (ingest) or show cards (outbox), and only
    /// a bridge that parks reads its id key.
    #[test]
    fn approval_rights_only_where_approvals_happen() {
        let config = Config::parse(
            r#"
[bridges.asks]
type = "console"
approval = { required = true, notify = "shows", notify_channel = "ops", approvers = ["cli:op"] }
[bridges.shows]
type = "console"
[bridges.plain]
type = "console"
"#,
        )
        .unwrap();
        let rules = |b: &str, s: Service| service_rules(&config, b, s, "00");
        // Records by the asking bridge's tag, never the whole prefix.
        let asks = format!("~approval:*{}", keys::approval_tag("asks"));
        assert!(rules("shows", Service::Ingest).contains(&asks));
        assert!(!rules("shows", Service::Ingest).contains("~approval:* "));
        assert!(!rules("plain", Service::Ingest).contains("approval:"));
        assert!(!rules("asks", Service::Ingest).contains("approval:"));
        assert!(rules("asks", Service::Outbox).contains("~asks:id-key"));
        assert!(rules("asks", Service::Outbox).contains(&asks));
        assert!(!rules("shows", Service::Outbox).contains("id-key"));
        assert!(rules("shows", Service::Outbox).contains(&asks));
        assert!(rules("shows", Service::Outbox).contains("~approval:shows_map"));
        assert!(!rules("plain", Service::Outbox).contains("approval:"));
    }
}
