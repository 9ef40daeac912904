//! Where Redis is, and the connection that keeps reaching it.
//!
//! Three topologies: one server at `redis.url`, a master found through
//! Sentinels (`redis.sentinels` + `redis.master_name`), or a Redis Cluster
//! (`redis.cluster`, see [`crate::cluster`]). [`Conn`] is the
//! general-purpose connection of every service, the CLI and the page; behind
//! Sentinels it follows a failover without a restart, on a cluster it
//! follows the slots.
//!
//! Invariants:
//! - This layer never sends a command twice. A command that fails because the
//!   master went away returns its error (callers retry or report, exactly as
//!   for a lost connection to one server); only later commands go to the new
//!   master. So a failover adds no delivery, decision or notification.
//! - The master is looked for again only after an error that says it may be
//!   gone (connection lost or refused, a timeout, `READONLY`, `MASTERDOWN`),
//!   by one caller at a time; a server the Sentinels name is used only once it
//!   answers `ROLE` as master (a user without `ROLE` trusts the Sentinels).
//! - With `wait_replicas = N`, [`Conn::replicated`] returns only once N
//!   replicas hold everything this connection wrote before it, and fails
//!   (retriably) otherwise: callers put it between a write that must survive a
//!   failover and the step that relies on it.
//! - Certificates are always checked: `#insecure` is refused, `ca_file` is the
//!   only way to trust a private CA; plain TCP goes to loopback only unless
//!   `allow_plaintext` says otherwise. The same rules hold for the Sentinels
//!   and for the master they name.

use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Cmd, IntoConnectionInfo, Pipeline, RedisFuture, Value};

use crate::config::RedisConfig;
use crate::error::{ConfigError, Error, Result};

/// How long one Sentinel may take to connect and answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// How the master is found.
enum Place {
    /// One server, always the same.
    Server(redis::Client),
    /// Whatever server the Sentinels name as `master_name`'s master.
    Sentinels {
        sentinels: Vec<redis::Client>,
        master_name: String,
        /// For a client to the master they name (its scheme and credentials).
        config: RedisConfig,
        tls: bool,
    },
}

/// The master in use now. `generation` grows with each move, so a caller that
/// saw an error on an older one does not move the connection again.
#[derive(Clone)]
struct Current {
    generation: u64,
    client: redis::Client,
    manager: ConnectionManager,
}

struct Shared {
    place: Place,
    now: RwLock<Current>,
    /// One relocation at a time.
    moving: tokio::sync::Mutex<()>,
    /// `(replicas, timeout ms)` from `wait_replicas` / `wait_timeout_ms`.
    wait: Option<(u32, u64)>,
    user: String,
}

/// The general-purpose connection (multiplexed, reconnecting, following the
/// master behind Sentinels, or the slots of a cluster). Cloning it is cheap
/// and shares the connection.
#[derive(Clone)]
pub struct Conn {
    link: Link,
}

#[derive(Clone)]
enum Link {
    /// One master: a server, or the one the Sentinels name.
    Master(Arc<Shared>),
    Cluster(Box<crate::cluster::ClusterLink>),
}

impl Conn {
    /// Connects using `[redis]`, reading the passwords from their files.
    pub async fn connect(config: &RedisConfig) -> Result<Conn> {
        if !config.cluster.is_empty() {
            crate::config::validate_redis(config)?;
            return Ok(Conn {
                link: Link::Cluster(Box::new(
                    crate::cluster::ClusterLink::connect(config).await?,
                )),
            });
        }
        let place = Place::from_config(config)?;
        let wait =
            (config.wait_replicas > 0).then_some((config.wait_replicas, config.wait_timeout_ms));
        let user = config.username.clone().unwrap_or_else(|| "default".into());
        let client = place.master().await?;
        let mut manager = manage(&client, &user).await?;
        if place.is_sentinels() && !says_master(&mut manager).await? {
            return Err(gone(format!(
                "{} is named master by the Sentinels but is not (yet)",
                address(&client)
            )));
        }
        Ok(Conn {
            link: Link::Master(Arc::new(Shared {
                place,
                now: RwLock::new(Current {
                    generation: 0,
                    client,
                    manager,
                }),
                moving: tokio::sync::Mutex::new(()),
                wait,
                user,
            })),
        })
    }

    /// A dedicated connection for blocking reads (no reply timeout); on a
    /// cluster, one that runs a blocking read per stream (see
    /// [`crate::blocking`]).
    pub async fn blocking(&self) -> Result<crate::blocking::Blocking> {
        match &self.link {
            Link::Master(_) => {
                let config = redis::AsyncConnectionConfig::new()
                    .set_response_timeout(None)
                    .set_connection_timeout(Some(Duration::from_secs(5)));
                let conn = self
                    .master_client()
                    .await?
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                Ok(crate::blocking::Blocking::One(conn))
            }
            Link::Cluster(link) => link.blocking().await,
        }
    }
}

impl Shared {
    fn current(&self) -> Current {
        self.now
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

impl Conn {
    /// A client for the master as known now; behind Sentinels they are asked
    /// first (this serves new dedicated connections: blocking reads, which
    /// would otherwise reconnect to a demoted master and fail forever). A
    /// cluster has no one master: an error that says so.
    pub async fn master_client(&self) -> Result<redis::Client> {
        let shared = match &self.link {
            Link::Master(shared) => shared,
            Link::Cluster(_) => {
                return Err(ConfigError::invalid(
                    "redis.cluster",
                    "this command needs one server (a cluster has a master per slot range)",
                )
                .into())
            }
        };
        if shared.place.is_sentinels() {
            let seen = shared.current().generation;
            if let Err(why) = shared.relocate(seen).await {
                // No Sentinel answered: the master in use may still be fine.
                tracing::warn!(error = %why, "the Sentinels could not be asked; using the master known");
            }
        }
        Ok(shared.current().client)
    }

    /// Whether `a` and `b` may be written in one transaction or script:
    /// always on one server; on a cluster when they hash to one slot.
    pub fn same_slot(&self, a: &str, b: &str) -> bool {
        use redis::cluster_routing::Slot;
        match &self.link {
            Link::Master(_) => true,
            Link::Cluster(_) => Slot::for_key(a) == Slot::for_key(b),
        }
    }

    /// On a cluster, which master serves each slot now; `None` on one
    /// server or behind Sentinels.
    pub async fn owners(&mut self) -> Result<Option<crate::cluster::Owners>> {
        match &mut self.link {
            Link::Master(_) => Ok(None),
            Link::Cluster(link) => Ok(Some(
                link.owners()
                    .await
                    .map_err(|e| Error::from_redis("CLUSTER SHARDS", e))?,
            )),
        }
    }

    /// Every key matching `pattern` (`SCAN`; on a cluster, on every master).
    pub async fn keys_matching(&mut self, pattern: &str) -> Result<Vec<String>> {
        if let Link::Cluster(link) = &mut self.link {
            return link
                .keys_matching(pattern)
                .await
                .map_err(|e| Error::from_redis("SCAN", e));
        }
        use redis::AsyncCommands;
        let mut keys = Vec::new();
        let mut iter: redis::AsyncIter<String> = self
            .scan_match(pattern)
            .await
            .map_err(|e| Error::from_redis("SCAN", e))?;
        while let Some(key) = iter.next_item().await {
            keys.push(key.map_err(|e| Error::from_redis("SCAN", e))?);
        }
        Ok(keys)
    }

    /// The clock of the server that holds `key`, in milliseconds (`TIME`):
    /// the clock that made its stream ids. On a cluster, asked of the
    /// master of the key's slot, as nodes' clocks may differ.
    pub async fn millis_at(&mut self, key: &str) -> Result<u64> {
        let got: redis::RedisResult<(u64, u64)> = match &mut self.link {
            Link::Cluster(link) => link
                .time_at(key)
                .await
                .and_then(|v| Ok(redis::from_redis_value(v)?)),
            Link::Master(_) => redis::cmd("TIME").query_async(self).await,
        };
        let (secs, micros) = got.map_err(|e| Error::from_redis("TIME", e))?;
        Ok(secs * 1000 + micros / 1000)
    }

    /// `host:port` of the server in use (a cluster: the nodes it was given).
    pub fn address(&self) -> String {
        match &self.link {
            Link::Master(shared) => address(&shared.current().client),
            Link::Cluster(link) => link.seeds(),
        }
    }
}

impl Shared {
    /// Asks the Sentinels where the master is and moves there when it is
    /// elsewhere (unless another caller already moved since `seen`).
    async fn relocate(&self, seen: u64) -> Result<()> {
        // A caller already at it: this one's command fails as it would have,
        // without waiting for Sentinels and connections.
        let Ok(_one) = self.moving.try_lock() else {
            return Ok(());
        };
        let now = self.current();
        if now.generation != seen {
            return Ok(());
        }
        let mut why = Vec::new();
        let mut found = None;
        // Most-named first: one stale Sentinel does not decide.
        for client in self.place.candidates().await? {
            if client.get_connection_info().addr() == now.client.get_connection_info().addr() {
                // Still named: it may be restarting, or the failover is not over.
                return Ok(());
            }
            match manage(&client, &self.user).await {
                Ok(mut manager) => match says_master(&mut manager).await {
                    Ok(true) => {
                        found = Some((client, manager));
                        break;
                    }
                    Ok(false) => why.push(format!("{} is not a master (yet)", address(&client))),
                    Err(e) => why.push(format!("{}: {e}", address(&client))),
                },
                Err(e) => why.push(format!("{}: {e}", address(&client))),
            }
        }
        let Some((client, manager)) = found else {
            return Err(gone(format!(
                "no server the Sentinels name is a reachable master: {}",
                why.join("; ")
            )));
        };
        tracing::warn!(
            from = %address(&now.client),
            to = %address(&client),
            "the Redis master moved; following it"
        );
        let mut slot = self
            .now
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *slot = Current {
            generation: seen + 1,
            client,
            manager,
        };
        Ok(())
    }

    /// After a failed command: when the master may be gone, look for it.
    async fn after_error(&self, seen: u64, e: &redis::RedisError) {
        if self.place.is_sentinels() && master_may_be_gone(e) {
            if let Err(why) = self.relocate(seen).await {
                // Warned: a certificate or address that waiting cannot fix
                // shows here (it stops the service at start-up).
                tracing::warn!(error = %why, "the Redis master could not be found yet");
            }
        }
    }
}

impl Conn {
    /// Waits until `redis.wait_replicas` replicas hold everything written on
    /// this connection so far (nothing to do when it is 0). Fails, retriably,
    /// when fewer acknowledge within `redis.wait_timeout_ms`; `what` names
    /// the writes in that error. On a cluster `WAIT` goes to every master
    /// and the fewest acknowledgements count.
    pub async fn replicated(&mut self, what: &str) -> Result<()> {
        let wait = match &self.link {
            Link::Master(shared) => shared.wait,
            Link::Cluster(link) => link.wait(),
        };
        let Some((replicas, timeout_ms)) = wait else {
            return Ok(());
        };
        let acknowledged: i64 = match &mut self.link {
            Link::Cluster(link) => link.wait_replicas(replicas, timeout_ms).await,
            Link::Master(_) => {
                redis::cmd("WAIT")
                    .arg(replicas)
                    .arg(timeout_ms)
                    .query_async(self)
                    .await
            }
        }
        .map_err(|e| Error::from_redis("WAIT", e))?;
        if acknowledged < i64::from(replicas) {
            return Err(gone(format!(
                "{what}: {acknowledged} of {replicas} replicas acknowledged within {timeout_ms} ms"
            )));
        }
        Ok(())
    }
}

impl Conn {
    /// One line for `cowboy status`: how the master is found, where it is,
    /// and its replicas with how far each is behind (from `ROLE`).
    pub async fn describe(&mut self) -> String {
        let shared = match &mut self.link {
            Link::Master(shared) => shared.clone(),
            Link::Cluster(link) => return link.describe().await,
        };
        let how = match &shared.place {
            Place::Server(_) => "one server".to_string(),
            Place::Sentinels {
                sentinels,
                master_name,
                ..
            } => format!(
                "master `{master_name}` through {} Sentinels",
                sentinels.len()
            ),
        };
        let at = self.address();
        let role: redis::RedisResult<Vec<Value>> = redis::cmd("ROLE").query_async(self).await;
        let replicas = match role {
            Ok(items) => replicas_of(&items),
            Err(e) => format!("replicas unknown ({e})"),
        };
        format!("redis: {how}, at {at}; {replicas}")
    }
}

/// The replicas in a master's `ROLE` answer, each with its lag in bytes.
fn replicas_of(role: &[Value]) -> String {
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        _ => String::new(),
    };
    let Some(kind) = role.first().map(text) else {
        return "no ROLE answer".into();
    };
    if kind != "master" {
        return format!("the server says it is a {kind}");
    }
    let offset: i64 = role
        .get(1)
        .map(text)
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    let replicas: Vec<String> = match role.get(2) {
        Some(Value::Array(list)) => list
            .iter()
            .filter_map(|r| match r {
                Value::Array(f) if f.len() >= 3 => {
                    let behind = offset - text(&f[2]).parse::<i64>().unwrap_or(0);
                    Some(format!(
                        "{}:{} ({behind} bytes behind)",
                        text(&f[0]),
                        text(&f[1])
                    ))
                }
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    match replicas.is_empty() {
        true => "no replicas".into(),
        false => format!("replicas {}", replicas.join(", ")),
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let shared = match &mut self.link {
            Link::Master(shared) => shared.clone(),
            Link::Cluster(link) => return link.req_packed_command(cmd),
        };
        Box::pin(async move {
            let Current {
                generation,
                mut manager,
                ..
            } = shared.current();
            let answer = manager.req_packed_command(cmd).await;
            if let Err(e) = &answer {
                shared.after_error(generation, e).await;
            }
            answer
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let shared = match &mut self.link {
            Link::Master(shared) => shared.clone(),
            Link::Cluster(link) => return link.req_packed_commands(pipeline, offset, count),
        };
        Box::pin(async move {
            let Current {
                generation,
                mut manager,
                ..
            } = shared.current();
            let answer = manager.req_packed_commands(pipeline, offset, count).await;
            if let Err(e) = &answer {
                shared.after_error(generation, e).await;
            }
            answer
        })
    }

    fn get_db(&self) -> i64 {
        match &self.link {
            Link::Master(shared) => shared.current().manager.get_db(),
            Link::Cluster(_) => 0,
        }
    }
}

impl Place {
    fn from_config(config: &RedisConfig) -> Result<Place> {
        // A config built in code (the CLI's, the page's) is checked here too.
        crate::config::validate_redis(config)?;
        if config.sentinels.is_empty() {
            let (client, _) = client_at("redis.url", &config.url, config, Auth::Server)?;
            return Ok(Place::Server(client));
        }
        let mut sentinels = Vec::new();
        let mut tls = false;
        for url in &config.sentinels {
            let (client, secure) = client_at("redis.sentinels", url, config, Auth::Sentinel)?;
            sentinels.push(client);
            tls = secure;
        }
        Ok(Place::Sentinels {
            sentinels,
            master_name: config.master_name.clone().unwrap_or_default(),
            config: config.clone(),
            tls,
        })
    }

    fn is_sentinels(&self) -> bool {
        matches!(self, Place::Sentinels { .. })
    }

    /// A client for the master: the server, or the one most Sentinels name.
    async fn master(&self) -> Result<redis::Client> {
        let mut candidates = self.candidates().await?;
        Ok(candidates.remove(0))
    }

    /// Clients for the servers the Sentinels name master, most-named first
    /// (never empty); the server itself when there are no Sentinels.
    async fn candidates(&self) -> Result<Vec<redis::Client>> {
        let (sentinels, master_name, config, tls) = match self {
            Place::Server(client) => return Ok(vec![client.clone()]),
            Place::Sentinels {
                sentinels,
                master_name,
                config,
                tls,
            } => (sentinels, master_name, config, *tls),
        };
        let mut why = Vec::new();
        let mut named: Vec<((String, u16), usize)> = Vec::new();
        for sentinel in sentinels {
            match ask(sentinel, master_name).await {
                Ok(Some(addr)) => match named.iter_mut().find(|(a, _)| *a == addr) {
                    Some((_, votes)) => *votes += 1,
                    None => named.push((addr, 1)),
                },
                Ok(None) => why.push(format!(
                    "{} does not monitor `{master_name}`",
                    address(sentinel)
                )),
                Err(e) => why.push(format!("{}: {e}", address(sentinel))),
            }
        }
        if named.is_empty() {
            return Err(gone(format!(
                "no Sentinel named the master `{master_name}`: {}",
                why.join("; ")
            )));
        }
        // Stable: among equals, the first Sentinel's answer first.
        named.sort_by_key(|(_, votes)| std::cmp::Reverse(*votes));
        let scheme = if tls { "rediss" } else { "redis" };
        named
            .into_iter()
            .map(|((host, port), _)| {
                // An IPv6 address is written in brackets in a URL.
                let host = match host.contains(':') {
                    true => format!("[{host}]"),
                    false => host,
                };
                let url = format!("{scheme}://{host}:{port}");
                Ok(client_at("redis.sentinels", &url, config, Auth::Server)?.0)
            })
            .collect()
    }
}

/// The master's address as one Sentinel knows it.
async fn ask(
    sentinel: &redis::Client,
    master_name: &str,
) -> redis::RedisResult<Option<(String, u16)>> {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(ASK_TIMEOUT))
        .set_response_timeout(Some(ASK_TIMEOUT));
    let mut conn = sentinel
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(master_name)
        .query_async(&mut conn)
        .await
}

/// Whether the server says it is a master; a user not allowed `ROLE` cannot
/// tell, and trusts the Sentinels (a write to a replica fails `READONLY`).
async fn says_master(manager: &mut ConnectionManager) -> Result<bool> {
    let role: redis::RedisResult<Vec<Value>> = redis::cmd("ROLE").query_async(manager).await;
    match role {
        Ok(items) => Ok(match items.first() {
            Some(Value::BulkString(b)) => b == b"master",
            Some(Value::SimpleString(s)) => s == "master",
            _ => false,
        }),
        Err(e) if e.code() == Some("NOPERM") => Ok(true),
        Err(e) => Err(Error::Redis(e)),
    }
}

/// Whether an error may mean the master is no longer where it was.
fn master_may_be_gone(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || matches!(e.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
}

/// A retriable error that says what is missing (a master, replicas).
pub(crate) fn gone(message: String) -> Error {
    Error::Redis(redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        message,
    )))
}

/// The multiplexed, reconnecting connection to `client`, its errors at
/// start-up told apart: a refused password or certificate is a deployment
/// error, named; anything else may pass.
async fn manage(client: &redis::Client, user: &str) -> Result<ConnectionManager> {
    ConnectionManager::new_with_config(
        client.clone(),
        redis::aio::ConnectionManagerConfig::new()
            .set_response_timeout(Some(Duration::from_secs(10)))
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_number_of_retries(3),
    )
    .await
    .map_err(|e| {
        if e.kind() == redis::ErrorKind::AuthenticationFailed || e.code() == Some("WRONGPASS") {
            Error::Permission {
                command: format!("AUTH as {user}"),
                message: e.to_string(),
            }
        } else if refused_certificate(&e) {
            // Waiting cannot fix a certificate: a configuration error, named.
            ConfigError::invalid(
                "redis.ca_file",
                format!(
                    "the TLS certificate of {} was refused: {e}",
                    address(client)
                ),
            )
            .into()
        } else {
            Error::Redis(e)
        }
    })
}

/// Whose credentials a client carries.
#[derive(Clone, Copy)]
pub(crate) enum Auth {
    /// The data server's: `username` / `password_file`.
    Server,
    /// The Sentinels': `sentinel_username` / `sentinel_password_file`.
    Sentinel,
}

/// A client for the server at `url` (the setting named `key`) and whether it
/// speaks TLS. `rediss://` verifies the server's certificate against
/// `ca_file` (or the system's roots) and its host name; `redis://` is refused
/// to a host that is not loopback unless `allow_plaintext` says so.
pub(crate) fn client_at(
    key: &str,
    url: &str,
    config: &RedisConfig,
    auth: Auth,
) -> Result<(redis::Client, bool)> {
    let mut info: redis::ConnectionInfo = url
        .into_connection_info()
        .map_err(|e| ConfigError::invalid(key, e.to_string()))?;
    if url.contains("#insecure") {
        return Err(ConfigError::invalid(
            key,
            "`#insecure` turns certificate checks off: trust the server's CA with redis.ca_file instead",
        )
        .into());
    }
    let tls = match info.addr() {
        redis::ConnectionAddr::TcpTls { .. } => true,
        redis::ConnectionAddr::Tcp(host, _) => {
            if !config.allow_plaintext && !is_loopback(host) {
                return Err(ConfigError::invalid(
                    key,
                    format!("`{host}` is not loopback: use rediss:// (TLS), or set redis.allow_plaintext = true to send passwords and messages in clear"),
                )
                .into());
            }
            false
        }
        _ => false,
    };
    for (key, set) in [
        ("redis.ca_file", config.ca_file.is_some()),
        ("redis.client_cert_file", config.client_cert_file.is_some()),
    ] {
        if set && !tls {
            return Err(ConfigError::invalid(key, "needs a rediss:// url").into());
        }
    }
    let (user, password) = match auth {
        Auth::Server => (&config.username, &config.password_file),
        Auth::Sentinel => (&config.sentinel_username, &config.sentinel_password_file),
    };
    let mut settings = info.redis_settings().clone();
    if let Some(user) = user {
        settings = settings.set_username(user.clone());
    }
    if let Some(path) = password {
        let file_key = match auth {
            Auth::Server => "redis.password_file",
            Auth::Sentinel => "redis.sentinel_password_file",
        };
        settings = settings.set_password(crate::config::read_secret(file_key, path)?);
    }
    info = info
        .set_redis_settings(settings)
        .set_tcp_settings(tcp_settings());
    if !tls {
        return Ok((redis::Client::open(info)?, false));
    }
    let certs = certificates(config)?;
    let client = redis::Client::build_with_tls(info, certs)
        .map_err(|e| ConfigError::invalid("redis.ca_file", e.to_string()))?;
    Ok((client, true))
}

/// Installs the process's TLS provider (ring) before a first TLS connection:
/// with none, rustls panics. A second install is refused, harmlessly.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The CA to trust and the client certificate to show, from `[redis]` (the
/// system's roots when there is no `ca_file`).
pub(crate) fn certificates(config: &RedisConfig) -> Result<redis::TlsCertificates> {
    install_tls_provider();
    let root_cert = match &config.ca_file {
        Some(path) => Some(read_pem("redis.ca_file", path)?),
        None => None,
    };
    // Shown to the Sentinels too, where they verify clients as well.
    let client_tls = match (&config.client_cert_file, &config.client_key_file) {
        (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
            client_cert: read_pem("redis.client_cert_file", cert)?,
            client_key: read_pem("redis.client_key_file", key)?,
        }),
        _ => None,
    };
    Ok(redis::TlsCertificates {
        client_tls,
        root_cert,
    })
}

/// TCP keepalive and a user timeout on every connection: a server that
/// vanishes without closing its sockets (a host that lost power, a partition)
/// must fail a blocked read within about half a minute, not leave it waiting
/// forever (blocking reads have no reply timeout; see `Store::blocking`).
pub(crate) fn tcp_settings() -> redis::io::tcp::TcpSettings {
    use redis::io::tcp::socket2::TcpKeepalive;
    let keepalive = TcpKeepalive::new()
        .with_time(Duration::from_secs(10))
        .with_interval(Duration::from_secs(5))
        .with_retries(3);
    redis::io::tcp::TcpSettings::default()
        .set_keepalive(keepalive)
        .set_user_timeout(Duration::from_secs(30))
}

/// A PEM file named by setting `key` (`$CREDENTIALS_DIRECTORY` expanded).
fn read_pem(key: &str, path: &Path) -> Result<Vec<u8>> {
    let path = crate::config::secret_path(path);
    std::fs::read(&path).map_err(|e| {
        ConfigError::invalid(key, format!("cannot read {}: {e}", path.display())).into()
    })
}

/// A client for the master as `[redis]` finds it (asking the Sentinels when
/// there are any): for one-off connections such as `cowboy acl --check`.
pub async fn master_client(config: &RedisConfig) -> Result<redis::Client> {
    if !config.cluster.is_empty() {
        // ACL users live on each node: one answer would prove one node.
        return Err(ConfigError::invalid(
            "redis.cluster",
            "this asks one server: on a cluster, run it once per node with redis.url naming that node (and no redis.cluster)",
        )
        .into());
    }
    Place::from_config(config)?.master().await
}

/// `host:port` of a client's server.
pub(crate) fn address(client: &redis::Client) -> String {
    match client.get_connection_info().addr() {
        redis::ConnectionAddr::Tcp(host, port)
        | redis::ConnectionAddr::TcpTls { host, port, .. } => {
            format!("{host}:{port}")
        }
        other => other.to_string(),
    }
}

/// Whether a connection failed on the server's certificate (not trusted, or
/// not for that host).
pub(crate) fn refused_certificate(e: &redis::RedisError) -> bool {
    let text = e.to_string().to_ascii_lowercase();
    ["certificate", "unknownissuer", "notvalidforname"]
        .iter()
        .any(|w| text.contains(w))
}

/// Whether `host` is this machine (where plain TCP crosses no network).
fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}
