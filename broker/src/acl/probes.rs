//! What each user must be able to do, and what it must never do: commands
//! tried as that user, against the rendered rules.

use crate::config::{Config, Service};
use crate::keys;

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
            // Its digest: its own period keys set, the digests it carries
            // read; nobody else's written.
            let digests = config.digest_bridge(name).is_some();
            let own = keys::digest_sent(name, 0);
            p.push(probe(
                u,
                when(digests),
                true,
                &["SET", &own, "acl-check", "EX", "1"],
            ));
            for b in config.digests_carried_by(name) {
                p.push(probe(u, Allowed, false, &["GET", &keys::digest_sent(b, 0)]));
                if b != name {
                    let theirs = keys::digest_sent(b, 0);
                    p.push(probe(u, Refused, true, &["SET", &theirs, "x", "EX", "1"]));
                }
            }
            p.push(probe(
                u,
                Allowed,
                false,
                &[
                    "HEXISTS",
                    &keys::in_flight_marks(&keys::outbox(name)),
                    "acl-check",
                ],
            ));
            p.push(probe(
                u,
                Allowed,
                false,
                &["HGETALL", &keys::in_flight_runs(&keys::outbox(name))],
            ));
            if parks {
                // Each surface it asks on: its notifications written, its
                // card map's settled cards dropped, no card ever pointed.
                for (notify, _) in config.surfaces_of(name) {
                    p.push(probe(
                        u,
                        Allowed,
                        true,
                        &["XADD", &keys::outbox(notify), "*", "acl_check", "1"],
                    ));
                    if notify != name {
                        let map = keys::approval_map(notify);
                        p.push(probe(u, Allowed, true, &["HDEL", &map, "acl-check"]));
                        p.push(probe(u, Refused, true, &["HSET", &map, "acl-check", "x"]));
                    }
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
