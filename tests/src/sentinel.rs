//! A master, a replica and three Sentinels on loopback ports, for failover
//! tests: the Sentinels monitor the master as [`Sentinels::NAME`], declare it
//! down after one second and may fail over again a few seconds later.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_port, RedisServer};

/// Three Sentinels and the replica they start with (the master is the
/// caller's, usually the deployment's).
pub struct Sentinels {
    pub replica: RedisServer,
    sentinels: Vec<(Child, u16)>,
    _dir: tempfile::TempDir,
}

impl Sentinels {
    /// The name the Sentinels monitor the master under.
    pub const NAME: &'static str = "cowboy";

    /// Starts a replica of `master` and three Sentinels watching it, and
    /// returns once the replica is in sync and the Sentinels know the replica
    /// and each other (without that no failover can happen).
    pub fn start(master: &RedisServer) -> Sentinels {
        let replica =
            RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port.to_string()]);
        wait_for("the replica in sync", || {
            info(replica.port, "replication").contains("master_link_status:up")
        });
        let dir = tempfile::tempdir().expect("temp dir");
        let sentinels = (0..3)
            .map(|i| spawn_sentinel(&dir.path().join(format!("s{i}")), master.port))
            .collect();
        let set = Sentinels {
            replica,
            sentinels,
            _dir: dir,
        };
        for &(_, port) in &set.sentinels {
            wait_for(
                "each Sentinel knowing the replica and the other two",
                || count(port, "REPLICAS") == 1 && count(port, "SENTINELS") == 2,
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
                    connect(s)
                        .and_then(|mut c| {
                            redis::cmd("SENTINEL")
                                .arg("GET-MASTER-ADDR-BY-NAME")
                                .arg(Self::NAME)
                                .query::<(String, u16)>(&mut c)
                                .ok()
                        })
                        .is_some_and(|(_, p)| p == port)
                }) && info(port, "replication").contains("role:master")
            },
        );
    }

    /// Waits (bounded) until the server on `port` is a replica in sync.
    pub fn wait_replica(port: u16) {
        wait_for(&format!("127.0.0.1:{port} a replica in sync"), || {
            let text = info(port, "replication");
            text.contains("role:slave") && text.contains("master_link_status:up")
        });
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

fn spawn_sentinel(dir: &Path, master: u16) -> (Child, u16) {
    std::fs::create_dir_all(dir).expect("sentinel dir");
    for _ in 0..5 {
        let port = free_port();
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor {name} 127.0.0.1 {master} 2\n\
                 sentinel down-after-milliseconds {name} 1000\n\
                 sentinel failover-timeout {name} 3000\n\
                 sentinel parallel-syncs {name} 1\n",
                dir.display(),
                name = Sentinels::NAME
            ),
        )
        .expect("write sentinel.conf");
        let mut child = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server --sentinel");
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if connect(port).is_some() {
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

fn connect(port: u16) -> Option<redis::Connection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    client
        .get_connection_with_timeout(Duration::from_secs(1))
        .ok()
}

/// `INFO section` of the server on `port` ('' when it does not answer).
fn info(port: u16, section: &str) -> String {
    connect(port)
        .and_then(|mut c| redis::cmd("INFO").arg(section).query(&mut c).ok())
        .unwrap_or_default()
}

/// How many replicas / other Sentinels a Sentinel knows for the master.
fn count(port: u16, what: &str) -> usize {
    connect(port)
        .and_then(|mut c| {
            redis::cmd("SENTINEL")
                .arg(what)
                .arg(Sentinels::NAME)
                .query::<Vec<redis::Value>>(&mut c)
                .ok()
        })
        .map_or(0, |v| v.len())
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
