//! The tables of the config file as types: every field documented, unknown
//! keys refused, defaults beside their field.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use crate::error::ConfigError;
use crate::identity::canonical;

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
    /// The page's address as approvers reach it (`https://approvals.example.org`),
    /// for links in digests; none without it.
    #[serde(default)]
    pub public_url: Option<String>,
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
    /// PEM certificate this client shows a server that verifies clients
    /// (`tls-auth-clients yes`); with `client_key_file`.
    #[serde(default)]
    pub client_cert_file: Option<PathBuf>,
    /// The PEM private key of `client_cert_file` (a secret: a credential).
    #[serde(default)]
    pub client_key_file: Option<PathBuf>,
    /// Allows `redis://` (no TLS) to a host that is not loopback, where
    /// passwords and messages would cross the network in clear.
    #[serde(default)]
    pub allow_plaintext: bool,
    /// Sentinels (`redis://host:26379` or `rediss://`) that say where the
    /// master is; instead of `url`. The master is reached with the same scheme.
    #[serde(default)]
    pub sentinels: Vec<String>,
    /// The name the Sentinels monitor the master under.
    #[serde(default)]
    pub master_name: Option<String>,
    /// ACL user on the Sentinels, where they have one.
    #[serde(default)]
    pub sentinel_username: Option<String>,
    /// File holding that user's password.
    #[serde(default)]
    pub sentinel_password_file: Option<PathBuf>,
    /// Replicas that must hold an approval record, a decision and a send's
    /// gate mark before the step that relies on it (`WAIT`); 0: none.
    #[serde(default)]
    pub wait_replicas: u32,
    /// How long such a `WAIT` may take (1 to 5000 ms) before the step fails
    /// and is retried.
    #[serde(default = "default_wait_timeout_ms")]
    pub wait_timeout_ms: u64,
    /// Nodes of a Redis Cluster (`redis://host:port` or `rediss://`), any of
    /// them, to learn the cluster from; instead of `url`.
    #[serde(default)]
    pub cluster: Vec<String>,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            url: default_redis_url(),
            username: None,
            password_file: None,
            ca_file: None,
            client_cert_file: None,
            client_key_file: None,
            allow_plaintext: false,
            sentinels: Vec::new(),
            master_name: None,
            sentinel_username: None,
            sentinel_password_file: None,
            wait_replicas: 0,
            wait_timeout_ms: default_wait_timeout_ms(),
            cluster: Vec::new(),
        }
    }
}

fn default_wait_timeout_ms() -> u64 {
    1_000
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
    pub(super) fn from_table(
        name: &str,
        mut table: toml::Table,
    ) -> Result<BridgeConfig, ConfigError> {
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
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
    /// Longest one "later" may move the deadline by, in seconds. 0: approvers
    /// cannot snooze (neither can anyone on an approval that never expires).
    #[serde(default = "default_max_snooze")]
    pub max_snooze: u64,
    /// How many times one approval may be snoozed.
    #[serde(default = "default_max_snoozes")]
    pub max_snoozes: u32,
    /// How long a "later" without a time (a reaction, a button) snoozes, in seconds.
    #[serde(default = "default_snooze")]
    pub snooze: u64,
    /// Seconds after parking when the card's surface reminds the approvers
    /// of an approval still waiting (once). 0: no reminder.
    #[serde(default)]
    pub remind_after: u64,
    /// A summary of what waits on this bridge, oldest first, once a period
    /// while anything does: sent as a message through bridge `digest_to`
    /// (default: the notify bridge) to `digest_channel`.
    #[serde(default)]
    pub digest: Option<DigestEvery>,
    #[serde(default)]
    pub digest_to: Option<String>,
    #[serde(default)]
    pub digest_channel: String,
    /// More surfaces asked at the same time as `notify`, each with its own
    /// card: an answer on any of them counts (the quorum counts people, not
    /// surfaces), and every card is closed when the approval is settled.
    #[serde(default)]
    pub also: Vec<SurfaceConfig>,
    /// The ladder: when a step's `after` (seconds since parking) passes
    /// undecided, its surface is asked too and its approvers join.
    #[serde(default)]
    pub escalate: Vec<EscalationStep>,
}

/// One step of the escalation ladder:
/// `{ after, notify, notify_channel, approvers }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EscalationStep {
    /// Seconds after parking when this step is taken, if still undecided.
    pub after: u64,
    /// The bridge asked from then on.
    pub notify: String,
    /// Where on it.
    pub notify_channel: String,
    /// Who may decide from then on, besides the approvers before.
    #[serde(default)]
    pub approvers: Vec<String>,
    /// People (`[people.NAME]`) who may decide from then on: each with every
    /// identity the config gives them (added to `approvers` when the config
    /// is read).
    #[serde(default)]
    pub people: Vec<String>,
}

/// One more surface an approval is asked on: `{ notify, notify_channel }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SurfaceConfig {
    /// The bridge that shows the card.
    pub notify: String,
    /// Where on it (channel id, address, ...).
    pub notify_channel: String,
}

/// How often a digest of waiting approvals goes out (at the turn of each
/// hour or day, UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DigestEvery {
    Hourly,
    Daily,
}

impl DigestEvery {
    /// The period, in seconds.
    pub fn seconds(self) -> u64 {
        match self {
            DigestEvery::Hourly => 3600,
            DigestEvery::Daily => 86_400,
        }
    }
}

fn default_max_snooze() -> u64 {
    86_400
}

fn default_max_snoozes() -> u32 {
    3
}

fn default_snooze() -> u64 {
    3600
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
            max_snooze: default_max_snooze(),
            max_snoozes: default_max_snoozes(),
            snooze: default_snooze(),
            remind_after: 0,
            digest: None,
            digest_to: None,
            digest_channel: String::new(),
            also: Vec::new(),
            escalate: Vec::new(),
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

    /// Whether `identity` may decide an approval that has taken `escalated`
    /// steps of the ladder: the approvers, and those each step taken added.
    pub fn allows_at(&self, identity: &str, escalated: u32) -> bool {
        self.allows(identity)
            || self
                .escalate
                .iter()
                .take(escalated as usize)
                .any(|s| s.approvers.iter().any(|a| identity_eq(a, identity)))
    }

    /// Whether `identity` may decide some approval of this bridge (at any
    /// step of the ladder).
    pub fn allows_ever(&self, identity: &str) -> bool {
        self.allows_at(identity, u32::MAX)
    }
}

/// Identities compare in their canonical form (see [`crate::identity`]).
fn identity_eq(a: &str, b: &str) -> bool {
    canonical(a) == canonical(b)
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
