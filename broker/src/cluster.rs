//! The connection to a Redis Cluster (`redis.cluster`): the redis crate's
//! cluster client, made to keep this project's rules.
//!
//! Invariants:
//! - No command is ever sent twice after it may have run: the client's own
//!   retries are off (`retries(0)`: it would re-send after a lost
//!   connection, doubling an `XADD`). Only an answer that proves the command
//!   did not run (`MOVED`, `ASK`, `TRYAGAIN`: the node refused it before
//!   executing) is sent again here, a few times within [`REDIRECTS_FOR`];
//!   the client rebuilds its slot map on `MOVED`. A pipeline run is sent
//!   again only when it holds one command (the client reports a run by its
//!   first redirect, whatever ran before it).
//! - Consecutive one-command runs of the same command (the same script) go
//!   side by side: each touches its own key and none reads another's write,
//!   so order among them means nothing; a later kind of command waits for
//!   them all (a record is created before it is indexed). They go as one
//!   pipeline per master, on a direct connection to it, by a slot map from
//!   `CLUSTER SHARDS`; such a pipeline answers each command apart, so one
//!   refused with a redirect (stale map, slot in migration) is known not to
//!   have run and is sent again alone through the cluster client; the map
//!   is fetched again after a redirect or a failed connection. Anything else reaches the
//!   caller, which retries as after any lost connection.
//! - A command (or one-command run) refused with `ASK` (its key already
//!   moved out of a slot still in migration) is sent to the importing node
//!   the answer names, after `ASKING`, on a direct connection to it
//!   ([`asked`]); not with `wait_replicas` (`WAIT` counts the client's
//!   connections only), nor for a run of several commands, nor when that
//!   node cannot be reached: those wait as above, as does `TRYAGAIN` (keys
//!   split by the migration).
//! - A pipeline goes to one node per slot: the client refuses one that
//!   spans slots, so it is cut into runs of consecutive commands of one
//!   slot, sent in order, one after the other (a write pipeline's order is
//!   its meaning: a record before its index, an ack after what it settles).
//!   Keyless commands ride with the run they are in; a pipeline's `SCRIPT
//!   LOAD` is first sent to every node (once per script, again after a node
//!   answers `NOSCRIPT`), as later runs may go to nodes without it. A transaction (`MULTI`/`EXEC`) is sent whole:
//!   its keys must share a slot.
//! - Every protocol script names keys of one slot (a record; a stream and
//!   its marks hash, tagged with the stream's name), so scripts run
//!   unchanged.
//! - Blocking reads never share a connection with other commands: each
//!   [`crate::blocking::Blocking`] opens its own cluster connections.
//! - A command the client sends to several nodes itself (`SCRIPT LOAD`,
//!   `WAIT`, a `DEL` of keys in several slots) is waited for with its
//!   driver woken ([`ClusterLink::kicked`]): the client queues the per-node
//!   parts without waking itself, so on a quiet service they waited for the
//!   reply timeout (10 s).

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::config::RedisConfig;
use crate::error::{ConfigError, Error, Result};
use crate::topology::{certificates, client_at, tcp_settings, Auth};

/// When a command the client sends to several nodes first wakes its driver,
/// and how often after that, while its answer is awaited
/// ([`ClusterLink::kicked`]).
const KICK_FIRST: Duration = Duration::from_millis(2);
const KICK_EVERY: Duration = Duration::from_millis(10);

/// How long a command refused with a redirect is tried again (a slot whose
/// keys are split by a migration answers `TRYAGAIN` until it is handed
/// over).
const REDIRECTS_FOR: Duration = Duration::from_secs(5);

/// The shared cluster connection of a service (cheap to clone).
#[derive(Clone)]
pub struct ClusterLink {
    /// For blocking reads: no reply timeout at all.
    blocking: ClusterClient,
    conn: ClusterConnection,
    /// Scripts loaded on every node (their bodies): a pipeline's `SCRIPT
    /// LOAD` is sent to all nodes once, not ahead of every run. Forgotten
    /// when a node answers `NOSCRIPT` (restarted, or new to the cluster).
    loaded: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<Vec<u8>>>>,
    /// The nodes it was given, `host:port` each (no credentials).
    seeds: String,
    wait: Option<(u32, u64)>,
    /// Direct connections to the masters, for batches side by side.
    masters: std::sync::Arc<Masters>,
}

impl ClusterLink {
    /// Connects to the cluster `redis.cluster` names (any of its nodes).
    pub async fn connect(config: &RedisConfig) -> Result<ClusterLink> {
        let conn = cluster_client(config, Replies::TimedOut)?
            .get_async_connection()
            .await
            .map_err(|e| refused(config, e))?;
        Ok(ClusterLink {
            blocking: cluster_client(config, Replies::Awaited)?,
            conn,
            loaded: Default::default(),
            seeds: nodes(config),
            masters: std::sync::Arc::new(Masters {
                config: config.clone(),
                owners: Default::default(),
                conns: Default::default(),
            }),
            wait: (config.wait_replicas > 0)
                .then_some((config.wait_replicas, config.wait_timeout_ms)),
        })
    }

    /// The nodes it was given, for messages.
    pub fn seeds(&self) -> String {
        format!("cluster {}", self.seeds)
    }

    pub fn wait(&self) -> Option<(u32, u64)> {
        self.wait
    }

    /// A connection of its own with no reply timeout, for blocking reads.
    pub async fn blocking(&self) -> Result<crate::blocking::Blocking> {
        let conn = dedicated(&self.blocking).await?;
        Ok(crate::blocking::Blocking::Cluster(Box::new(
            crate::blocking::ClusterReads::new(self.blocking.clone(), conn),
        )))
    }

    /// `cowboy status`: the masters, their slot ranges and replicas (from
    /// `CLUSTER SHARDS`).
    pub async fn describe(&mut self) -> String {
        let shards: redis::RedisResult<Value> = redis::cmd("CLUSTER")
            .arg("SHARDS")
            .query_async(&mut self.conn)
            .await;
        match shards {
            Ok(v) => format!("redis: {}", describe_shards(&v)),
            Err(e) => format!("redis: {}; shards unknown ({e})", self.seeds()),
        }
    }

    /// `WAIT replicas timeout_ms` on every master, the fewest
    /// acknowledgements counting. First as the client routes it (to each
    /// master of its slot map, on the connections that carried this
    /// service's writes). When that fails, the client's map may name a node
    /// that is no longer a master (a failover its own commands have not met:
    /// `WAIT` on a replica is an error, and no redirect ever corrects the
    /// map), so each master the cluster names now is asked, on the client's
    /// connection to it. A master this service has not written to since it
    /// was promoted has nothing of its to wait for.
    pub async fn wait_replicas(
        &mut self,
        replicas: u32,
        timeout_ms: u64,
    ) -> redis::RedisResult<i64> {
        let wait = || {
            let mut cmd = redis::cmd("WAIT");
            cmd.arg(replicas).arg(timeout_ms);
            cmd
        };
        let first: redis::RedisResult<i64> = match self.req_packed_command(&wait()).await {
            Ok(v) => redis::from_redis_value(v).map_err(Into::into),
            Err(e) => Err(e),
        };
        let Err(e) = first else {
            return first;
        };
        self.masters.forget(None).await;
        let Some(owners) = self.masters.owners(&mut self.conn).await else {
            return Err(e);
        };
        let mut fewest = i64::MAX;
        for (host, port) in owners.masters() {
            let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
            let got = self.conn.route_command(wait(), routing).await?;
            fewest = fewest.min(redis::from_redis_value(got)?);
        }
        tracing::info!(error = %e, "WAIT asked of each master the cluster names now");
        Ok(fewest)
    }

    /// The keys matching `pattern` on every master the cluster names now
    /// (`SCAN` visits one node), each master on its direct connection.
    pub async fn keys_matching(&mut self, pattern: &str) -> redis::RedisResult<Vec<String>> {
        self.masters.forget(None).await;
        let Some(owners) = self.masters.owners(&mut self.conn).await else {
            return Err(redis::RedisError::from(std::io::Error::other(
                "the cluster did not say which nodes are masters",
            )));
        };
        let mut keys = Vec::new();
        for (host, port) in owners.masters() {
            let node = match host.contains(':') {
                true => format!("[{host}]:{port}"),
                false => format!("{host}:{port}"),
            };
            let mut conn = self.masters.conn(&node).await?;
            let mut cursor = 0u64;
            loop {
                let (next, page): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(&mut conn)
                    .await?;
                keys.extend(page);
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(keys)
    }

    /// `TIME` of the master serving `key`'s slot.
    pub async fn time_at(&mut self, key: &str) -> redis::RedisResult<Value> {
        let at = redis::cluster_routing::Route::new(slot_number(key.as_bytes()), SlotAddr::Master);
        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(at));
        self.conn.route_command(redis::cmd("TIME"), routing).await
    }

    /// Which master serves each slot, as the cluster says now (`CLUSTER
    /// SHARDS`), for `cowboy status`.
    pub async fn owners(&mut self) -> redis::RedisResult<Owners> {
        Owners::fetch(&mut self.conn, self.masters.tls()).await
    }

    pub fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            if spreads(cmd) {
                return self.kicked(cmd).await.inspect_err(|e| {
                    if e.is_timeout() {
                        tracing::warn!(command = %name_of(cmd), "a command to several nodes timed out");
                    }
                });
            }
            let deadline = tokio::time::Instant::now() + REDIRECTS_FOR;
            let direct = self.direct();
            loop {
                let mut got = self.conn.req_packed_command(cmd).await;
                if let Err(e) = &got {
                    let mut one = redis::pipe();
                    one.add_command(cmd.clone());
                    if let Some(there) = asked(direct.as_deref(), e, &one).await {
                        got = there.and_then(|mut v| v.pop().unwrap_or(Value::Nil).extract_error());
                    }
                }
                match got {
                    Err(e) if not_run(&e) && tokio::time::Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Err(e) if e.is_timeout() => {
                        tracing::warn!(command = %name_of(cmd), "a cluster command timed out");
                        return Err(e);
                    }
                    answer => return answer,
                }
            }
        })
    }

    pub fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            if pipeline.is_transaction() {
                return self.conn.req_packed_commands(pipeline, offset, count).await;
            }
            self.load_scripts(pipeline).await?;
            let mut answers = Vec::with_capacity(count);
            let mut runs = runs(pipeline).into_iter().peekable();
            while let Some(first) = runs.next() {
                // Consecutive one-command runs of the same command, each on
                // its own key (a batch of records created, loaded or marked):
                // no answer depends on another, so they go side by side, one
                // round trip for the batch instead of one per key.
                let kind = lone_kind(&first);
                let mut batch = vec![first];
                while let Some(next) = runs.peek() {
                    if kind.is_none() || lone_kind(next) != kind {
                        break;
                    }
                    batch.extend(runs.next());
                }
                match self.side_by_side(batch).await {
                    Ok(got) => answers.extend(got),
                    Err(e) => {
                        // A node lost or replaced (a promoted replica has
                        // an empty script cache): load them all again.
                        self.forget_scripts();
                        if e.is_timeout() {
                            // Which step waited: the caller only says that
                            // Redis did not answer.
                            tracing::warn!(commands = %summary(pipeline), "a cluster pipeline timed out");
                        }
                        return Err(e);
                    }
                }
            }
            let lost = answers
                .iter()
                .any(|a| matches!(a, Value::ServerError(e) if e.code() == "NOSCRIPT"));
            if lost {
                // A node without the script (restarted, or a replica
                // promoted): load it everywhere next time (the caller
                // retries its step: `NOSCRIPT` is retriable).
                self.forget_scripts();
            }
            Ok(answers)
        })
    }

    /// Sends runs that may go in any order: one pipeline per master on a
    /// direct connection to it (one round trip per master, not per run).
    /// Such a pipeline answers each command apart, so a command a node
    /// refused with a redirect (it did not run) is known and sent again
    /// alone through the cluster client, which follows it; every other
    /// answer stands. Without a slot map, for a run whose key no master
    /// serves in it, or for a master that cannot be reached directly (nothing
    /// was sent to it), runs go through the cluster client.
    ///
    /// Not with `wait_replicas`: `WAIT` counts the writes of the connection
    /// it is sent on, and is sent on the cluster client's, so writes that
    /// must be waited for go there.
    async fn side_by_side(&mut self, batch: Vec<Pipeline>) -> redis::RedisResult<Vec<Value>> {
        let owners = match (batch.len(), self.wait) {
            (1, _) | (_, Some(_)) => None,
            _ => self.masters.owners(&mut self.conn).await,
        };
        // Each run's master, borrowed from the map (no copy per run).
        let nodes: Option<Vec<&str>> = owners.as_deref().and_then(|o| {
            batch
                .iter()
                .map(|run| o.of_key(&run.cmd_iter().find_map(key_of)?))
                .collect()
        });
        let Some(nodes) = nodes else {
            let sent: Vec<_> = batch
                .into_iter()
                .map(|run| tokio::spawn(send_run(self.conn.clone(), self.direct(), run)))
                .collect();
            let mut answers = Vec::new();
            for run in sent {
                answers.extend(run.await.map_err(ended)??);
            }
            return Ok(answers);
        };
        let batch = std::sync::Arc::new(batch);
        let mut by_node: std::collections::BTreeMap<&str, Vec<usize>> = Default::default();
        for (i, node) in nodes.into_iter().enumerate() {
            by_node.entry(node).or_default().push(i);
        }
        let mut sent = Vec::new();
        for (node, runs) in by_node {
            let mut pipe = redis::pipe();
            for &i in &runs {
                for cmd in batch[i].cmd_iter() {
                    pipe.add_command(cmd.clone());
                }
            }
            let masters = self.masters.clone();
            let node = node.to_string();
            let (batch, shared) = (batch.clone(), self.conn.clone());
            sent.push(tokio::spawn(async move {
                let mut conn = match masters.conn(&node).await {
                    Ok(conn) => conn,
                    Err(e) => {
                        // Nothing was sent to it: its runs go through the
                        // cluster client, and the map is asked again.
                        tracing::debug!(node, error = %e, "a master not reached directly");
                        masters.forget(Some(&node)).await;
                        let mut answers = Vec::new();
                        for &i in &runs {
                            let run = batch[i].clone();
                            // Straight to each master only without `WAIT`:
                            // an `ASK` may be followed on one as well.
                            let direct = Some(masters.clone());
                            answers.push((i, send_run(shared.clone(), direct, run).await?));
                        }
                        return Ok(answers);
                    }
                };
                let got = conn.req_packed_commands(&pipe, 0, pipe.len()).await;
                let got = match got {
                    Ok(got) if got.len() == pipe.len() => got,
                    Ok(got) => {
                        // Never line answers up with the wrong commands.
                        masters.forget(Some(&node)).await;
                        return Err(redis::RedisError::from(std::io::Error::other(format!(
                            "{node} answered {} of {} commands",
                            got.len(),
                            pipe.len()
                        ))));
                    }
                    Err(e) => {
                        masters.forget(Some(&node)).await;
                        return Err(e);
                    }
                };
                let mut got = got.into_iter();
                Ok(runs
                    .into_iter()
                    .map(|i| (i, got.by_ref().take(batch[i].len()).collect()))
                    .collect::<Vec<(usize, Vec<Value>)>>())
            }));
        }
        let mut per_run: Vec<Vec<Value>> = vec![Vec::new(); batch.len()];
        for task in sent {
            for (i, answers) in task.await.map_err(ended)?? {
                per_run[i] = answers;
            }
        }
        for (i, answers) in per_run.iter_mut().enumerate() {
            let redirected = answers
                .iter()
                .any(|a| matches!(a, Value::ServerError(e) if did_not_run(e.code())));
            if redirected {
                // The slot moved: that command did not run. Sent again
                // alone, through the client that follows redirects.
                self.masters.forget(None).await;
                *answers = send_run(self.conn.clone(), self.direct(), batch[i].clone()).await?;
            }
        }
        Ok(per_run.into_iter().flatten().collect())
    }

    /// A command the client sends to several nodes itself (`SCRIPT LOAD`,
    /// `WAIT`, a `DEL` over several slots), its driver woken until the
    /// answer comes. The client queues such a command's per-node parts from
    /// inside its driver task without waking it (redis-rs), so they wait for
    /// whatever next wakes it: on a quiet service, the 10 s reply timeout.
    /// Any request to one node wakes it, so a `PING` goes to one node every
    /// few milliseconds until the answer is in. The client's own fan-out is
    /// kept: it knows every node (replicas and new masters too) and uses a
    /// connection under repair rather than resetting them all.
    async fn kicked(&mut self, cmd: &Cmd) -> redis::RedisResult<Value> {
        let mut conn = self.conn.clone();
        let answer = conn.req_packed_command(cmd);
        tokio::pin!(answer);
        // The first wake soon: not stalled, such a command answers within
        // a millisecond or two on a near network, and with `wait_replicas`
        // every write waits for one (`WAIT`).
        let first = tokio::time::Instant::now() + KICK_FIRST;
        let mut kick = tokio::time::interval_at(first, KICK_EVERY);
        kick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                got = &mut answer => return got,
                _ = kick.tick() => {
                    let mut c = self.conn.clone();
                    let ping = redis::cmd("PING");
                    let one = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
                    tokio::spawn(async move { c.route_command(ping, one).await });
                }
            }
        }
    }

    /// The masters' direct connections, where an `ASK` may be followed:
    /// none with `wait_replicas` (`WAIT` counts the cluster client's).
    fn direct(&self) -> Option<std::sync::Arc<Masters>> {
        self.wait.is_none().then(|| self.masters.clone())
    }

    fn forget_scripts(&self) {
        self.loaded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Sends each `SCRIPT LOAD` of `pipeline` not yet known to be everywhere
    /// to every node (the client routes it so), once.
    async fn load_scripts(&mut self, pipeline: &Pipeline) -> redis::RedisResult<()> {
        for cmd in pipeline.cmd_iter().filter(|c| is_script_load(c)) {
            let body: Vec<u8> = match cmd.args_iter().nth(2) {
                Some(redis::Arg::Simple(b)) => b.to_vec(),
                _ => continue,
            };
            let known = self
                .loaded
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&body);
            if !known {
                let _: Value = self.req_packed_command(cmd).await?;
                self.loaded
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(body);
            }
        }
        Ok(())
    }
}

/// Sends one run of a pipeline (one slot) and returns its answers. The client answers a
/// whole run with its first redirect, though commands before it may have
/// run (a migration can end between two of them): only a run of one command
/// (with idempotent script loads) is known not to have run, and is sent again.
/// `direct`: the masters' direct connections, where an `ASK` may be followed.
async fn send_run(
    mut conn: ClusterConnection,
    direct: Option<std::sync::Arc<Masters>>,
    run: Pipeline,
) -> redis::RedisResult<Vec<Value>> {
    let alone = lone_kind(&run).is_some();
    let deadline = tokio::time::Instant::now() + REDIRECTS_FOR;
    loop {
        let mut got = conn.req_packed_commands(&run, 0, run.len()).await;
        if let (true, Err(e)) = (alone, &got) {
            if let Some(there) = asked(direct.as_deref(), e, &run).await {
                got = there;
            }
        }
        match got {
            Err(e) if alone && not_run(&e) && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            got => return got,
        }
    }
}

/// `run`, refused with `ASK` (it did not run: its key has left a slot still
/// in migration), sent to the importing node the answer names, each command
/// after `ASKING` (which admits the next command only), on a direct
/// connection to that node: the cluster client's own is not used, as a node
/// it has no connection to (one just added, importing its first slot) makes
/// it drop every connection. The run's answers, without the `ASKING`s'; a
/// refusal there is the error returned. `None` when `e` is not an `ASK`, or
/// there are no direct connections (with `wait_replicas`: `WAIT` would not
/// count a write made on one), or the node cannot be reached (nothing was
/// sent: the `ASK` is waited out as before).
async fn asked(
    direct: Option<&Masters>,
    e: &redis::RedisError,
    run: &Pipeline,
) -> Option<redis::RedisResult<Vec<Value>>> {
    let masters = direct?;
    if e.code() != Some("ASK") {
        return None;
    }
    let (node, _) = e.redirect_node()?;
    let node = match node.rsplit_once(':') {
        Some((host, port)) if host.contains(':') && !host.starts_with('[') => {
            format!("[{host}]:{port}")
        }
        _ => node.to_string(),
    };
    let mut conn = masters.conn(&node).await.ok()?;
    let mut pipe = redis::pipe();
    for cmd in run.cmd_iter() {
        pipe.cmd("ASKING");
        pipe.add_command(cmd.clone());
    }
    let got = match conn.req_packed_commands(&pipe, 0, pipe.len()).await {
        Ok(got) if got.len() == pipe.len() => Ok(got),
        Ok(got) => Err(redis::RedisError::from(std::io::Error::other(format!(
            "{node} answered {} of {} commands",
            got.len(),
            pipe.len()
        )))),
        Err(e) => Err(e),
    };
    if got.is_err() {
        masters.forget(Some(&node)).await;
    }
    Some(got.and_then(|answers| {
        let answers: Vec<Value> = answers.into_iter().skip(1).step_by(2).collect();
        let refused = answers.iter().find_map(|a| match a {
            Value::ServerError(e) if did_not_run(e.code()) => Some(e.clone()),
            _ => None,
        });
        match refused {
            Some(e) => Err(e.into()),
            None => Ok(answers),
        }
    }))
}

/// Whether the cluster client sends `cmd` to several nodes itself (its own
/// table is not public): the keyless commands it sends to every node or
/// master, and the commands over several keys it splits by slot. Those any
/// of this project's tools send are `SCRIPT LOAD`, `WAIT`, the ACL probes
/// and the probe streams' `DEL`; the rest are their kin.
fn spreads(cmd: &Cmd) -> bool {
    let mut args = cmd.args_iter().filter_map(|a| match a {
        redis::Arg::Simple(a) => Some(a.to_ascii_uppercase()),
        _ => None,
    });
    let Some(name) = args.next() else {
        return false;
    };
    let sub = args.next();
    let several = args.next().is_some();
    // As redis 1.8's routing table (`cluster_handling/routing.rs`).
    match (name.as_slice(), sub.as_deref()) {
        (b"SCRIPT", Some(b"LOAD" | b"FLUSH" | b"KILL" | b"EXISTS"))
        | (b"CONFIG", Some(b"SET" | b"RESETSTAT" | b"REWRITE"))
        | (b"ACL", Some(b"SETUSER" | b"DELUSER" | b"SAVE"))
        | (b"CLIENT", Some(b"SETNAME" | b"SETINFO"))
        | (b"SLOWLOG", Some(b"GET" | b"LEN" | b"RESET"))
        | (
            b"LATENCY",
            Some(b"RESET" | b"GRAPH" | b"HISTOGRAM" | b"HISTORY" | b"DOCTOR" | b"LATEST"),
        )
        | (
            b"PUBSUB",
            Some(b"NUMPAT" | b"CHANNELS" | b"NUMSUB" | b"SHARDCHANNELS" | b"SHARDNUMSUB"),
        )
        | (b"FUNCTION", Some(b"KILL" | b"STATS" | b"DELETE" | b"FLUSH" | b"LOAD" | b"RESTORE"))
        | (b"MEMORY", Some(b"DOCTOR" | b"MALLOC-STATS" | b"PURGE" | b"STATS"))
        | (
            b"FLUSHALL" | b"FLUSHDB" | b"PING" | b"UNWATCH" | b"WAIT" | b"WAITAOF" | b"DBSIZE"
            | b"KEYS" | b"INFO" | b"DEBUG" | b"RANDOMKEY",
            _,
        ) => true,
        (b"DEL" | b"UNLINK" | b"EXISTS" | b"TOUCH" | b"MGET" | b"WATCH", Some(_)) => several,
        // Pairs: a second key after the first value.
        (b"MSET", Some(_)) => args.next().is_some(),
        _ => false,
    }
}

/// Whether an error code says a node refused a command without running it:
/// moved slots, a migration under way, a node that is no longer a master or
/// a cluster not serving.
fn did_not_run(code: &str) -> bool {
    matches!(
        code,
        "MOVED" | "ASK" | "TRYAGAIN" | "READONLY" | "CLUSTERDOWN"
    )
}

/// A spawned send that ended without an answer (it panicked).
fn ended(e: tokio::task::JoinError) -> redis::RedisError {
    redis::RedisError::from(std::io::Error::other(format!("a pipeline run ended: {e}")))
}

/// The masters by address, each with a connection of its own once used,
/// and the slot map that says which serves a key (from `CLUSTER SHARDS`,
/// fetched again after a redirect or a failed connection).
struct Masters {
    config: RedisConfig,
    owners: tokio::sync::Mutex<Option<std::sync::Arc<Owners>>>,
    conns: tokio::sync::Mutex<std::collections::HashMap<String, redis::aio::MultiplexedConnection>>,
}

impl Masters {
    /// The slot map, fetched if unknown; `None` when the cluster will not
    /// say (the caller goes through the cluster client).
    async fn owners(&self, conn: &mut ClusterConnection) -> Option<std::sync::Arc<Owners>> {
        let mut owners = self.owners.lock().await;
        if owners.is_none() {
            *owners = Owners::fetch(conn, self.tls())
                .await
                .ok()
                .filter(|o| !o.0.is_empty())
                .map(std::sync::Arc::new);
        }
        owners.clone()
    }

    /// The connection to master `node` (`host:port`), made as the cluster
    /// client's are (user, password, TLS and certificates of `[redis]`).
    /// The connections' map is not locked while connecting: the masters of one batch
    /// connect side by side, and a slow node holds up only its own runs.
    async fn conn(&self, node: &str) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        if let Some(c) = self.conns.lock().await.get(node) {
            return Ok(c.clone());
        }
        let url = format!("{}://{node}", if self.tls() { "rediss" } else { "redis" });
        let (client, _) = client_at("redis.cluster", &url, &self.config, Auth::Server)
            .map_err(|e| redis::RedisError::from(std::io::Error::other(e.to_string())))?;
        let settings = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(Some(Duration::from_secs(10)));
        let conn = client
            .get_multiplexed_async_connection_with_config(&settings)
            .await?;
        // Two batches may have connected at once: the first kept is used.
        let mut conns = self.conns.lock().await;
        Ok(conns.entry(node.to_string()).or_insert(conn).clone())
    }

    /// Whether the nodes speak TLS (`redis.cluster` names `rediss://` URLs:
    /// all of one scheme, as the config checks).
    fn tls(&self) -> bool {
        self.config
            .cluster
            .first()
            .is_some_and(|u| u.starts_with("rediss://"))
    }

    /// Forgets the slot map and, when given, a master's connection (after a
    /// redirect or a failed send: the map or the node changed).
    async fn forget(&self, node: Option<&str>) {
        *self.owners.lock().await = None;
        if let Some(node) = node {
            self.conns.lock().await.remove(node);
        }
    }
}

/// A run holding one command besides script loads: that command's name and,
/// for a script, which script (its SHA).
fn lone_kind(run: &Pipeline) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut commands = run.cmd_iter().filter(|c| !is_script_load(c));
    let cmd = commands.next()?;
    if commands.next().is_some() {
        return None;
    }
    let mut args = cmd.args_iter().filter_map(|a| match a {
        redis::Arg::Simple(a) => Some(a.to_ascii_uppercase()),
        _ => None,
    });
    let name = args.next()?;
    let script = match name.as_slice() {
        b"EVALSHA" | b"EVALSHA_RO" => args.next().unwrap_or_default(),
        _ => Vec::new(),
    };
    Some((name, script))
}

/// A new connection of the blocking reads' client (no reply timeout).
pub(crate) async fn dedicated(client: &ClusterClient) -> Result<ClusterConnection> {
    Ok(client.get_async_connection().await?)
}

/// Whether a client's replies time out: the shared connection's do (10 s);
/// blocking reads wait as long as they asked to (the client's overall
/// timeout is fixed when it is built, so they need a client of their own).
#[derive(Clone, Copy, PartialEq)]
enum Replies {
    TimedOut,
    Awaited,
}

/// The cluster client for `[redis]`: the same checks on each node's URL as
/// for one server (TLS, loopback for plain TCP, certificates), the client's
/// own re-sending off.
fn cluster_client(config: &RedisConfig, replies: Replies) -> Result<ClusterClient> {
    let mut nodes = Vec::new();
    let mut tls = false;
    for url in &config.cluster {
        let (client, secure) = client_at("redis.cluster", url, config, Auth::Server)?;
        nodes.push(client.get_connection_info().clone());
        tls = secure;
    }
    let mut builder = ClusterClientBuilder::new(nodes)
        .retries(0)
        .connection_timeout(Duration::from_secs(5))
        .tcp_settings(tcp_settings());
    builder = match replies {
        Replies::TimedOut => builder.response_timeout(Duration::from_secs(10)),
        Replies::Awaited => builder.overall_response_timeout(None),
    };
    if let Some(user) = &config.username {
        builder = builder.username(user);
    }
    if let Some(path) = &config.password_file {
        builder = builder.password(crate::config::read_secret("redis.password_file", path)?);
    }
    if tls {
        builder = builder
            .tls(redis::TlsMode::Secure)
            .certs(certificates(config)?);
    }
    builder
        .build()
        .map_err(|e| ConfigError::invalid("redis.cluster", e.to_string()).into())
}

/// A connection refused at start-up, told apart as `Conn` does for one
/// server: a password or certificate is a deployment error, named.
fn refused(config: &RedisConfig, e: redis::RedisError) -> Error {
    if e.kind() == redis::ErrorKind::AuthenticationFailed || e.code() == Some("WRONGPASS") {
        Error::Permission {
            command: format!(
                "AUTH as {}",
                config.username.as_deref().unwrap_or("default")
            ),
            message: e.to_string(),
        }
    } else if crate::topology::refused_certificate(&e) {
        ConfigError::invalid(
            "redis.ca_file",
            format!(
                "the TLS certificate of a cluster node (of {}) was refused: {e}",
                nodes(config)
            ),
        )
        .into()
    } else {
        Error::Redis(e)
    }
}

/// The nodes `redis.cluster` names, as `host:port` (for messages: a URL may
/// carry a password).
fn nodes(config: &RedisConfig) -> String {
    use redis::IntoConnectionInfo;
    let at = |url: &String| match url
        .as_str()
        .into_connection_info()
        .map(|i| i.addr().clone())
    {
        Ok(redis::ConnectionAddr::Tcp(host, port))
        | Ok(redis::ConnectionAddr::TcpTls { host, port, .. }) => format!("{host}:{port}"),
        _ => "(an unreadable URL)".to_string(),
    };
    config.cluster.iter().map(at).collect::<Vec<_>>().join(" ")
}

/// Whether a node refused the command before running it.
fn not_run(e: &redis::RedisError) -> bool {
    e.code().is_some_and(did_not_run)
}

/// The key a command routes by: the first key of a script, the first stream
/// of a read, otherwise its first argument; none for keyless commands.
fn key_of(cmd: &Cmd) -> Option<Vec<u8>> {
    let args: Vec<&[u8]> = cmd
        .args_iter()
        .filter_map(|a| match a {
            redis::Arg::Simple(a) => Some(a),
            _ => None,
        })
        .collect();
    let name = args.first()?.to_ascii_uppercase();
    match name.as_slice() {
        b"EVAL" | b"EVALSHA" | b"EVAL_RO" | b"EVALSHA_RO" | b"FCALL" | b"FCALL_RO" => {
            let keys: usize = std::str::from_utf8(args.get(2)?).ok()?.parse().ok()?;
            (keys > 0).then(|| args.get(3).map(|k| k.to_vec()))?
        }
        // Container commands: the key follows the subcommand.
        b"XINFO" | b"XGROUP" | b"OBJECT" | b"MEMORY" => args.get(2).map(|k| k.to_vec()),
        b"XREAD" | b"XREADGROUP" => {
            let at = args
                .iter()
                .position(|a| a.eq_ignore_ascii_case(b"STREAMS"))?;
            args.get(at + 1).map(|k| k.to_vec())
        }
        b"SCRIPT" | b"PING" | b"TIME" | b"WAIT" | b"ROLE" | b"INFO" | b"CLUSTER" | b"ACL"
        | b"MULTI" | b"EXEC" | b"HELLO" | b"AUTH" => None,
        _ => args.get(1).map(|k| k.to_vec()),
    }
}

/// A pipeline cut into runs of consecutive commands of one slot.
fn runs(pipeline: &Pipeline) -> Vec<Pipeline> {
    let mut runs: Vec<(Option<Slot>, Pipeline)> = Vec::new();
    for cmd in pipeline.cmd_iter() {
        let slot = key_of(cmd).map(Slot::for_key);
        match runs.last_mut() {
            Some((at, run)) if slot.is_none() || at.is_none() || *at == slot => {
                if at.is_none() {
                    *at = slot;
                }
                run.add_command(cmd.clone());
            }
            _ => {
                let mut run = redis::pipe();
                run.add_command(cmd.clone());
                runs.push((slot, run));
            }
        }
    }
    runs.into_iter().map(|(_, run)| run).collect()
}

/// A command's name, for messages.
fn name_of(cmd: &Cmd) -> String {
    match cmd.args_iter().next() {
        Some(redis::Arg::Simple(a)) => String::from_utf8_lossy(a).to_ascii_uppercase(),
        _ => "?".into(),
    }
}

/// A pipeline's commands by name, for messages (`EVALSHA x3, XACK`).
fn summary(pipeline: &Pipeline) -> String {
    let mut counted: Vec<(String, usize)> = Vec::new();
    for cmd in pipeline.cmd_iter() {
        let name = name_of(cmd);
        match counted.last_mut() {
            Some((last, n)) if *last == name => *n += 1,
            _ => counted.push((name, 1)),
        }
    }
    counted
        .into_iter()
        .map(|(name, n)| if n > 1 { format!("{name} x{n}") } else { name })
        .collect::<Vec<_>>()
        .join(", ")
}

fn is_script_load(cmd: &Cmd) -> bool {
    let mut args = cmd.args_iter().filter_map(|a| match a {
        redis::Arg::Simple(a) => Some(a),
        _ => None,
    });
    matches!(
        (args.next(), args.next()),
        (Some(a), Some(b)) if a.eq_ignore_ascii_case(b"SCRIPT") && b.eq_ignore_ascii_case(b"LOAD")
    )
}

/// The slot ranges each master serves: `(first, last, "host:port")`.
pub struct Owners(Vec<(u16, u16, String)>);

impl Owners {
    /// As the cluster says now (`CLUSTER SHARDS`).
    async fn fetch(conn: &mut ClusterConnection, tls: bool) -> redis::RedisResult<Owners> {
        let shards: Value = redis::cmd("CLUSTER")
            .arg("SHARDS")
            .query_async(conn)
            .await
            .inspect_err(|e| {
                if e.is_timeout() {
                    tracing::warn!("CLUSTER SHARDS timed out");
                }
            })?;
        Ok(Owners::from_shards(&shards, tls))
    }

    /// From a `CLUSTER SHARDS` answer; `tls`: the nodes are reached by
    /// their TLS port (a node may have a plain one too).
    fn from_shards(v: &Value, tls: bool) -> Owners {
        let mut ranges = Vec::new();
        let Value::Array(shards) = v else {
            return Owners(ranges);
        };
        for shard in shards {
            let master = match field(shard, "nodes") {
                Some(Value::Array(nodes)) => nodes.iter().find_map(|n| {
                    let text =
                        |k: &str| field(n, k).and_then(crate::store::text).unwrap_or_default();
                    let (plain, secure) = (int(field(n, "port")), int(field(n, "tls-port")));
                    let port = match tls {
                        true => secure.or(plain),
                        false => plain.or(secure),
                    }?;
                    // An unknown endpoint (`?`) is no address: such a
                    // shard is left out, so its keys go through the client.
                    let host = match text("endpoint") {
                        e if e.is_empty() => text("ip"),
                        e => e,
                    };
                    let host = match host.contains(':') {
                        true => format!("[{host}]"), // IPv6
                        false => host,
                    };
                    let usable = text("role") == "master"
                        && !host.is_empty()
                        && host != "?"
                        && matches!(text("health").as_str(), "online" | "");
                    usable.then(|| format!("{host}:{port}"))
                }),
                _ => None,
            };
            let (Some(master), Some(Value::Array(bounds))) = (master, field(shard, "slots")) else {
                continue;
            };
            for b in bounds.chunks(2) {
                if let (Some(a), Some(z)) = (int(b.first()), int(b.get(1))) {
                    ranges.push((a as u16, z as u16, master.clone()));
                }
            }
        }
        Owners(ranges)
    }

    /// Every master once, as `(host, port)`.
    fn masters(&self) -> Vec<(String, u16)> {
        let mut all: Vec<(String, u16)> = self
            .0
            .iter()
            .filter_map(|(_, _, at)| {
                let (host, port) = at.rsplit_once(':')?;
                let host = host.trim_start_matches('[').trim_end_matches(']');
                Some((host.to_string(), port.parse().ok()?))
            })
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// The master serving `key`'s slot.
    fn of_key(&self, key: &[u8]) -> Option<&str> {
        let slot = slot_number(key);
        self.0
            .iter()
            .find(|(a, z, _)| (*a..=*z).contains(&slot))
            .map(|(_, _, m)| m.as_str())
    }

    /// The master serving `key`'s slot, and the slot.
    pub fn of(&self, key: &str) -> (Option<&str>, u16) {
        (self.of_key(key.as_bytes()), slot_number(key.as_bytes()))
    }
}

/// The slot of a key as a number (CRC16/XMODEM of its hash tag, or of the
/// whole key, modulo 16384): the redis crate's `Slot` does not give it out.
fn slot_number(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|b| *b == b'{')
        .and_then(|open| {
            let close = key[open + 1..].iter().position(|b| *b == b'}')?;
            Some(&key[open + 1..open + 1 + close])
        })
        .filter(|tag| !tag.is_empty());
    let mut crc: u16 = 0;
    for byte in tagged.unwrap_or(key) {
        crc ^= u16::from(*byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// One line per shard of a `CLUSTER SHARDS` answer: its slot ranges, its
/// master and replicas with their health.
fn describe_shards(v: &Value) -> String {
    let Value::Array(shards) = v else {
        return "an unexpected CLUSTER SHARDS answer".into();
    };
    let mut lines = vec![format!("a cluster of {} shards", shards.len())];
    for shard in shards {
        let slots = match field(shard, "slots") {
            Some(Value::Array(bounds)) => bounds
                .chunks(2)
                .map(|b| {
                    format!(
                        "{}-{}",
                        int(b.first()).unwrap_or(0),
                        int(b.get(1)).unwrap_or(0)
                    )
                })
                .collect::<Vec<_>>()
                .join(","),
            _ => String::new(),
        };
        let nodes = match field(shard, "nodes") {
            Some(Value::Array(nodes)) => nodes
                .iter()
                .map(|n| {
                    let text =
                        |k: &str| field(n, k).and_then(crate::store::text).unwrap_or_default();
                    let port = field(n, "port").and_then(|p| int(Some(p))).unwrap_or(0);
                    format!(
                        "{} {}:{} ({})",
                        text("role"),
                        text("ip"),
                        port,
                        text("health")
                    )
                })
                .collect::<Vec<_>>()
                .join(", "),
            _ => String::new(),
        };
        lines.push(format!("  slots {slots}: {nodes}"));
    }
    lines.join("\n")
}

/// A field of a RESP2 flat map (`[k, v, k, v…]`) or a RESP3 map.
fn field<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    match v {
        Value::Array(items) => items
            .chunks(2)
            .find(|kv| crate::store::text(&kv[0]).as_deref() == Some(name))
            .and_then(|kv| kv.get(1)),
        Value::Map(pairs) => pairs
            .iter()
            .find(|(k, _)| crate::store::text(k).as_deref() == Some(name))
            .map(|(_, v)| v),
        _ => None,
    }
}

fn int(v: Option<&Value>) -> Option<i64> {
    match v? {
        Value::Int(i) => Some(*i),
        other => crate::store::text(other)?.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipelines_are_cut_into_runs_of_one_slot() {
        let mut p = redis::pipe();
        p.cmd("SCRIPT").arg("LOAD").arg("return 1");
        p.cmd("EVALSHA").arg("x").arg(1).arg("approval:a").arg("v");
        p.hset("approval:a", "f", "v");
        p.hset("approval:b", "f", "v");
        p.cmd("EVALSHA").arg("x").arg(0).arg("v");
        p.hset("{mail:outbox}:in-flight", "f", "v");
        p.xadd("mail:outbox", "*", &[("a", "b")]);
        let lens: Vec<usize> = runs(&p).iter().map(|r| r.len()).collect();
        // approval:a (with the keyless load before it); approval:b with the
        // keyless script after it; the marks hash and its stream share a
        // slot.
        assert_eq!(lens, [3, 2, 2]);
    }

    #[test]
    fn commands_the_client_spreads_are_known() {
        let spreads = |args: &[&str]| {
            let mut c = redis::cmd(args[0]);
            for a in &args[1..] {
                c.arg(*a);
            }
            spreads(&c)
        };
        assert!(spreads(&["script", "load", "return 1"]));
        assert!(spreads(&["WAIT", "1", "100"]));
        assert!(spreads(&["SCRIPT", "EXISTS", "a", "b"]));
        assert!(spreads(&["DEL", "a", "b"]));
        assert!(spreads(&["MGET", "a", "b"]));
        assert!(spreads(&["MSET", "a", "1", "b", "2"]));
        // One key, or a keyed command: the client sends it to one node.
        assert!(!spreads(&["DEL", "a"]));
        assert!(!spreads(&["MSET", "a", "1"]));
        assert!(!spreads(&["HSET", "a", "f", "v"]));
        assert!(!spreads(&["EVALSHA", "x", "1", "k"]));
        assert!(!spreads(&["TIME"]));
    }

    #[test]
    fn slot_numbers_agree_with_the_client() {
        for key in [
            "ann:mail:outbox",
            "{mail:outbox}:in-flight",
            "a{}b",
            "x{y",
            "",
            "approval:1",
        ] {
            assert_eq!(
                Slot::new(slot_number(key.as_bytes())),
                Some(Slot::for_key(key)),
                "{key}"
            );
        }
        // The examples of the cluster specification.
        assert_eq!(slot_number(b"123456789"), 0x31C3);
    }

    #[test]
    fn reads_route_by_their_first_stream() {
        let mut c = redis::cmd("XREADGROUP");
        c.arg("GROUP").arg("g").arg("c").arg("COUNT").arg(5);
        c.arg("STREAMS").arg("ann:mail:outbox").arg(">");
        assert_eq!(key_of(&c).as_deref(), Some(&b"ann:mail:outbox"[..]));
        assert_eq!(key_of(&redis::cmd("TIME")), None);
    }
}
