//! Throughput of the outbox as a ratio against a floor measured in the same run
//! on the same private Redis: the floor is a bare consumer doing the minimum the
//! protocol needs per entry (read through the group in batches, ack each entry).
//! Run with `cargo bench -p cowboy-tests`. Ratios, not seconds, are what to compare.

use std::time::{Duration, Instant};

use broker::Store;
use harness::{pending, Deployment};

const N: usize = 5000;

async fn fill(store: &mut Store, stream: &str, n: usize, fields: &[(&str, &[u8])]) {
    let mut pipe = redis::pipe();
    for _ in 0..n {
        pipe.cmd("XADD").arg(stream).arg("*").arg(fields).ignore();
    }
    let _: () = pipe.query_async(&mut store.conn).await.unwrap();
}

/// The floor: XREADGROUP 64 at a time, one XACK per entry.
async fn floor(store: &mut Store) -> Duration {
    store.ensure_group("floor", "g").await.unwrap();
    fill(
        store,
        "floor",
        N,
        &[("channel_id", b"c"), ("content", b"hello")],
    )
    .await;
    let mut conn = store.blocking().await.unwrap();
    let start = Instant::now();
    let mut done = 0;
    while done < N {
        let batch = broker::store::read_group(
            &mut conn,
            "g",
            "c",
            &["floor".to_string()],
            &[">"],
            64,
            None,
        )
        .await
        .unwrap();
        for (_, entries) in batch {
            for (id, _) in entries {
                store.ack("floor", "g", &[id.as_str()]).await.unwrap();
                done += 1;
            }
        }
    }
    start.elapsed()
}

async fn drained(d: &Deployment, stream: &str, group: &str, n: usize) {
    let mut store = d.store().await;
    loop {
        let groups: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(stream)
            .query_async(&mut store.conn)
            .await
            .unwrap_or_default();
        let read = groups
            .iter()
            .find(|g| g.get("name") == Some(&redis::Value::BulkString(group.as_bytes().to_vec())))
            .and_then(|g| match g.get("entries-read") {
                Some(redis::Value::Int(i)) => Some(*i as usize),
                _ => None,
            })
            .unwrap_or(0);
        if read >= n && pending(&mut store, stream, group).await == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::main]
async fn main() {
    // Delivery without approval: read, validate, deliver (console: append a JSON line), ack.
    let d = Deployment::new("[bridges.mail]\ntype = \"console\"\noutput = \"{dir}/mail.out\"\ninput = \"{dir}/mail.in\"\ndestinations = [\"*\"]\n");
    let mut store = d.store().await;
    let floor_time = floor(&mut store).await;
    fill(
        &mut store,
        "mail:outbox",
        N,
        &[("channel_id", b"c"), ("content", b"hello")],
    )
    .await;
    let start = Instant::now();
    let outbox = d.spawn("outbox", "mail");
    drained(&d, "mail:outbox", "mail-outbox", N).await;
    let outbox_time = start.elapsed();
    outbox.stop().await.unwrap();
    assert_eq!(d.delivered("mail.out").len(), N);
    println!(
        "delivery, {N} entries: floor {:.0} entries/s, outbox {:.0} entries/s, ratio outbox/floor time {:.2}",
        N as f64 / floor_time.as_secs_f64(),
        N as f64 / outbox_time.as_secs_f64(),
        outbox_time.as_secs_f64() / floor_time.as_secs_f64()
    );

    // Parking: record + notification per entry (no decision).
    let p = 1000;
    let d = Deployment::new("[bridges.mail]\ntype = \"console\"\noutput = \"{dir}/mail.out\"\ninput = \"{dir}/mail.in\"\ndestinations = [\"*\"]\napproval = { required = true, notify_channel = \"ops\", timeout = 0, approvers = [\"cli:op\"] }\n");
    let mut store = d.store().await;
    fill(
        &mut store,
        "mail:outbox",
        p,
        &[("channel_id", b"c"), ("content", b"hello")],
    )
    .await;
    let start = Instant::now();
    let outbox = d.spawn("outbox", "mail");
    // The notifications go to mail:outbox too (notify = itself): wait until they are delivered.
    while d.delivered("mail.out").len() < p {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let park_time = start.elapsed();
    outbox.stop().await.unwrap();
    println!(
        "parking, {p} entries: {:.0} entries/s parked and notified, ratio per entry against the delivery floor {:.2}",
        p as f64 / park_time.as_secs_f64(),
        (park_time.as_secs_f64() / p as f64) / (floor_time.as_secs_f64() / N as f64)
    );
}
