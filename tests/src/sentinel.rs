//! A master, a replica and three Sentinels on loopback ports, for failover
//! tests: the Sentinels monitor the master as [`Sentinels::NAME`], declare it
//! down after three seconds (a loaded test machine must not look dead) and may fail over again a few seconds later.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_port, RedisServer};

/// How the servers are reached when they have ACL users; the default (no
/// field set) is the default user without a password everywhere.
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// User and password the harness itself uses on the data servers.
    pub data: Option<(String, String)>,
    /// Arguments every data server gets (its ACL file, `masteruser` and
    /// `masterauth`, so it can replicate whichever server is master).
    pub data_args: Vec<String>,
    /// Lines each `sentinel.conf` gets after `sentinel monitor`
    /// (`sentinel auth-user`, `auth-pass`, `requirepass`).
    pub sentinel_lines: Vec<String>,
    /// The Sentinels' `requirepass`, for the harness's own questions.
    pub sentinel_password: Option<String>,
}

/// Three Sentinels and the replica they start with (the master is the
/// caller's, usually the deployment's).
pub struct Sentinels {
    pub replica: RedisServer,
    sentinels: Vec<(Child, u16)>,
    access: Access,
    _dir: tempfile::TempDir,
}

impl Sentinels {
    /// The name the Sentinels monitor the master under.
    pub const NAME: &'static str = "cowboy";

    /// Starts a replica of `master` and three Sentinels watching it, and
    /// returns once the replica is in sync and the Sentinels know the replica
    /// and each other (without that no failover can happen).
    pub fn start(master: &RedisServer) -> Sentinels {
        Self::start_with(master, Access::default())
    }

    /// Like [`Self::start`], on servers with ACL users (`master` was started
    /// with `access.data_args` too).
    pub fn start_with(master: &RedisServer, access: Access) -> Sentinels {
        let mut args: Vec<&str> = access.data_args.iter().map(String::as_str).collect();
        let master_port = master.port.to_string();
        args.extend(["--replicaof", "127.0.0.1", &master_port]);
        let replica = RedisServer::start_on(master.engine, &args);
        let dir = tempfile::tempdir().expect("temp dir");
        let sentinels = (0..3)
            .map(|i| {
                let at = dir.path().join(format!("s{i}"));
                spawn_sentinel(&at, master, &access)
            })
            .collect();
        let set = Sentinels {
            replica,
            sentinels,
            access,
            _dir: dir,
        };
        set.wait_replica(set.replica.port);
        for &(_, port) in &set.sentinels {
            wait_for(
                "each Sentinel knowing the replica and the other two",
                || set.count(port, "REPLICAS") == 1 && set.count(port, "SENTINELS") == 2,
            );
        }
        set
    }

    /// The `[redis]` lines that find the master through these Sentinels.
    pub fn redis_table(&self) -> String {
        let urls: Vec<String> = self
            .sentinels
            .iter()
            .map(|(_, p)| format!("\"redis://127.0.0.1:{p}\""))
            .collect();
        format!(
            "sentinels = [{}]\nmaster_name = \"{}\"\n",
            urls.join(", "),
            Self::NAME
        )
    }

    /// Waits (bounded) until every Sentinel names the server on `port` master
    /// and it says so itself.
    pub fn wait_master(&self, port: u16) {
        wait_for(
            &format!("the Sentinels naming 127.0.0.1:{port} master"),
            || {
                self.sentinels.iter().all(|&(_, s)| {
                    self.sentinel(s)
                        .and_then(|mut c| {
                            redis::cmd("SENTINEL")
                                .arg("GET-MASTER-ADDR-BY-NAME")
                                .arg(Self::NAME)
                                .query::<(String, u16)>(&mut c)
                                .ok()
                        })
                        .is_some_and(|(_, p)| p == port)
                }) && self.info(port, "replication").contains("role:master")
            },
        );
    }

    /// Waits (bounded) until the server on `port` is a replica in sync.
    pub fn wait_replica(&self, port: u16) {
        wait_for(&format!("127.0.0.1:{port} a replica in sync"), || {
            let text = self.info(port, "replication");
            text.contains("role:slave") && text.contains("master_link_status:up")
        });
    }

    /// `INFO section` of the data server on `port` ('' when it does not answer).
    fn info(&self, port: u16, section: &str) -> String {
        let auth = self
            .access
            .data
            .as_ref()
            .map(|(u, p)| (u.as_str(), p.as_str()));
        connect(port, auth)
            .and_then(|mut c| redis::cmd("INFO").arg(section).query(&mut c).ok())
            .unwrap_or_default()
    }

    /// A connection to the Sentinel on `port`.
    fn sentinel(&self, port: u16) -> Option<redis::Connection> {
        let auth = self
            .access
            .sentinel_password
            .as_deref()
            .map(|p| ("default", p));
        connect(port, auth)
    }

    /// How many replicas / other Sentinels a Sentinel knows for the master.
    fn count(&self, port: u16, what: &str) -> usize {
        self.sentinel(port)
            .and_then(|mut c| {
                redis::cmd("SENTINEL")
                    .arg(what)
                    .arg(Self::NAME)
                    .query::<Vec<redis::Value>>(&mut c)
                    .ok()
            })
            .map_or(0, |v| v.len())
    }
}

impl Drop for Sentinels {
    fn drop(&mut self) {
        for (child, _) in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn spawn_sentinel(dir: &Path, server: &RedisServer, access: &Access) -> (Child, u16) {
    let master = server.port;
    std::fs::create_dir_all(dir).expect("sentinel dir");
    for _ in 0..5 {
        let port = free_port();
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor {name} 127.0.0.1 {master} 2\n\
                 sentinel down-after-milliseconds {name} 3000\n\
                 sentinel failover-timeout {name} 3000\n\
                 sentinel parallel-syncs {name} 1\n{}\n",
                dir.display(),
                access.sentinel_lines.join("\n"),
                name = Sentinels::NAME
            ),
        )
        .expect("write sentinel.conf");
        // The master's engine plays Sentinel too (Valkey's server binary
        // takes `--sentinel` as Redis's does).
        let mut child = Command::new(server.engine.binary())
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a Sentinel (server binary with --sentinel)");
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            // Up once it answers at all (NOAUTH included).
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return (child, port);
            }
            if let Ok(Some(_)) = child.try_wait() {
                break; // the port was taken meanwhile
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("a Sentinel did not start after 5 attempts");
}

/// A connection to 127.0.0.1:`port`, as `auth` (user, password) if given.
fn connect(port: u16, auth: Option<(&str, &str)>) -> Option<redis::Connection> {
    let url = match auth {
        Some((user, password)) => format!("redis://{user}:{password}@127.0.0.1:{port}"),
        None => format!("redis://127.0.0.1:{port}"),
    };
    let client = redis::Client::open(url).ok()?;
    client
        .get_connection_with_timeout(Duration::from_secs(1))
        .ok()
}

/// Polls `ready` every 50 ms for at most 30 s (Sentinels find each other by
/// messages sent every 2 s, and fail over in a few seconds).
fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
