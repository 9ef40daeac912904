//! The deployment config: one TOML file, one schema, shared by every binary and
//! rendered by the NixOS module.
//!
//! Invariants enforced by [`Config::load`], each failing with the key named:
//! unknown keys are refused; every bridge has a known `type`; `approval.notify`
//! names a configured bridge; `approval.required` demands a `notify_channel` and
//! at least one approver; approvers are qualified identities (`type:id`); agent
//! and bridge names are plain words that cannot collide in the key schema.
//! Secrets never sit in this file: only paths to them (`*_file`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::ConfigError;
use crate::identity::{canonical, Identity};

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

/// `[web]`: the approval page (`cowboy web`) and the metrics exporter.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebConfig {
    /// Where the page listens (loopback by default: put TLS in front).
    #[serde(default = "default_web_listen")]
    pub listen: String,
    /// Where `cowboy exporter` serves `/metrics` alone.
    #[serde(default = "default_exporter_listen")]
    pub exporter_listen: String,
    /// Who may log in; each decides as approver `web:NAME`.
    #[serde(default)]
    pub users: BTreeMap<String, WebUserConfig>,
    /// How long a login lasts.
    #[serde(default = "default_session_hours")]
    pub session_hours: u64,
    /// A file holding the key sessions are signed with (32 bytes or more);
    /// without it a random key is made at start-up, and a restart logs everyone out.
    #[serde(default)]
    pub session_key_file: Option<PathBuf>,
    /// Mark cookies `Secure`: set when the page is served over TLS (a proxy).
    #[serde(default)]
    pub secure_cookies: bool,
    /// The password of the page's own Redis user `cowboy-web`.
    #[serde(default)]
    pub redis_password_file: Option<PathBuf>,
    /// Addresses of the reverse proxies in front of the page: from them the
    /// client is the rightmost `X-Forwarded-For` address that is not one of
    /// them (failed logins are counted per client).
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    /// The password of `cowboy exporter`'s own Redis user `cowboy-exporter`,
    /// which only reads; without it the exporter connects as `[redis]`.
    #[serde(default)]
    pub exporter_password_file: Option<PathBuf>,
}

/// `[web.users.NAME]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebUserConfig {
    /// A file holding the Argon2 PHC hash `cowboy web hash-password` prints.
    pub password_file: PathBuf,
}

fn default_web_listen() -> String {
    "127.0.0.1:8787".into()
}

fn default_exporter_listen() -> String {
    "127.0.0.1:9787".into()
}

fn default_session_hours() -> u64 {
    8
}

/// `[audit]`: the audit trail (`{bridge}:audit`, see [`crate::audit`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditConfig {
    /// Days an audit entry is kept; older ones are trimmed by the appends.
    #[serde(default = "default_retention_days")]
    pub retention_days: u64,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            retention_days: default_retention_days(),
        }
    }
}

fn default_retention_days() -> u64 {
    90
}

/// The file as written; bridges are split into common keys and settings afterwards.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// `[redis]`.
    #[serde(default)]
    pub redis: RedisConfig,
    /// `[agents.NAME]`.
    #[serde(default)]
    pub agents: BTreeMap<String, AgentConfig>,
    /// `[bridges.NAME]`.
    #[serde(default)]
    pub bridges: BTreeMap<String, toml::Table>,
    /// `[operators.NAME]`.
    #[serde(default)]
    pub operators: BTreeMap<String, OperatorConfig>,
    /// `[people.NAME]`.
    #[serde(default)]
    pub people: BTreeMap<String, PersonConfig>,
    /// `[audit]`.
    #[serde(default)]
    pub audit: AuditConfig,
    /// `[web]`.
    #[serde(default)]
    pub web: Option<WebConfig>,
}

/// `[operators.NAME]`: a person who decides with the CLI. With any operator
/// declared, `cli:NAME` decides only over a connection as Redis user NAME
/// (checked with `ACL WHOAMI`), so the name is proven, not typed.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorConfig {
    /// File holding the operator's Redis password (`cowboy acl` renders the user).
    pub password_file: PathBuf,
}

/// `[people.NAME]`: one human and every identity they answer with, on every
/// surface (`cli:ann`, `web:ann`, `discord:1234`, `email:ann@example.org`).
/// A quorum counts people, not identities, so one human who answers on two
/// surfaces counts once.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PersonConfig {
    pub identities: Vec<String>,
}

/// `[redis]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// Connection URL, e.g. `redis://127.0.0.1:6379`. Keep passwords out of it:
    /// use `username` and `password_file`.
    #[serde(default = "default_redis_url")]
    pub url: String,
    /// ACL user to authenticate as (overrides the URL's).
    #[serde(default)]
    pub username: Option<String>,
    /// File holding that user's password (systemd `LoadCredential` friendly).
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// PEM certificates of the CA that signed the server's, trusted for a
    /// `rediss://` URL instead of the system's roots (a private CA).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Allows `redis://` (no TLS) to a host that is not loopback, where
    /// passwords and messages would cross the network in clear.
    #[serde(default)]
    pub allow_plaintext: bool,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            url: default_redis_url(),
            username: None,
            password_file: None,
            ca_file: None,
            allow_plaintext: false,
        }
    }
}

fn default_redis_url() -> String {
    "redis://127.0.0.1:6379".to_string()
}

/// `[agents.NAME]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// File holding the agent's Redis password (used by `cowboy acl`).
    #[serde(default)]
    pub password_file: Option<PathBuf>,
}

/// `[bridges.NAME]`: the keys every bridge has ([`BridgeCommon`]), plus its type's own
/// settings, kept apart so the bridge crate can refuse the keys it does not know.
#[derive(Debug, Clone)]
pub struct BridgeConfig {
    pub common: BridgeCommon,
    /// The type's own settings (validated by the bridge crate, which refuses unknown keys).
    pub settings: toml::Table,
}

impl std::ops::Deref for BridgeConfig {
    type Target = BridgeCommon;
    fn deref(&self) -> &BridgeCommon {
        &self.common
    }
}

impl std::ops::DerefMut for BridgeConfig {
    fn deref_mut(&mut self) -> &mut BridgeCommon {
        &mut self.common
    }
}

/// The keys every bridge has, whatever its type.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeCommon {
    /// Which platform: a type of the bridge registry ([`registry::kinds`]).
    #[serde(rename = "type")]
    pub kind: String,
    /// The approval gate of this bridge (the protocol's `approval` options).
    #[serde(default)]
    pub approval: ApprovalConfig,
    /// The inbox-side wake-up command.
    #[serde(default)]
    pub ping: PingConfig,
    /// Destinations (`channel_id` values) this bridge may deliver to. Empty: none.
    /// `*` matches any run of characters (`"*@example.org"`, `"ops-*"`); `"*"` allows any.
    #[serde(default)]
    pub destinations: Vec<String>,
    /// Largest accepted `content`, in bytes.
    #[serde(default = "default_max_content_bytes")]
    pub max_content_bytes: usize,
    /// Outbox entries read per round trip.
    #[serde(default = "default_batch")]
    pub batch: usize,
    /// Deliveries under way at once, side by side (one per destination at a time).
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// Attempts at a delivery that keeps failing transiently (rate limits, an
    /// unreachable server) before it is dead-lettered with the last error.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// Seconds after its first failure that such a delivery is given up.
    #[serde(default = "default_max_retry_seconds")]
    pub max_retry_seconds: u64,
    /// Seconds a worker may go without reading before another worker of the
    /// same bridge takes over its entries (parked ones included).
    #[serde(default = "default_claim_idle_seconds")]
    pub claim_idle_seconds: u64,
    /// Times an entry may be handed to a worker (the pending list's delivery
    /// count: restarts and takeovers) without an outcome before it is
    /// dead-lettered as poison. Parked entries are exempt: they wait by design.
    #[serde(default = "default_max_deliveries")]
    pub max_deliveries: u64,
    /// Seconds of handled history kept in this bridge's outbox streams and
    /// inboxes (never cutting what a group still needs). 0 keeps everything.
    #[serde(default = "default_retention_seconds")]
    pub retention_seconds: u64,
    /// Seconds dead letters are kept. 0 keeps them forever.
    #[serde(default = "default_dead_letter_retention_seconds")]
    pub dead_letter_retention_seconds: u64,
    /// Password files of this bridge's own Redis users (`cowboy-{bridge}-{service}`).
    /// A service with a file here authenticates as its own user; `cowboy acl` renders it.
    #[serde(default)]
    pub redis_password_files: ServicePasswords,
}

impl BridgeConfig {
    /// Splits a `[bridges.NAME]` table into the common keys and the type's settings.
    fn from_table(name: &str, mut table: toml::Table) -> Result<BridgeConfig, ConfigError> {
        let gated = table
            .get("type")
            .and_then(|t| t.as_str())
            .and_then(registry::kind)
            .is_some_and(|k| k.gated);
        if gated {
            let approval = table
                .entry("approval")
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if let Some(approval) = approval.as_table_mut() {
                match approval.get("required") {
                    Some(toml::Value::Boolean(false)) => {
                        return Err(ConfigError::invalid(
                            format!("bridges.{name}.approval.required"),
                            "this bridge type always asks for approval: remove the key",
                        ))
                    }
                    _ => {
                        approval.insert("required".into(), toml::Value::Boolean(true));
                    }
                }
            }
        }
        let mut common = toml::Table::new();
        for key in crate::schema::field_names::<BridgeCommon>() {
            if let Some(v) = table.remove(*key) {
                common.insert(key.to_string(), v);
            }
        }
        let common: BridgeCommon = serde_path_to_error::deserialize(toml::Value::Table(common))
            .map_err(|e| located(&format!("bridges.{name}"), e))?;
        Ok(BridgeConfig {
            common,
            settings: table,
        })
    }
}

fn default_max_content_bytes() -> usize {
    64 * 1024
}

fn default_batch() -> usize {
    64
}

fn default_max_in_flight() -> usize {
    32
}

fn default_max_attempts() -> u32 {
    50
}

fn default_max_retry_seconds() -> u64 {
    3600
}

fn default_claim_idle_seconds() -> u64 {
    60
}

fn default_max_deliveries() -> u64 {
    10
}

fn default_retention_seconds() -> u64 {
    24 * 3600
}

fn default_dead_letter_retention_seconds() -> u64 {
    30 * 24 * 3600
}

/// `redis_password_files = { ingest = PATH, outbox = PATH, ping = PATH }`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServicePasswords {
    /// Password file of `cowboy-{bridge}-ingest`.
    #[serde(default)]
    pub ingest: Option<PathBuf>,
    /// Password file of `cowboy-{bridge}-outbox`.
    #[serde(default)]
    pub outbox: Option<PathBuf>,
    /// Password file of `cowboy-{bridge}-ping`.
    #[serde(default)]
    pub ping: Option<PathBuf>,
}

impl ServicePasswords {
    /// The file of one service (`ingest`, `outbox` or `ping`).
    pub fn of(&self, service: Service) -> Option<&PathBuf> {
        match service {
            Service::Ingest => self.ingest.as_ref(),
            Service::Outbox => self.outbox.as_ref(),
            Service::Ping => self.ping.as_ref(),
        }
    }
}

/// The three services of a bridge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Service {
    Ingest,
    Outbox,
    Ping,
}

impl Service {
    pub const ALL: [Service; 3] = [Service::Ingest, Service::Outbox, Service::Ping];

    pub fn as_str(self) -> &'static str {
        match self {
            Service::Ingest => "ingest",
            Service::Outbox => "outbox",
            Service::Ping => "ping",
        }
    }
}

/// `approval = { required, notify, notify_channel, timeout, approvers }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalConfig {
    /// Hold outbound messages until a human approves them.
    #[serde(default)]
    pub required: bool,
    /// Which bridge's outbox carries the approval notifications (default: this bridge).
    #[serde(default)]
    pub notify: Option<String>,
    /// Destination within the notify bridge (channel id, address, ...).
    #[serde(default)]
    pub notify_channel: String,
    /// Seconds before a pending approval reads as expired; 0 means never.
    #[serde(default = "default_timeout")]
    pub timeout: u64,
    /// Who may decide, as `type:id` (`discord:1234`, `email:ann@example.org`,
    /// `console:ann`, `cli:ann`). Empty: nobody can approve.
    #[serde(default)]
    pub approvers: Vec<String>,
    /// How many distinct people must approve; one rejection rejects.
    #[serde(default = "default_quorum")]
    pub quorum: u32,
    /// Most approvals one agent may have waiting on this bridge; beyond it
    /// its entries are refused (`limit_reached`), so one agent's flood
    /// cannot fill Redis or bury the others' requests. 0: no limit.
    #[serde(default = "default_max_parked_per_agent")]
    pub max_parked_per_agent: u64,
    /// Most content bytes one agent's waiting approvals on this bridge may
    /// hold in all; an entry that would go beyond is refused
    /// (`limit_reached`). 0: no limit.
    #[serde(default = "default_max_parked_bytes_per_agent")]
    pub max_parked_bytes_per_agent: u64,
    /// Most approvals waiting on this bridge in all (agents and the flat
    /// stream). 0: no limit.
    #[serde(default)]
    pub max_parked: u64,
    /// Under a quorum above 1, whether an approver who edited the message
    /// counts toward its quorum. Off by default: the editor proposes, others
    /// dispose.
    #[serde(default)]
    pub editors_count: bool,
    /// Under a quorum above 1, whether several people answering through one
    /// service password (the notify bridge's ingest, which reports every
    /// reaction or reply on its platform; the page's, which speaks for every
    /// `web:` user) count as several. Off by default: one password counts
    /// once, so no single secret meets a quorum; operators, each with a
    /// Redis user of their own, always count apart.
    #[serde(default)]
    pub trust_surfaces: bool,
}

fn default_quorum() -> u32 {
    1
}

fn default_max_parked_per_agent() -> u64 {
    1000
}

fn default_max_parked_bytes_per_agent() -> u64 {
    16 * 1024 * 1024
}

impl Default for ApprovalConfig {
    fn default() -> Self {
        ApprovalConfig {
            required: false,
            notify: None,
            notify_channel: String::new(),
            timeout: default_timeout(),
            approvers: Vec::new(),
            quorum: default_quorum(),
            max_parked_per_agent: default_max_parked_per_agent(),
            max_parked_bytes_per_agent: default_max_parked_bytes_per_agent(),
            max_parked: 0,
            editors_count: false,
            trust_surfaces: false,
        }
    }
}

fn default_timeout() -> u64 {
    3600
}

/// `ping = { command = [...], debounce_ms = 250 }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PingConfig {
    /// argv of the wake command; the newest entry's fields arrive as environment variables.
    #[serde(default)]
    pub command: Vec<String>,
    /// How long to gather a burst before running the command once.
    #[serde(default = "default_debounce")]
    pub debounce_ms: u64,
}

impl Default for PingConfig {
    fn default() -> Self {
        PingConfig {
            command: Vec::new(),
            debounce_ms: default_debounce(),
        }
    }
}

fn default_debounce() -> u64 {
    250
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
            let bridge = BridgeConfig::from_table(&name, table)?;
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

    fn validate(&self) -> Result<(), ConfigError> {
        if let Some(web) = &self.web {
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
            if !(1..=24 * 30).contains(&web.session_hours) {
                return Err(ConfigError::invalid(
                    "web.session_hours",
                    "must be between 1 and 720",
                ));
            }
        }
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
        for (name, bridge) in &self.bridges {
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
            for (i, who) in approval.approvers.iter().enumerate() {
                let ok = Identity::parse(who);
                let unproven = who.strip_prefix("cli:").is_some_and(|op| {
                    !self.operators.is_empty() && !self.operators.contains_key(op)
                });
                let no_such_web_user = who
                    .strip_prefix("web:")
                    .is_some_and(|u| !self.web.as_ref().is_some_and(|w| w.users.contains_key(u)));
                if no_such_web_user {
                    return Err(ConfigError::invalid(
                        format!("{at}.approval.approvers[{i}]"),
                        format!("`{who}` names no `[web.users]` entry"),
                    ));
                }
                if unproven {
                    return Err(ConfigError::invalid(
                        format!("{at}.approval.approvers[{i}]"),
                        format!("`{who}` names no `[operators]` entry (with operators declared, every cli: approver must be one)"),
                    ));
                }
                if let Err(why) = ok {
                    return Err(ConfigError::invalid(
                        format!("{at}.approval.approvers[{i}]"),
                        why,
                    ));
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
            let labels = approval.approvers.iter().any(|a| a.starts_with("cli:"));
            if approval.quorum > 1 && labels && self.operators.is_empty() {
                return Err(ConfigError::invalid(
                    format!("{at}.approval.quorum"),
                    "with cli: approvers, a quorum above 1 needs [operators]: without them a cli: name is a label anyone at the shell can give, so one person could count twice",
                ));
            }
            if approval.quorum > 1 {
                if let Some((i, who)) = approval
                    .approvers
                    .iter()
                    .enumerate()
                    .find(|(_, a)| self.person_of(a).is_none())
                {
                    return Err(ConfigError::invalid(
                        format!("{at}.approval.approvers[{i}]"),
                        format!("`{who}` belongs to no [people.NAME] entry: under a quorum above 1 every approver must be a declared person, so one human with two identities cannot count twice"),
                    ));
                }
                // One password counts once: the approvers must be able to
                // answer through as many secrets as the quorum needs.
                let proofs: std::collections::BTreeSet<String> =
                    approval.approvers.iter().map(|a| proof_class(a)).collect();
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
        }
        Ok(())
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
            Some(name) => format!("person:{name}"),
            None => format!("identity:{}", canonical(identity)),
        }
    }

    pub fn notify_bridge<'a>(&'a self, name: &'a str) -> &'a str {
        self.bridges
            .get(name)
            .and_then(|b| b.approval.notify.as_deref())
            .unwrap_or(name)
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

    /// The bridges that park entries and ask through `name` (approval required,
    /// `notify` naming it). Only these make `name` an approval surface.
    pub fn requesters_of<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> {
        self.bridges
            .iter()
            .filter(move |(b, c)| c.approval.required && self.notify_bridge(b) == name)
            .map(|(b, _)| b.as_str())
    }

    /// The destinations on bridge `name` where approval requests are shown: no
    /// agent message may go there, so nothing but the broker's cards appears in
    /// front of approvers (an agent's look-alike card would be one click away).
    pub fn approval_channels<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> {
        self.requesters_of(name)
            .filter_map(|b| self.bridges.get(b))
            .map(|b| b.approval.notify_channel.as_str())
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

impl BridgeConfig {
    /// Whether `channel_id` is on this bridge's destination allow-list.
    pub fn allows_destination(&self, channel_id: &str) -> bool {
        self.destinations
            .iter()
            .any(|pattern| glob(pattern, channel_id))
    }

    /// Deserializes the type's own settings; unknown keys are refused by `T`.
    pub fn settings<T: serde::de::DeserializeOwned>(&self, bridge: &str) -> Result<T, ConfigError> {
        serde_path_to_error::deserialize(toml::Value::Table(self.settings.clone()))
            .map_err(|e| located(&format!("bridges.{bridge}"), e))
    }
}

impl ApprovalConfig {
    /// Whether a qualified identity (`type:id`) may decide. Fails closed on an empty list.
    pub fn allows(&self, identity: &str) -> bool {
        self.approvers.iter().any(|a| identity_eq(a, identity))
    }
}

/// Identities compare in their canonical form (see [`crate::identity`]).
fn identity_eq(a: &str, b: &str) -> bool {
    canonical(a) == canonical(b)
}

/// The secret an answer by `identity` is proven with, as a class (see
/// [`Identity::proof_class`]).
fn proof_class(identity: &str) -> String {
    Identity::read(identity).proof_class().to_string()
}

/// Resolves a secret file path: a leading `$CREDENTIALS_DIRECTORY` is replaced by
/// that environment variable (set by systemd for units with `LoadCredential=`), so
/// one config file serves every unit even though each has its own credentials dir.
pub fn secret_path(path: &Path) -> PathBuf {
    let text = path.to_string_lossy();
    match (
        text.strip_prefix("$CREDENTIALS_DIRECTORY"),
        std::env::var_os("CREDENTIALS_DIRECTORY"),
    ) {
        (Some(rest), Some(dir)) => PathBuf::from(dir).join(rest.trim_start_matches('/')),
        _ => path.to_path_buf(),
    }
}

/// Reads a secret (password, token) from its file: the first line, without its newline.
pub fn read_secret(key: &str, path: &Path) -> Result<String, ConfigError> {
    let path = secret_path(path);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| ConfigError::invalid(key, format!("cannot read {}: {e}", path.display())))?;
    let secret = text.lines().next().unwrap_or("").to_string();
    if secret.is_empty() {
        return Err(ConfigError::invalid(
            key,
            format!("{} is empty", path.display()),
        ));
    }
    Ok(secret)
}

/// A deserialization error inside table `prefix`, with the full key path named.
fn located(prefix: &str, e: serde_path_to_error::Error<toml::de::Error>) -> ConfigError {
    let path = e.path().to_string();
    let key = if path == "." || path.is_empty() {
        prefix.to_string()
    } else {
        format!("{prefix}.{path}")
    };
    ConfigError::invalid(key, e.into_inner().message().to_string())
}

/// `*`-only glob matching: the parts between stars must appear in order.
fn glob(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty(); // no star: exact match
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
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
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::invalid(
            key,
            "names may use only ASCII letters, digits, `-` and `_`",
        ))
    }
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
        assert!(
            err("[bridges.c]\ntype = \"console\"\napproval = { approvers = [\"ann\"] }\n")
                .contains("bridges.c.approval.approvers[0]")
        );
        assert!(err("[redis]\nurl = \"redis://x\"\nport = 1\n").contains("port"));
        assert!(err("[agents.c]\n[bridges.c]\ntype = \"console\"\n").contains("bridges.c"));
        assert!(err("[bridges.\"a:b\"]\ntype = \"console\"\n").contains("bridges.a:b"));
    }

    #[test]
    fn a_quorum_counts_distinct_proven_people() {
        let bridge = |approval: &str| {
            format!("[bridges.c]\ntype = \"console\"\napproval = {{ required = true, notify_channel = \"o\", {approval} }}\n")
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
}
