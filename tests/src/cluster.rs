//! A Redis Cluster of three masters on loopback (no replicas), made the way
//! an operator makes one: servers with `cluster-enabled yes`, then
//! `redis-cli --cluster create`; slots moved with `redis-cli --cluster
//! reshard`. Dropped with its servers.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::{Engine, RedisServer};

pub struct Cluster {
    /// The nodes after the first (the first goes to the `Deployment`).
    pub rest: Vec<RedisServer>,
    pub ports: Vec<u16>,
    /// How the harness reaches the nodes to manage them.
    admin: Admin,
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
        let login = admin.map(|(u, p)| (u.to_string(), p.to_string()));
        Self::launch(extra, Admin { login, ca: None }, 0)
    }

    /// Three masters, each with one replica (six nodes; `ports` lists all).
    /// Returns once every replica is in sync.
    pub fn start_with_replicas() -> (RedisServer, Cluster) {
        let (first, cluster) = Self::launch(&[], Admin::default(), 1);
        let mut replicas: Vec<u16> = Vec::new();
        for &port in &cluster.ports {
            if cluster.info(port, "replication").contains("role:slave") {
                replicas.push(port);
            }
        }
        assert_eq!(replicas.len(), 3, "three replicas");
        for port in replicas {
            cluster.wait_in_sync(port);
        }
        (first, cluster)
    }

    /// Three masters that speak TLS only, to clients and to each other
    /// (`tls-cluster yes`), under one private CA: the first node's
    /// [`RedisServer::ca`]. [`Self::redis_table`] names them `rediss://`.
    pub fn start_tls() -> (RedisServer, Cluster) {
        Self::launch(
            &["--tls-cluster", "yes"],
            Admin {
                login: None,
                ca: Some(PathBuf::new()),
            },
            0,
        )
    }

    fn launch(extra: &[&str], mut admin: Admin, replicas: usize) -> (RedisServer, Cluster) {
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "2000",
        ];
        args.extend_from_slice(extra);
        let mut nodes: Vec<RedisServer> = Vec::new();
        for _ in 0..3 * (1 + replicas) {
            let node = match (&admin.ca, nodes.first()) {
                (None, _) => RedisServer::start_on(Engine::under_test(), &args),
                (Some(_), None) => RedisServer::start_tls_with(&args),
                (Some(_), Some(first)) => RedisServer::start_tls_beside(first, &args),
            };
            nodes.push(node);
        }
        if admin.ca.is_some() {
            admin.ca = Some(nodes[0].ca().0);
            // The cluster bus always checks the connecting node's
            // certificate, which must be a client's.
            let (cert, key) = nodes[0].client_cert();
            for node in &nodes {
                let _: () = redis::cmd("CONFIG")
                    .arg("SET")
                    .arg("tls-client-cert-file")
                    .arg(cert.display().to_string())
                    .arg("tls-client-key-file")
                    .arg(key.display().to_string())
                    .query(&mut connect(node.port, &admin))
                    .expect("CONFIG SET tls-client-cert-file");
            }
        }
        let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
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

    /// The `[redis]` table naming every node (with the CA of a TLS cluster).
    pub fn redis_table(&self) -> String {
        let scheme = match self.admin.ca {
            Some(_) => "rediss",
            None => "redis",
        };
        let urls: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("\"{scheme}://127.0.0.1:{p}\""))
            .collect();
        let ca = match &self.admin.ca {
            Some(ca) => format!("\nca_file = \"{}\"", ca.display()),
            None => String::new(),
        };
        format!("cluster = [{}]{ca}", urls.join(", "))
    }

    /// The node (its port) that holds `key`'s slot now.
    pub fn owner_of(&self, key: &str) -> u16 {
        let slot = self.slot_of(key);
        for &port in &self.ports {
            // A node killed by the test does not answer.
            let Some(mut c) = try_connect(port, &self.admin) else {
                continue;
            };
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

    /// Kills (`SIGKILL`) the node on `port` (not the first: the
    /// deployment holds that one) and waits until the others serve every
    /// slot again (its replica promoted).
    pub fn kill(&mut self, port: u16) {
        let node = self.rest.iter_mut().find(|n| n.port == port);
        node.expect("a node of the cluster, not the first").kill();
        self.wait_ok_without(port);
    }

    /// Starts the killed node on `port` again (it rejoins as its promoted
    /// replica's replica) and waits until it is a replica in sync.
    pub fn restart(&mut self, port: u16) {
        let node = self.rest.iter_mut().find(|n| n.port == port);
        node.expect("a node of the cluster, not the first")
            .restart();
        self.wait_in_sync(port);
    }

    /// Waits until the nodes but the one on `port` serve every slot
    /// themselves (its slots taken over by its replica) and say the
    /// cluster is ok.
    pub fn wait_ok_without(&self, port: u16) {
        let others: Vec<u16> = self.ports.iter().copied().filter(|&p| p != port).collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        while others.iter().map(|&p| self.slots_of(p)).sum::<u32>() < 16384 {
            assert!(
                Instant::now() < deadline,
                "no replica took over the slots of 127.0.0.1:{port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        wait_ok(&others, &self.admin);
    }

    /// Waits until the node on `port` is a replica whose link to its master
    /// is up, and the whole cluster is ok.
    pub fn wait_in_sync(&self, port: u16) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let info: String = try_connect(port, &self.admin)
                .and_then(|mut c| redis::cmd("INFO").arg("replication").query(&mut c).ok())
                .unwrap_or_default();
            if info.contains("role:slave") && info.contains("master_link_status:up") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "127.0.0.1:{port} not in sync: {info}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self.wait_ok();
    }

    /// A connection to the node on `port` alone.
    pub fn connect_to(&self, port: u16) -> redis::Connection {
        connect(port, &self.admin)
    }

    /// `INFO section` of the node on `port`.
    pub fn info(&self, port: u16, section: &str) -> String {
        let mut c = connect(port, &self.admin);
        redis::cmd("INFO").arg(section).query(&mut c).unwrap()
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

    /// Starts moving the slot of `key` from the node on `from` to the node
    /// on `to` and moves that key alone, as `redis-cli --cluster reshard`
    /// does key by key: until [`Self::end_migration`], the old owner answers
    /// `ASK` for it.
    pub fn begin_migration(&self, key: &str, from: u16, to: u16) {
        let slot = self.slot_of(key);
        let id = |port| -> String {
            redis::cmd("CLUSTER")
                .arg("MYID")
                .query(&mut self.connect_to(port))
                .unwrap()
        };
        let set = |port, state: &str, other: u16| {
            let _: () = redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg(state)
                .arg(id(other))
                .query(&mut self.connect_to(port))
                .unwrap();
        };
        set(to, "IMPORTING", from);
        set(from, "MIGRATING", to);
        let mut migrate = redis::cmd("MIGRATE");
        migrate.arg("127.0.0.1").arg(to).arg(key).arg(0).arg(5000);
        if let Some((user, password)) = &self.admin.login {
            migrate.arg("AUTH2").arg(user).arg(password);
        }
        let _: () = migrate.query(&mut self.connect_to(from)).unwrap();
    }

    /// Ends what [`Self::begin_migration`] began: the slot of `key` is the
    /// node on `to`'s, on every node.
    pub fn end_migration(&self, key: &str, to: u16) {
        let slot = self.slot_of(key);
        let owner: String = redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut self.connect_to(to))
            .unwrap();
        for &port in &self.ports {
            let _: () = redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("NODE")
                .arg(&owner)
                .query(&mut self.connect_to(port))
                .unwrap();
        }
        self.wait_ok();
    }
}

/// [`Cluster::reshard`] on the cluster of `ports` (callable from a blocking
/// task while the test goes on).
pub fn reshard_ports(ports: &[u16], from: u16, to: u16, slots: u32) {
    let id = |port: u16| -> String {
        let mut c = connect(port, &Admin::default());
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
    wait_ok(ports, &Admin::default());
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

/// How the harness reaches a cluster's nodes: as which user (`None`: the
/// default user), over TLS under which CA.
#[derive(Default)]
struct Admin {
    login: Option<(String, String)>,
    ca: Option<PathBuf>,
}

/// `redis-cli` arguments to reach the nodes as the admin.
fn cli_auth(admin: &Admin) -> Vec<String> {
    let mut args = Vec::new();
    if let Some((u, p)) = &admin.login {
        args.extend(["--user".into(), u.clone(), "--pass".into(), p.clone()]);
    }
    if let Some(ca) = &admin.ca {
        args.extend(["--tls".into(), "--cacert".into(), ca.display().to_string()]);
    }
    args
}

/// A connection to one node (as the admin, or the default user).
fn connect(port: u16, admin: &Admin) -> redis::Connection {
    try_connect(port, admin).unwrap_or_else(|| panic!("no connection to 127.0.0.1:{port}"))
}

/// [`connect`], or `None` when the node does not answer.
fn try_connect(port: u16, admin: &Admin) -> Option<redis::Connection> {
    let login = match &admin.login {
        Some((u, p)) => format!("{u}:{p}@"),
        None => String::new(),
    };
    let client = match &admin.ca {
        None => redis::Client::open(format!("redis://{login}127.0.0.1:{port}")).unwrap(),
        Some(ca) => {
            broker::topology::install_tls_provider();
            redis::Client::build_with_tls(
                format!("rediss://{login}127.0.0.1:{port}"),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(std::fs::read(ca).expect("the cluster's CA")),
                },
            )
            .unwrap()
        }
    };
    client
        .get_connection_with_timeout(Duration::from_secs(2))
        .ok()
}
