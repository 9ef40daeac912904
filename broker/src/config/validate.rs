//! The checks a config passes before anything starts, each failing with the
//! key named.

use std::collections::BTreeMap;

use super::{BridgeConfig, Config, WebConfig};
use crate::error::ConfigError;
use crate::identity::{canonical, Identity};

impl Config {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        validate_redis(&self.redis)?;
        if let Some(web) = &self.web {
            validate_web(web)?;
        }
        self.validate_names()?;
        self.validate_people()?;
        for (name, bridge) in &self.bridges {
            self.validate_bridge(name, bridge)?;
        }
        Ok(())
    }

    /// Names: agents, bridges' approval tags, operators; the audit trail's retention.
    fn validate_names(&self) -> Result<(), ConfigError> {
        if !(1..=36_500).contains(&self.audit.retention_days) {
            return Err(ConfigError::invalid(
                "audit.retention_days",
                "must be between 1 and 36500 (the trail is the only record of who approved what)",
            ));
        }
        for name in self.agents.keys() {
            check_name(&format!("agents.{name}"), name)?;
        }
        // Each bridge's approval ids end with its tag, and its services'
        // rights on records follow the tag: two bridges must not share one.
        let mut tags: BTreeMap<String, &str> = BTreeMap::new();
        for name in self.bridges.keys() {
            if let Some(other) = tags.insert(crate::keys::approval_tag(name), name) {
                return Err(ConfigError::invalid(
                    format!("bridges.{name}"),
                    format!("its approval ids would end like bridge `{other}`'s (a one in four billion chance): rename one of them"),
                ));
            }
        }
        for name in self.operators.keys() {
            let at = format!("operators.{name}");
            check_name(&at, name)?;
            // The `[redis]` user administers (it renders and loads the ACL):
            // as an approver it could act as every other operator.
            if Some(name) == self.redis.username.as_ref() {
                return Err(ConfigError::invalid(
                    at,
                    "the [redis] user is the administrator (it can change every other user): it cannot also be an operator who decides; give the operator a Redis user of its own",
                ));
            }
            if self.agents.contains_key(name) || self.bridges.contains_key(name) {
                return Err(ConfigError::invalid(
                    at,
                    "an operator cannot share a name with an agent or a bridge",
                ));
            }
        }
        Ok(())
    }

    /// `[people]`: each identity names one person.
    fn validate_people(&self) -> Result<(), ConfigError> {
        let mut claimed: BTreeMap<String, &str> = BTreeMap::new();
        for (name, person) in &self.people {
            let at = format!("people.{name}");
            check_name(&at, name)?;
            if person.identities.is_empty() {
                return Err(ConfigError::invalid(
                    format!("{at}.identities"),
                    "a person needs at least one identity",
                ));
            }
            for (i, who) in person.identities.iter().enumerate() {
                let key = format!("{at}.identities[{i}]");
                if let Err(why) = Identity::parse(who) {
                    return Err(ConfigError::invalid(key, why));
                }
                if let Some(other) = claimed.insert(canonical(who), name) {
                    return Err(ConfigError::invalid(
                        key,
                        format!("`{who}` is claimed by [people.{other}] already: an identity is one person's"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// One `[bridges.NAME]`: its type, its limits, its approval gate, its ping.
    fn validate_bridge(&self, name: &str, bridge: &BridgeConfig) -> Result<(), ConfigError> {
        let at = format!("bridges.{name}");
        check_name(&at, name)?;
        if self.agents.contains_key(name) {
            return Err(ConfigError::invalid(
                at,
                "a bridge and an agent cannot share a name (their keys would overlap)",
            ));
        }
        if registry::kind(&bridge.kind).is_none() {
            return Err(ConfigError::invalid(
                format!("{at}.type"),
                format!(
                    "unknown bridge type `{}` (known: {})",
                    bridge.kind,
                    registry::names().join(", ")
                ),
            ));
        }
        if bridge.max_content_bytes == 0 {
            return Err(ConfigError::invalid(
                format!("{at}.max_content_bytes"),
                "must be at least 1",
            ));
        }
        if bridge.claim_idle_seconds == 0 {
            return Err(ConfigError::invalid(
                format!("{at}.claim_idle_seconds"),
                "must be at least 1",
            ));
        }
        if bridge.max_deliveries < 2 {
            return Err(ConfigError::invalid(
                format!("{at}.max_deliveries"),
                "must be at least 2 (a restart hands every pending entry over once more)",
            ));
        }
        if bridge.max_in_flight == 0 {
            return Err(ConfigError::invalid(
                format!("{at}.max_in_flight"),
                "must be at least 1",
            ));
        }
        if bridge.max_attempts == 0 {
            return Err(ConfigError::invalid(
                format!("{at}.max_attempts"),
                "must be at least 1",
            ));
        }
        if bridge.batch == 0 {
            return Err(ConfigError::invalid(
                format!("{at}.batch"),
                "must be at least 1",
            ));
        }
        let approval = &bridge.approval;
        let notify = self.notify_bridge(name);
        if !self.bridges.contains_key(notify) {
            return Err(ConfigError::invalid(
                format!("{at}.approval.notify"),
                format!("names no configured bridge: `{notify}`"),
            ));
        }
        // Every approver, with the key that names it: the bridge's own, and
        // those each escalation step adds.
        let approvers: Vec<(String, &String)> = approval
            .approvers
            .iter()
            .enumerate()
            .map(|(i, who)| (format!("{at}.approval.approvers[{i}]"), who))
            .chain(approval.escalate.iter().enumerate().flat_map(|(s, step)| {
                let at = &at;
                step.approvers.iter().enumerate().map(move |(i, who)| {
                    (format!("{at}.approval.escalate[{s}].approvers[{i}]"), who)
                })
            }))
            .collect();
        for (key, who) in &approvers {
            let ok = Identity::parse(who);
            let unproven = who
                .strip_prefix("cli:")
                .is_some_and(|op| !self.operators.is_empty() && !self.operators.contains_key(op));
            let no_such_web_user = who
                .strip_prefix("web:")
                .is_some_and(|u| !self.web.as_ref().is_some_and(|w| w.users.contains_key(u)));
            if no_such_web_user {
                return Err(ConfigError::invalid(
                    key.clone(),
                    format!("`{who}` names no `[web.users]` entry"),
                ));
            }
            if unproven {
                return Err(ConfigError::invalid(
                    key.clone(),
                    format!("`{who}` names no `[operators]` entry (with operators declared, every cli: approver must be one)"),
                ));
            }
            if let Err(why) = ok {
                return Err(ConfigError::invalid(key.clone(), why));
            }
        }
        if approval.required {
            if approval.notify_channel.is_empty() {
                return Err(ConfigError::invalid(
                    format!("{at}.approval.notify_channel"),
                    "required = true needs a notify_channel",
                ));
            }
            if approval.approvers.is_empty() {
                return Err(ConfigError::invalid(
                    format!("{at}.approval.approvers"),
                    "required = true needs at least one approver",
                ));
            }
        }
        // The notify bridge refuses a card to a channel off its own
        // allow-list (and rejects the approval unshown): every entry
        // would be rejected, so say it now.
        let shown_on = &self.bridges[notify];
        if !approval.notify_channel.is_empty()
            && !shown_on.allows_destination(&approval.notify_channel)
        {
            return Err(ConfigError::invalid(
                format!("{at}.approval.notify_channel"),
                format!(
                    "`{}` is not on the `destinations` of bridge `{notify}`, which shows the cards: every approval would be rejected unshown",
                    approval.notify_channel
                ),
            ));
        }
        // Each more surface (asked at once, or by an escalation step): a
        // bridge of its own, asked on a channel it may show.
        let more = approval
            .also
            .iter()
            .enumerate()
            .map(|(i, s)| {
                (
                    format!("{at}.approval.also[{i}]"),
                    &s.notify,
                    &s.notify_channel,
                )
            })
            .chain(approval.escalate.iter().enumerate().map(|(i, s)| {
                (
                    format!("{at}.approval.escalate[{i}]"),
                    &s.notify,
                    &s.notify_channel,
                )
            }));
        let mut asked = vec![notify];
        for (key, surface, channel) in more {
            let Some(shows) = self.bridges.get(surface) else {
                return Err(ConfigError::invalid(
                    format!("{key}.notify"),
                    format!("names no configured bridge: `{surface}`"),
                ));
            };
            if asked.contains(&surface.as_str()) {
                return Err(ConfigError::invalid(
                    format!("{key}.notify"),
                    format!("bridge `{surface}` is asked already: one card per surface"),
                ));
            }
            asked.push(surface);
            if channel.is_empty() || !shows.allows_destination(channel) {
                return Err(ConfigError::invalid(
                    format!("{key}.notify_channel"),
                    format!("a card needs a channel on the `destinations` of bridge `{surface}`"),
                ));
            }
        }
        // Steps in order, each before the deadline (one after it never comes).
        let mut previous = 0;
        for (i, step) in approval.escalate.iter().enumerate() {
            let late = approval.timeout != 0 && step.after >= approval.timeout;
            if step.after <= previous || late {
                return Err(ConfigError::invalid(
                    format!("{at}.approval.escalate[{i}].after"),
                    format!(
                        "must be later than the step before ({previous} s) and sooner than approval.timeout ({} s)",
                        approval.timeout
                    ),
                ));
            }
            previous = step.after;
        }
        if approval.digest.is_some() {
            let to = approval.digest_to.as_deref().unwrap_or(notify);
            let Some(through) = self.bridges.get(to) else {
                return Err(ConfigError::invalid(
                    format!("{at}.approval.digest_to"),
                    format!("`{to}` names no bridge"),
                ));
            };
            if !approval.required {
                return Err(ConfigError::invalid(
                    format!("{at}.approval.digest"),
                    "only a bridge that asks for approval has approvals to digest",
                ));
            }
            if through.approval.required {
                return Err(ConfigError::invalid(
                    format!("{at}.approval.digest_to"),
                    format!("bridge `{to}` holds what it sends for approval: a digest sent through it would wait for one"),
                ));
            }
            if approval.digest_channel.is_empty()
                || !through.allows_destination(&approval.digest_channel)
            {
                return Err(ConfigError::invalid(
                    format!("{at}.approval.digest_channel"),
                    format!("a digest needs a channel on the `destinations` of bridge `{to}`"),
                ));
            }
            // Cards and digests apart: a channel of cards shows cards only.
            let cards = self
                .card_channels(to)
                .any(|c| crate::outbox::same_destination(c, &approval.digest_channel));
            if cards {
                return Err(ConfigError::invalid(
                    format!("{at}.approval.digest_channel"),
                    format!(
                        "`{}` is where approval requests are shown on bridge `{to}`: a digest goes to another channel",
                        approval.digest_channel
                    ),
                ));
            }
        }
        if approval.max_snooze > 0 && !(1..=approval.max_snooze).contains(&approval.snooze) {
            return Err(ConfigError::invalid(
                format!("{at}.approval.snooze"),
                format!(
                    "must be between 1 and approval.max_snooze ({} s)",
                    approval.max_snooze
                ),
            ));
        }
        // Distinct people: an identity listed twice (emails compare without case) is one.
        let distinct: std::collections::BTreeSet<String> =
            approval.approvers.iter().map(|a| canonical(a)).collect();
        if distinct.len() != approval.approvers.len() {
            return Err(ConfigError::invalid(
                format!("{at}.approval.approvers"),
                "an approver is listed twice",
            ));
        }
        // A quorum counts people: two identities of one person are one.
        let people: std::collections::BTreeSet<String> = approval
            .approvers
            .iter()
            .map(|a| self.counting_key(a))
            .collect();
        if approval.quorum == 0 || approval.quorum as usize > people.len().max(1) {
            return Err(ConfigError::invalid(
                format!("{at}.approval.quorum"),
                format!(
                    "must be between 1 and the number of distinct people among the approvers ({})",
                    people.len()
                ),
            ));
        }
        let labels = approvers.iter().any(|(_, a)| a.starts_with("cli:"));
        if approval.quorum > 1 && labels && self.operators.is_empty() {
            return Err(ConfigError::invalid(
                format!("{at}.approval.quorum"),
                "with cli: approvers, a quorum above 1 needs [operators]: without them a cli: name is a label anyone at the shell can give, so one person could count twice",
            ));
        }
        if approval.quorum > 1 {
            if let Some((key, who)) = approvers.iter().find(|(_, a)| self.person_of(a).is_none()) {
                return Err(ConfigError::invalid(
                    key.clone(),
                    format!("`{who}` belongs to no [people.NAME] entry: under a quorum above 1 every approver must be a declared person, so one human with two identities cannot count twice"),
                ));
            }
            // Two surfaces of one type: either one's password speaks for every
            // identity of that type, so trusting surfaces would let one
            // password meet the quorum alone.
            if approval.trust_surfaces {
                let mut kinds = std::collections::BTreeSet::new();
                for (surface, _) in self.surfaces_of(name) {
                    let kind = self.bridges.get(surface).map(|b| b.kind.as_str());
                    if !kinds.insert(kind) {
                        return Err(ConfigError::invalid(
                            format!("{at}.approval.trust_surfaces"),
                            format!("`{surface}` is a second surface of its type: either one's password can answer as anyone of that type, so trust_surfaces would let one password meet the quorum"),
                        ));
                    }
                }
            }
            // One password counts once: the approvers must be able to
            // answer through as many secrets as the quorum needs.
            // Each surface's ingest is a password of its own, for the
            // identities of its type (several surfaces: several passwords);
            // those asked from the start only, so the quorum can be met
            // before any escalation step.
            let mut surfaces = self.surfaces_of(name);
            surfaces.truncate(1 + approval.also.len());
            let proofs: std::collections::BTreeSet<String> = approval
                .approvers
                .iter()
                .flat_map(|a| match proof_class(a).as_str() {
                    "surface" => {
                        let kind = a.split(':').next().unwrap_or("");
                        surfaces
                            .iter()
                            .filter(|(b, _)| self.bridges.get(*b).is_some_and(|c| c.kind == kind))
                            .map(|(b, _)| format!("ingest:{b}"))
                            .collect::<Vec<_>>()
                    }
                    class => vec![class.to_string()],
                })
                .collect();
            if !approval.trust_surfaces && proofs.len() < approval.quorum as usize {
                return Err(ConfigError::invalid(
                    format!("{at}.approval.quorum"),
                    format!(
                        "the approvers answer through {} password(s) (the notify bridge's ingest speaks for every identity on its platform, the page's for every web: user, each operator has its own), so one password would count as several people: add operators, or set approval.trust_surfaces = true to count each person on one surface",
                        proofs.len()
                    ),
                ));
            }
        }
        if bridge.ping.command.first().is_some_and(|c| c.is_empty()) {
            return Err(ConfigError::invalid(
                format!("{at}.ping.command"),
                "the program name is empty",
            ));
        }
        Ok(())
    }
}

/// `[web]`: user names, proxies, addresses, session length.
/// `[redis]`: one way to find the master, and a `WAIT` that cannot hold the
/// shared connection past its reply timeout.
pub(crate) fn validate_redis(redis: &super::RedisConfig) -> Result<(), ConfigError> {
    let tls = |u: &String| u.starts_with("rediss://");
    if !redis.cluster.is_empty() {
        if !redis.sentinels.is_empty() {
            return Err(ConfigError::invalid(
                "redis.cluster",
                "a cluster fails over by itself: leave redis.sentinels out",
            ));
        }
        if redis.url != super::RedisConfig::default().url {
            return Err(ConfigError::invalid(
                "redis.url",
                "leave it out with redis.cluster: the cluster says where each key is",
            ));
        }
        if redis
            .cluster
            .iter()
            .any(|u| tls(u) != tls(&redis.cluster[0]))
        {
            return Err(ConfigError::invalid(
                "redis.cluster",
                "mixes redis:// and rediss://; every node is reached the same way",
            ));
        }
    }
    if redis.sentinels.is_empty() {
        if redis.master_name.is_some() {
            return Err(ConfigError::invalid(
                "redis.master_name",
                "needs redis.sentinels (the Sentinels that know it)",
            ));
        }
    } else {
        if redis.url != super::RedisConfig::default().url {
            return Err(ConfigError::invalid(
                "redis.url",
                "leave it out with redis.sentinels: the Sentinels say where the master is",
            ));
        }
        if redis.master_name.is_none() {
            return Err(ConfigError::invalid(
                "redis.master_name",
                "redis.sentinels needs the name the Sentinels monitor the master under",
            ));
        }
        if redis
            .sentinels
            .iter()
            .any(|u| tls(u) != tls(&redis.sentinels[0]))
        {
            return Err(ConfigError::invalid(
                "redis.sentinels",
                "mixes redis:// and rediss://; the master is reached the way the Sentinels are",
            ));
        }
    }
    if redis.client_cert_file.is_some() != redis.client_key_file.is_some() {
        let missing = match redis.client_cert_file {
            Some(_) => "redis.client_key_file",
            None => "redis.client_cert_file",
        };
        return Err(ConfigError::invalid(
            missing,
            "a client certificate needs both client_cert_file and client_key_file",
        ));
    }
    if redis.wait_replicas > 0
        && (redis.wait_timeout_ms == 0 || redis.wait_timeout_ms > MOST_WAIT_MS)
    {
        return Err(ConfigError::invalid(
            "redis.wait_timeout_ms",
            format!("must be between 1 and {MOST_WAIT_MS}: a WAIT holds the other commands of its connection"),
        ));
    }
    Ok(())
}

/// The longest `redis.wait_timeout_ms`: a `WAIT` holds every command queued
/// behind it on the shared connection, which times replies out after 10 s.
const MOST_WAIT_MS: u64 = 5_000;

fn validate_web(web: &WebConfig) -> Result<(), ConfigError> {
    for name in web.users.keys() {
        check_name(&format!("web.users.{name}"), name)?;
    }
    for (i, p) in web.trusted_proxies.iter().enumerate() {
        if p.parse::<std::net::IpAddr>().is_err() {
            return Err(ConfigError::invalid(
                format!("web.trusted_proxies[{i}]"),
                format!("`{p}` is not an IP address"),
            ));
        }
    }
    for (key, addr) in [
        ("web.listen", &web.listen),
        ("web.exporter_listen", &web.exporter_listen),
    ] {
        if addr.parse::<std::net::SocketAddr>().is_err() {
            return Err(ConfigError::invalid(
                key,
                format!("`{addr}` is not an address:port"),
            ));
        }
    }
    if let Some(url) = &web.public_url {
        let scheme = url.starts_with("https://") || url.starts_with("http://");
        if !scheme || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(ConfigError::invalid(
                "web.public_url",
                "must be an http(s) URL without spaces",
            ));
        }
    }
    if !(1..=24 * 30).contains(&web.session_hours) {
        return Err(ConfigError::invalid(
            "web.session_hours",
            "must be between 1 and 720",
        ));
    }
    Ok(())
}

fn check_name(key: &str, name: &str) -> Result<(), ConfigError> {
    if name.starts_with("cowboy-") {
        return Err(ConfigError::invalid(
            key,
            "names starting with `cowboy-` are reserved for service users",
        ));
    }
    if name == "default" {
        return Err(ConfigError::invalid(
            key,
            "`default` is Redis's own user (turned off by the rendered ACL): choose another name",
        ));
    }
    if crate::keys::is_name(name) {
        Ok(())
    } else {
        Err(ConfigError::invalid(
            key,
            "names may use only ASCII letters, digits, `-` and `_`",
        ))
    }
}

/// The secret an answer by `identity` is proven with, as a class (see
/// [`Identity::proof_class`]).
fn proof_class(identity: &str) -> String {
    Identity::read(identity).proof_class().to_string()
}
