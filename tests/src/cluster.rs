//! A Redis Cluster of three masters on loopback (no replicas), made the way
//! an operator makes one: servers with `cluster-enabled yes`, then
//! `redis-cli --cluster create`; slots moved with `redis-cli --cluster
//! reshard`. Dropped with its servers.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::{Engine, RedisServer};

pub struct Cluster {
    /// The nodes after the first (the first goes to the `Deployment`).
    pub rest: Vec<RedisServer>,
    pub ports: Vec<u16>,
    /// The user the harness manages the cluster as (`None`: the default user).
    admin: Option<(String, String)>,
}

impl Cluster {
    /// Starts three masters and joins them; returns the first (for
    /// `Deployment::with_redis_table`) and the cluster, once every node says
    /// `cluster_state:ok`.
    pub fn start() -> (RedisServer, Cluster) {
        Self::start_as(&[], None)
    }

    /// Like [`Self::start`], each node also given `extra` (an ACL users
    /// file: every node loads the same one), managed as `admin`.
    pub fn start_as(extra: &[&str], admin: Option<(&str, &str)>) -> (RedisServer, Cluster) {
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "2000",
        ];
        args.extend_from_slice(extra);
        let admin = admin.map(|(u, p)| (u.to_string(), p.to_string()));
        let engine = Engine::under_test();
        let mut nodes: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::start_on(engine, &args))
            .collect();
        let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .args(cli_auth(&admin))
            .output()
            .expect("redis-cli --cluster create (Debian: apt-get install -y redis-tools)");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let first = nodes.remove(0);
        let cluster = Cluster {
            rest: nodes,
            ports,
            admin,
        };
        cluster.wait_ok();
        (first, cluster)
    }

    /// The `[redis]` table naming every node.
    pub fn redis_table(&self) -> String {
        let urls: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("\"redis://127.0.0.1:{p}\""))
            .collect();
        format!("cluster = [{}]", urls.join(", "))
    }

    /// The node (its port) that holds `key`'s slot now.
    pub fn owner_of(&self, key: &str) -> u16 {
        let slot = self.slot_of(key);
        for &port in &self.ports {
            let mut c = connect(port, &self.admin);
            // Each node about itself: its `myself` line of CLUSTER NODES.
            let nodes: String = redis::cmd("CLUSTER").arg("NODES").query(&mut c).unwrap();
            for line in nodes.lines().filter(|l| l.contains("myself")) {
                for range in line.split(' ').skip(8) {
                    let (a, b) = match range.split_once('-') {
                        Some((a, b)) => (a.parse().unwrap_or(u16::MAX), b.parse().unwrap_or(0)),
                        None => match range.parse::<u16>() {
                            Ok(s) => (s, s),
                            Err(_) => continue,
                        },
                    };
                    if (a..=b).contains(&slot) {
                        return port;
                    }
                }
            }
        }
        panic!("no node owns slot {slot} of {key}");
    }

    /// The slot of `key` as the cluster computes it.
    pub fn slot_of(&self, key: &str) -> u16 {
        let mut c = connect(self.ports[0], &self.admin);
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut c)
            .unwrap()
    }

    /// Moves `slots` slots from the node on `from` to the node on `to`,
    /// keys and all, with `redis-cli --cluster reshard` (it migrates key by
    /// key: clients meet `ASK` and `MOVED` meanwhile).
    pub fn reshard(&self, from: u16, to: u16, slots: u32) {
        reshard_ports(&self.ports, from, to, slots)
    }

    /// How many slots the node on `port` holds.
    pub fn slots_of(&self, port: u16) -> u32 {
        let mut c = connect(port, &self.admin);
        let nodes: String = redis::cmd("CLUSTER").arg("NODES").query(&mut c).unwrap();
        let mine = nodes.lines().find(|l| l.contains("myself")).unwrap_or("");
        mine.split(' ')
            .skip(8)
            .filter_map(|range| match range.split_once('-') {
                Some((a, b)) => Some(b.parse::<u32>().ok()? - a.parse::<u32>().ok()? + 1),
                None => range.parse::<u32>().ok().map(|_| 1),
            })
            .sum()
    }

    fn wait_ok(&self) {
        wait_ok(&self.ports, &self.admin)
    }
}

/// [`Cluster::reshard`] on the cluster of `ports` (callable from a blocking
/// task while the test goes on).
pub fn reshard_ports(ports: &[u16], from: u16, to: u16, slots: u32) {
    let id = |port: u16| -> String {
        let mut c = connect(port, &None);
        redis::cmd("CLUSTER").arg("MYID").query(&mut c).unwrap()
    };
    let out = Command::new("redis-cli")
        .args(["--cluster", "reshard", &format!("127.0.0.1:{from}")])
        .args(["--cluster-from", &id(from), "--cluster-to", &id(to)])
        .args(["--cluster-slots", &slots.to_string(), "--cluster-yes"])
        .args(["--cluster-pipeline", "1"])
        .output()
        .expect("redis-cli --cluster reshard");
    assert!(
        out.status.success(),
        "redis-cli --cluster reshard failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    wait_ok(ports, &None);
}

/// Waits until every node says the cluster is ok and every slot is served.
fn wait_ok(ports: &[u16], admin: &Admin) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ok = ports.iter().all(|&p| {
            let mut c = connect(p, admin);
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(&mut c)
                .unwrap_or_default();
            info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
        });
        if ok {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the cluster on {ports:?} did not become ok"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The user the harness manages a cluster as.
type Admin = Option<(String, String)>;

/// `redis-cli` arguments to log in as the admin, if there is one.
fn cli_auth(admin: &Admin) -> Vec<String> {
    match admin {
        Some((u, p)) => vec!["--user".into(), u.clone(), "--pass".into(), p.clone()],
        None => Vec::new(),
    }
}

/// A plain connection to one node (as the admin, or the default user).
fn connect(port: u16, admin: &Admin) -> redis::Connection {
    let login = match admin {
        Some((u, p)) => format!("{u}:{p}@"),
        None => String::new(),
    };
    redis::Client::open(format!("redis://{login}127.0.0.1:{port}"))
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap()
}
