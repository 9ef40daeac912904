//! The deployment config: one TOML file, one schema, shared by every binary and
//! rendered by the NixOS module.
//!
//! Invariants enforced by [`Config::load`], each failing with the key named:
//! unknown keys are refused; every bridge has a known `type`; `approval.notify`
//! names a configured bridge; `approval.required` demands a `notify_channel` and
//! at least one approver; approvers are qualified identities (`type:id`); agent
//! and bridge names are plain words that cannot collide in the key schema.
//! Secrets never sit in this file: only paths to them (`*_file`).

//!
//! # Layout
//!
//! - [`types`]: the tables of the file, each field documented, with defaults.
//! - [`validate`]: the checks [`Config::load`] makes, one function per section.
//! - [`secret`]: secret files (`*_file`), read at start-up.

mod secret;
mod types;
mod validate;

pub use secret::{read_secret, secret_path};
pub use types::*;
pub(crate) use validate::validate_redis;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::ConfigError;
use crate::identity::canonical;

/// Surfaces an approver identity may come from besides the bridges'
/// platforms: the operator CLI and the page.
pub const BROKER_SURFACES: &[&str] = &["cli", "web"];

/// Every kind of approver identity (`KIND:id`): the registry's surface
/// types, then [`BROKER_SURFACES`].
pub fn approver_kinds() -> Vec<&'static str> {
    let platforms = registry::kinds().iter().filter(|k| k.surface);
    platforms
        .map(|k| k.name.as_str())
        .chain(BROKER_SURFACES.iter().copied())
        .collect()
}

/// A whole deployment.
#[derive(Debug, Clone)]
pub struct Config {
    /// How to reach Redis.
    pub redis: RedisConfig,
    /// Agents whose per-agent streams (`{agent}:{bridge}:outbox|inbox`) every bridge serves.
    pub agents: BTreeMap<String, AgentConfig>,
    /// The bridges of this deployment, by name.
    pub bridges: BTreeMap<String, BridgeConfig>,
    /// Operators who decide through the CLI as `cli:NAME`, each its own Redis user.
    pub operators: BTreeMap<String, OperatorConfig>,
    /// `[people.NAME]`: the humans behind approver identities (a quorum counts people).
    pub people: BTreeMap<String, PersonConfig>,
    /// `[audit]`: how long the audit trail keeps its entries.
    pub audit: AuditConfig,
    /// `[web]`: the approval page and metrics, when configured.
    pub web: Option<WebConfig>,
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            },
            other => other,
        })
    }

    /// Parses and validates config text.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::new(),
            message: e.to_string(),
        })?;
        let mut bridges = BTreeMap::new();
        for (name, table) in raw.bridges {
            let mut bridge = BridgeConfig::from_table(&name, table)?;
            // An escalation step names people: each stands for every
            // identity the config gives them.
            for (i, step) in bridge.approval.escalate.iter_mut().enumerate() {
                for (j, person) in step.people.iter().enumerate() {
                    let Some(p) = raw.people.get(person) else {
                        return Err(ConfigError::invalid(
                            format!("bridges.{name}.approval.escalate[{i}].people[{j}]"),
                            format!("`{person}` names no [people.NAME] entry"),
                        ));
                    };
                    for identity in &p.identities {
                        if !step.approvers.contains(identity) {
                            step.approvers.push(identity.clone());
                        }
                    }
                }
            }
            bridges.insert(name, bridge);
        }
        let config = Config {
            redis: raw.redis,
            agents: raw.agents,
            bridges,
            operators: raw.operators,
            people: raw.people,
            audit: raw.audit,
            web: raw.web,
        };
        config.validate()?;
        Ok(config)
    }

    /// The bridge called `name`, or an error naming the missing key.
    pub fn bridge(&self, name: &str) -> Result<&BridgeConfig, ConfigError> {
        self.bridges
            .get(name)
            .ok_or_else(|| ConfigError::invalid(format!("bridges.{name}"), "no such bridge"))
    }

    /// The bridge that carries `name`'s approval notifications.
    /// The `[people]` entry `identity` belongs to (emails compare without case).
    pub fn person_of(&self, identity: &str) -> Option<&str> {
        let identity = canonical(identity);
        self.people
            .iter()
            .find(|(_, p)| p.identities.iter().any(|i| canonical(i) == identity))
            .map(|(name, _)| name.as_str())
    }

    /// What a quorum counts an answer as: its person (`person:NAME`), or the
    /// identity itself when no person claims it (`identity:TYPE:ID`).
    pub fn counting_key(&self, identity: &str) -> String {
        match self.person_of(identity) {
            Some(name) => person_key(name),
            None => format!("identity:{}", canonical(identity)),
        }
    }

    /// The counting key of person `name` (what a delegate counts as).
    pub fn person_key_of(&self, name: &str) -> String {
        person_key(name)
    }

    pub fn notify_bridge<'a>(&'a self, name: &'a str) -> &'a str {
        self.bridges
            .get(name)
            .and_then(|b| b.approval.notify.as_deref())
            .unwrap_or(name)
    }

    /// The bridge that carries bridge `name`'s digest of waiting approvals,
    /// when it has one (`approval.digest_to`, default its notify bridge).
    pub fn digest_bridge<'a>(&'a self, name: &'a str) -> Option<&'a str> {
        let approval = &self.bridges.get(name)?.approval;
        approval.digest?;
        Some(
            approval
                .digest_to
                .as_deref()
                .unwrap_or(self.notify_bridge(name)),
        )
    }

    /// The Redis settings a service of bridge `name` connects with: its own ACL user
    /// (`cowboy-{bridge}-{service}`) when it has a password file, else `[redis]`.
    /// `COWBOY_REDIS_USERNAME` / `COWBOY_REDIS_PASSWORD_FILE` override both (for
    /// supervisors that hand each unit its own credential path).
    pub fn redis_for(&self, name: &str, service: Service) -> RedisConfig {
        let mut redis = self.redis.clone();
        if let Some(file) = self
            .bridges
            .get(name)
            .and_then(|b| b.redis_password_files.of(service))
        {
            redis.username = Some(crate::keys::service_user(name, service.as_str()));
            redis.password_file = Some(file.clone());
        }
        if let Ok(user) = std::env::var("COWBOY_REDIS_USERNAME") {
            redis.username = Some(user);
        }
        if let Ok(file) = std::env::var("COWBOY_REDIS_PASSWORD_FILE") {
            redis.password_file = Some(file.into());
        }
        redis
    }

    /// Every surface bridge `name`'s approvals may be asked on, as (notify
    /// bridge, channel): `approval.notify` first, then `approval.also`, then
    /// each escalation step's.
    pub fn surfaces_of<'a>(&'a self, name: &'a str) -> Vec<(&'a str, &'a str)> {
        let Some(bridge) = self.bridges.get(name) else {
            return Vec::new();
        };
        let approval = &bridge.approval;
        std::iter::once((self.notify_bridge(name), approval.notify_channel.as_str()))
            .chain(
                approval
                    .also
                    .iter()
                    .map(|s| (s.notify.as_str(), s.notify_channel.as_str())),
            )
            .chain(
                approval
                    .escalate
                    .iter()
                    .map(|s| (s.notify.as_str(), s.notify_channel.as_str())),
            )
            .collect()
    }

    /// The escalation step (0-based) that asks surface `surface` for bridge
    /// `name`'s approvals, if a step does (not `notify`, not `also`).
    pub fn step_of(&self, name: &str, surface: &str) -> Option<usize> {
        let approval = &self.bridges.get(name)?.approval;
        approval.escalate.iter().position(|s| s.notify == surface)
    }

    /// Where surface `surface` shows the cards of an approval of bridge
    /// `name` that took `escalated` steps of its ladder: `notify` and `also`
    /// always, a step's surface once the step was taken.
    pub fn card_channel_at<'a>(
        &'a self,
        name: &'a str,
        surface: &str,
        escalated: u32,
    ) -> Option<&'a str> {
        match self.step_of(name, surface) {
            Some(step) if step >= escalated as usize => None,
            _ => self.card_channel_on(name, surface),
        }
    }

    /// Where surface `surface` shows bridge `name`'s cards, if it shows them.
    pub fn card_channel_on<'a>(&'a self, name: &'a str, surface: &str) -> Option<&'a str> {
        self.surfaces_of(name)
            .into_iter()
            .find(|(b, _)| *b == surface)
            .map(|(_, c)| c)
    }

    /// The bridges that park entries and ask through `name` (approval required,
    /// `notify` or `also` naming it). Only these make `name` an approval surface.
    pub fn requesters_of<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> {
        self.bridges
            .iter()
            .filter(move |(b, c)| c.approval.required && self.card_channel_on(b, name).is_some())
            .map(|(b, _)| b.as_str())
    }

    /// The destinations on bridge `name` where approval requests are shown,
    /// and where digests of waiting approvals go: no agent message may go
    /// there, so nothing but the broker's cards and digests appears in front
    /// of approvers (an agent's look-alike card would be one click away).
    pub fn approval_channels<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> {
        self.card_channels(name).chain(
            self.digests_carried_by(name)
                .filter_map(|b| self.bridges.get(b))
                .map(|b| b.approval.digest_channel.as_str()),
        )
    }

    /// Where bridge `name` shows other bridges' (or its own) cards.
    pub fn card_channels<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> {
        self.requesters_of(name)
            .filter_map(move |b| self.card_channel_on(b, name))
    }

    /// The bridges whose digest bridge `name` carries.
    pub fn digests_carried_by<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> {
        self.bridges
            .keys()
            .map(String::as_str)
            .filter(move |b| self.digest_bridge(b) == Some(name))
    }

    /// Whether `name` carries some bridge's approval notifications, so its ingest
    /// may decide and its outbox may show cards.
    pub fn is_approval_surface(&self, name: &str) -> bool {
        self.requesters_of(name).next().is_some()
    }

    /// Agent names, in a stable order.
    pub fn agent_names(&self) -> impl Iterator<Item = &str> {
        self.agents.keys().map(String::as_str)
    }
}

/// How a quorum counts person `name` (see [`Config::counting_key`]).
fn person_key(name: &str) -> String {
    format!("person:{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        Config::parse(text).unwrap_err().to_string()
    }

    #[test]
    fn minimal_config_loads_with_protocol_defaults() {
        let c = Config::parse("[bridges.c]\ntype = \"console\"\n").unwrap();
        let b = c.bridge("c").unwrap();
        assert!(!b.approval.required);
        assert_eq!(b.approval.timeout, 3600);
        assert_eq!(c.notify_bridge("c"), "c");
        assert!(b.destinations.is_empty());
    }

    /// `[redis]` finds the master one way: a url, or Sentinels with the
    /// name they know it by; a WAIT may not outlast the connection's timeout.
    #[test]
    fn redis_topology_is_one_way_and_named() {
        let redis = |t: &str| err(&format!("[redis]\n{t}\n[bridges.c]\ntype = \"console\"\n"));
        let s = "sentinels = [\"redis://127.0.0.1:26379\"]\n";
        assert!(redis(&format!("{s}url = \"redis://127.0.0.1:7000\"")).contains("redis.url"));
        assert!(redis(s).contains("redis.master_name"));
        assert!(redis("master_name = \"m\"").contains("redis.master_name"));
        assert!(redis(
            "sentinels = [\"redis://127.0.0.1:1\", \"rediss://h:2\"]\nmaster_name = \"m\""
        )
        .contains("redis.sentinels"));
        assert!(
            redis("wait_replicas = 1\nwait_timeout_ms = 9000").contains("redis.wait_timeout_ms")
        );
        let ok = Config::parse(&format!(
            "[redis]\n{s}master_name = \"m\"\nwait_replicas = 1\n[bridges.c]\ntype = \"console\"\n"
        ))
        .unwrap();
        assert_eq!(ok.redis.wait_timeout_ms, 1000);
    }

    #[test]
    fn bad_config_names_the_key() {
        assert!(err("[bridges.c]\ntype = \"fax\"\n").contains("bridges.c.type"));
        assert!(
            err("[bridges.c]\ntype = \"console\"\napproval = { notify = \"nope\" }\n")
                .contains("bridges.c.approval.notify")
        );
        assert!(err(
            "[bridges.c]\ntype = \"console\"\napproval = { required = true, approvers = [\"cli:a\"] }\n"
        )
        .contains("bridges.c.approval.notify_channel"));
        assert!(err(
            "[bridges.c]\ntype = \"console\"\napproval = { required = true, notify_channel = \"x\" }\n"
        )
        .contains("bridges.c.approval.approvers"));
        // Cards to a channel the showing bridge may not post to: every
        // approval would be rejected unshown.
        let unshowable = err(
            "[bridges.c]\ntype = \"console\"\ndestinations = [\"y\"]\napproval = { required = true, notify_channel = \"x\", approvers = [\"cli:a\"] }\n",
        );
        assert!(
            unshowable.contains("bridges.c.approval.notify_channel")
                && unshowable.contains("destinations"),
            "{unshowable}"
        );
        assert!(
            err("[bridges.c]\ntype = \"console\"\napproval = { approvers = [\"ann\"] }\n")
                .contains("bridges.c.approval.approvers[0]")
        );
        // A digest: through a bridge that would hold it for approval, to an
        // approval channel (refused there), or off the destinations.
        let digest = |extra: &str, to: &str| {
            format!("[bridges.c]\ntype = \"console\"\ndestinations = [\"*\"]\napproval = {{ required = true, notify = \"e\", notify_channel = \"o\", approvers = [\"cli:a\"], digest = \"daily\", {extra} }}\n[bridges.e]\ntype = \"console\"\ndestinations = [\"o\", \"d\"]\n{to}")
        };
        assert!(Config::parse(&digest("digest_channel = \"d\"", "")).is_ok());
        assert!(err(&digest("digest_channel = \"o\"", "")).contains("approval requests are shown"));
        // Agents may not post where a digest goes.
        let config = Config::parse(&digest("digest_channel = \"d\"", "")).unwrap();
        assert!(config.approval_channels("e").any(|c| c == "d"));
        for (extra, key) in [
            (
                "digest_channel = \"o\"",
                "bridges.c.approval.digest_channel",
            ),
            (
                "digest_channel = \"x\"",
                "bridges.c.approval.digest_channel",
            ),
            (
                "digest_channel = \"d\", digest_to = \"nope\"",
                "bridges.c.approval.digest_to",
            ),
            (
                "digest_channel = \"d\", digest_to = \"c\"",
                "bridges.c.approval.digest_to",
            ),
        ] {
            assert!(err(&digest(extra, "")).contains(key), "{extra}");
        }
        assert!(err("[redis]\nurl = \"redis://x\"\nport = 1\n").contains("port"));
        assert!(err("[agents.c]\n[bridges.c]\ntype = \"console\"\n").contains("bridges.c"));
        assert!(err("[bridges.\"a:b\"]\ntype = \"console\"\n").contains("bridges.a:b"));
    }

    #[test]
    fn a_quorum_counts_distinct_proven_people() {
        let bridge = |approval: &str| {
            format!("[bridges.c]\ntype = \"console\"\ndestinations = [\"o\"]\napproval = {{ required = true, notify_channel = \"o\", {approval} }}\n")
        };
        let twice = err(&bridge(r#"approvers = ["email:A@x.org", "email:a@x.org"]"#));
        assert!(
            twice.contains("bridges.c.approval.approvers") && twice.contains("twice"),
            "{twice}"
        );
        let unreachable = err(&bridge(r#"approvers = ["console:a"], quorum = 2"#));
        assert!(
            unreachable.contains("bridges.c.approval.quorum"),
            "{unreachable}"
        );
        let labels = err(&bridge(r#"approvers = ["cli:a", "cli:b"], quorum = 2"#));
        assert!(labels.contains("[operators]"), "{labels}");
        let strangers = err(&bridge(
            r#"approvers = ["console:a", "discord:1"], quorum = 2"#,
        ));
        assert!(
            strangers.contains("approvers[0]") && strangers.contains("[people"),
            "{strangers}"
        );
        let people = "[people.a]\nidentities = [\"console:a\", \"discord:9\"]\n[people.b]\nidentities = [\"discord:1\"]\n";
        // Two people behind one service password: refused unless trusted.
        let shared = err(&format!(
            "{people}{}",
            bridge(r#"approvers = ["console:a", "discord:1"], quorum = 2"#)
        ));
        assert!(
            shared.contains("bridges.c.approval.quorum") && shared.contains("trust_surfaces"),
            "{shared}"
        );
        Config::parse(&format!(
            "{people}{}",
            bridge(r#"approvers = ["console:a", "discord:1"], quorum = 2, trust_surfaces = true"#)
        ))
        .unwrap();
        // An operator's own Redis user is a proof of its own.
        Config::parse(&format!(
            "{people}[people.o]\nidentities = [\"cli:o\"]\n[operators.o]\npassword_file = \"/x\"\n{}",
            bridge(r#"approvers = ["console:a", "cli:o"], quorum = 2"#)
        ))
        .unwrap();
        // One person on two surfaces is one: a quorum of two needs another.
        let one = err(&format!(
            "{people}{}",
            bridge(r#"approvers = ["console:a", "discord:9"], quorum = 2"#)
        ));
        assert!(
            one.contains("approval.quorum") && one.contains("people"),
            "{one}"
        );
        let claimed = err("[people.a]\nidentities = [\"email:A@x.org\"]\n[people.b]\nidentities = [\"email:a@x.org\"]\n");
        assert!(
            claimed.contains("people.b.identities[0]") && claimed.contains("people.a"),
            "{claimed}"
        );
        let reserved = err("[operators.default]\npassword_file = \"/x\"\n");
        assert!(reserved.contains("operators.default"), "{reserved}");
        let retention = err("[audit]\nretention_days = 0\n");
        assert!(retention.contains("audit.retention_days"), "{retention}");
    }

    #[test]
    fn approvers_fail_closed() {
        let mut a = ApprovalConfig::default();
        assert!(!a.allows("cli:root"));
        a.approvers = vec!["email:Ann@Example.org".into(), "discord:42".into()];
        assert!(a.allows("email:ann@example.org"));
        assert!(a.allows("discord:42"));
        assert!(!a.allows("console:42"));
        assert!(!a.allows("discord:4"));
    }

    #[test]
    fn destinations_are_an_allow_list() {
        let mut c = Config::parse("[bridges.c]\ntype = \"console\"\n").unwrap();
        let b = c.bridges.get_mut("c").unwrap();
        assert!(!b.allows_destination("x"));
        b.destinations = vec![
            "ops-*".into(),
            "exact".into(),
            "*@example.org".into(),
            "a*b*c".into(),
        ];
        assert!(b.allows_destination("ops-1"));
        assert!(b.allows_destination("ann@example.org"));
        assert!(!b.allows_destination("ann@example.org.evil"));
        assert!(b.allows_destination("abc"));
        assert!(b.allows_destination("a-b-c"));
        assert!(!b.allows_destination("a-c-b"));
        assert!(b.allows_destination("exact"));
        assert!(!b.allows_destination("exactly"));
    }

    /// More surfaces and the ladder: each a configured bridge asked once, on
    /// a channel it may show, the steps in order before the deadline; the
    /// surfaces and approvers they bring are known to the config.
    #[test]
    fn more_surfaces_and_escalation_steps_are_checked() {
        let with = |approval: &str| {
            format!("[bridges.c]\ntype = \"console\"\ndestinations = [\"*\"]\napproval = {{ required = true, notify = \"e\", notify_channel = \"o\", approvers = [\"cli:a\"], timeout = 600, {approval} }}\n[bridges.e]\ntype = \"console\"\ndestinations = [\"o\"]\n[bridges.f]\ntype = \"console\"\ndestinations = [\"p\"]\n[bridges.g]\ntype = \"console\"\ndestinations = [\"q\"]\n")
        };
        let good = Config::parse(&with(
            "also = [{ notify = \"f\", notify_channel = \"p\" }], escalate = [{ after = 60, notify = \"g\", notify_channel = \"q\", approvers = [\"cli:b\"] }]",
        ))
        .unwrap();
        assert_eq!(
            good.surfaces_of("c"),
            [("e", "o"), ("f", "p"), ("g", "q")],
            "notify, also, then the ladder"
        );
        assert!(good.is_approval_surface("g") && good.card_channels("g").any(|c| c == "q"));
        let approval = &good.bridges["c"].approval;
        assert!(!approval.allows("cli:b") && approval.allows_at("cli:b", 1));
        assert!(!approval.allows_at("cli:b", 0) && approval.allows_ever("cli:b"));
        for (approval, key) in [
            ("also = [{ notify = \"nope\", notify_channel = \"p\" }]", "bridges.c.approval.also[0].notify"),
            ("also = [{ notify = \"e\", notify_channel = \"o\" }]", "bridges.c.approval.also[0].notify"),
            ("also = [{ notify = \"f\", notify_channel = \"x\" }]", "bridges.c.approval.also[0].notify_channel"),
            (
                "also = [{ notify = \"f\", notify_channel = \"p\" }], escalate = [{ after = 9, notify = \"f\", notify_channel = \"p\" }]",
                "bridges.c.approval.escalate[0].notify",
            ),
            ("escalate = [{ after = 600, notify = \"g\", notify_channel = \"q\" }]", "bridges.c.approval.escalate[0].after"),
            (
                "escalate = [{ after = 60, notify = \"g\", notify_channel = \"q\" }, { after = 60, notify = \"f\", notify_channel = \"p\" }]",
                "bridges.c.approval.escalate[1].after",
            ),
            (
                "escalate = [{ after = 60, notify = \"g\", notify_channel = \"q\", approvers = [\"nobody\"] }]",
                "bridges.c.approval.escalate[0].approvers[0]",
            ),

        ] {
            assert!(err(&with(approval)).contains(key), "{approval}: {}", err(&with(approval)));
        }
        // A step may name people: all their identities answer from the step.
        let by_person = format!("{}[people.carol]\nidentities = [\"cli:carol\", \"console:carol\"]\n", with("escalate = [{ after = 60, notify = \"g\", notify_channel = \"q\", people = [\"carol\"] }]"));
        let by_person = Config::parse(&by_person).unwrap_or_else(|e| panic!("{e}"));
        let step = &by_person.bridges["c"].approval;
        assert!(step.allows_at("console:carol", 1) && step.allows_at("cli:carol", 1));
        assert!(!step.allows_at("console:carol", 0));
        assert!(err(&with("escalate = [{ after = 60, notify = \"g\", notify_channel = \"q\", people = [\"nobody\"] }]"))
            .contains("bridges.c.approval.escalate[0].people[0]"));
        // Under a quorum, a step's cli: approvers need [operators] too: else
        // one shell user could answer as both once the step is taken.
        let people = "[people.a]\nidentities = [\"console:a\"]\n[people.b]\nidentities = [\"console:b\"]\n[people.x]\nidentities = [\"cli:x\"]\n[people.y]\nidentities = [\"cli:y\"]\n";
        let shell = format!("[bridges.c]\ntype = \"console\"\ndestinations = [\"*\"]\napproval = {{ required = true, notify = \"e\", notify_channel = \"o\", approvers = [\"console:a\", \"console:b\"], quorum = 2, trust_surfaces = true, timeout = 600, escalate = [{{ after = 60, notify = \"g\", notify_channel = \"q\", approvers = [\"cli:x\", \"cli:y\"] }}] }}\n[bridges.e]\ntype = \"console\"\ndestinations = [\"o\"]\n[bridges.g]\ntype = \"console\"\ndestinations = [\"q\"]\n{people}");
        assert!(err(&shell).contains("needs [operators]"), "{}", err(&shell));
    }
}
