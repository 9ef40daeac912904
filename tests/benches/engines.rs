//! The engine on each server the services support, as ratios against
//! standalone Redis measured in the same run on the same machine: delivery
//! (read, deliver, ack) and parking (record, notification, its delivery and
//! map entry), on Valkey 8 and on a Redis Cluster of three masters (made
//! with `redis-cli --cluster create`). Target: no ratio below 0.8.
//! Run with `cargo bench -p cowboy-tests --bench engines`.

use std::time::{Duration, Instant};

use harness::cluster::Cluster;
use harness::TestStore;
use harness::{entries_read, pending, Deployment, Engine, RedisServer};

const N: usize = 20_000;
/// Parks timed from the service's start: 5,000, so that the cluster's longer
/// start-up (it connects to every node and loads its scripts on each, some
/// 30 ms more than one server) is a few hundredths of a run (1.2 to 1.5 s)
/// rather than a tenth of one over 1,000 (240 to 300 ms), and the ratio says
/// how each engine parks, not how it starts.
const P: usize = 5_000;

const PLAIN: &str = "[bridges.mail]\ntype = \"console\"\noutput = \"{dir}/mail.out\"\ninput = \"{dir}/mail.in\"\ndestinations = [\"*\"]\n";
const PARKS: &str = "[bridges.mail]\ntype = \"console\"\noutput = \"{dir}/mail.out\"\ninput = \"{dir}/mail.in\"\ndestinations = [\"*\"]\napproval = { required = true, notify_channel = \"ops\", timeout = 0, approvers = [\"cli:op\"] }\n";

#[derive(Clone, Copy, Debug)]
enum Topology {
    Redis,
    Valkey,
    RedisCluster,
}

/// A deployment of `body` on `t` (the cluster kept alive beside it).
fn deploy(t: Topology, body: &str) -> (Deployment, Option<Cluster>) {
    match t {
        Topology::Redis => (
            Deployment::with_redis(RedisServer::start_on(Engine::Redis, &[]), body),
            None,
        ),
        Topology::Valkey => (
            Deployment::with_redis(RedisServer::start_on(Engine::Valkey, &[]), body),
            None,
        ),
        Topology::RedisCluster => {
            let (first, cluster) = Cluster::start();
            let d = Deployment::with_redis_table(first, &cluster.redis_table(), body);
            (d, Some(cluster))
        }
    }
}

async fn fill(store: &mut TestStore, stream: &str, n: usize) {
    for chunk in 0..n.div_ceil(1000) {
        let mut pipe = redis::pipe();
        for _ in 0..1000.min(n - chunk * 1000) {
            pipe.cmd("XADD")
                .arg(stream)
                .arg("*")
                .arg(&[("channel_id", "c"), ("content", "hello")])
                .ignore();
        }
        let _: () = pipe.query_async(&mut store.conn).await.unwrap();
    }
}

/// Entries per second delivered by one outbox worker, timed from its first read.
async fn delivery(t: Topology) -> f64 {
    let (d, _cluster) = deploy(t, PLAIN);
    let mut store = d.store().await;
    store
        .ensure_group("mail:outbox", "mail-outbox")
        .await
        .unwrap();
    fill(&mut store, "mail:outbox", N).await;
    let outbox = d.spawn("outbox", "mail");
    while entries_read(&mut store, "mail:outbox", "mail-outbox").await == 0 {
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let start = Instant::now();
    loop {
        let read = entries_read(&mut store, "mail:outbox", "mail-outbox").await;
        if read >= N && pending(&mut store, "mail:outbox", "mail-outbox").await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let rate = N as f64 / start.elapsed().as_secs_f64();
    outbox.stop().await.unwrap();
    assert_eq!(d.delivered("mail.out").len(), N);
    rate
}

/// Entries per second parked and notified (the bridge notifies itself), from
/// the service's start.
async fn parking(t: Topology) -> f64 {
    let (d, _cluster) = deploy(t, PARKS);
    let mut store = d.store().await;
    fill(&mut store, "mail:outbox", P).await;
    let start = Instant::now();
    let outbox = d.spawn("outbox", "mail");
    let lines = || {
        std::fs::read_to_string(d.path("mail.out"))
            .unwrap_or_default()
            .matches('\n')
            .count()
    };
    while lines() == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let first = start.elapsed();
    while lines() < P {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let rate = P as f64 / start.elapsed().as_secs_f64();
    eprintln!(
        "{t:?}: first card after {first:?}, all {P} after {:?}",
        start.elapsed()
    );
    outbox.stop().await.unwrap();
    rate
}

#[tokio::main]
async fn main() {
    let mut rows = Vec::new();
    for t in [Topology::Redis, Topology::Valkey, Topology::RedisCluster] {
        rows.push((t, delivery(t).await, parking(t).await));
    }
    let (_, d0, p0) = rows[0];
    for (t, d, p) in rows {
        println!(
            "{t:?}: delivery {d:.0} entries/s ({:.2} x Redis), parking {p:.0} entries/s ({:.2} x Redis) (target >= 0.8)",
            d / d0,
            p / p0
        );
    }
}
