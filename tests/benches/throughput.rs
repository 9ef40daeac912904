//! Throughput of the outbox as a ratio against a floor measured in the same run
//! on the same private Redis: the floor is a bare consumer doing the minimum the
//! protocol needs per entry (read through the group in batches, ack each entry).
//! Run with `cargo bench -p cowboy-tests`. Ratios, not seconds, are what to compare.

use std::time::{Duration, Instant};

use harness::TestStore;
use harness::{entries_read, pending, Deployment};

const N: usize = 50_000;

async fn fill(store: &mut TestStore, stream: &str, n: usize, fields: &[(&str, &[u8])]) {
    let mut pipe = redis::pipe();
    for _ in 0..n {
        pipe.cmd("XADD").arg(stream).arg("*").arg(fields).ignore();
    }
    let _: () = pipe.query_async(&mut store.conn).await.unwrap();
}

/// The floor: what a bare consumer must do at least. XREADGROUP 100 at a time,
/// the same JSON line per entry appended to a file, one XACK per batch.
async fn floor(store: &mut TestStore, file: &std::path::Path) -> Duration {
    use std::io::Write;
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
        let batch = conn
            .read_group("g", "c", &["floor".to_string()], &[">"], 100, None)
            .await
            .unwrap();
        for (_, entries) in batch {
            let mut out = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(file)
                .unwrap();
            let mut ids = Vec::new();
            for (id, fields) in entries {
                let fields = fields.unwrap_or_default();
                let text = |k: &str| {
                    fields
                        .iter()
                        .find(|(n, _)| n == k)
                        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
                        .unwrap_or_default()
                };
                let line = console::send::Delivered {
                    external_id: console::send::external_id(&id),
                    channel_id: text("channel_id"),
                    content: text("content"),
                    subject: None,
                    reply_to: None,
                    approval_id: None,
                };
                let mut json = serde_json::to_string(&line).unwrap();
                json.push('\n');
                out.write_all(json.as_bytes()).unwrap();
                ids.push(id);
            }
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            store.ack("floor", "g", &ids).await.unwrap();
            done += ids.len();
        }
    }
    start.elapsed()
}

async fn drained(d: &Deployment, stream: &str, group: &str, n: usize) {
    let mut store = d.store().await;
    loop {
        let read = entries_read(&mut store, stream, group).await;
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
    let floor_time = floor(&mut store, &d.path("floor.out")).await;
    fill(
        &mut store,
        "mail:outbox",
        N,
        &[("channel_id", b"c"), ("content", b"hello")],
    )
    .await;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut store.conn)
        .await
        .unwrap();
    // Timed from its first read, as the floor is: start-up is not delivery.
    let outbox = d.spawn("outbox", "mail");
    while entries_read(&mut store, "mail:outbox", "mail-outbox").await == 0 {
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let start = Instant::now();
    drained(&d, "mail:outbox", "mail-outbox", N).await;
    let outbox_time = start.elapsed();
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut store.conn)
        .await
        .unwrap();
    outbox.stop().await.unwrap();
    assert_eq!(d.delivered("mail.out").len(), N);
    // What the outbox asked of Redis per entry delivered (the bench's own
    // polling of the group included): where the rest of the time goes.
    let per_entry: Vec<String> = stats
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |k: &str| {
                rest.split(',')
                    .find_map(|f| f.strip_prefix(k))
                    .and_then(|v| v.parse::<f64>().ok())
            };
            let (calls, usec) = (field("calls=")?, field("usec=")?);
            Some(format!(
                "{name} {:.3} calls, {:.2} us",
                calls / N as f64,
                usec / N as f64
            ))
        })
        .collect();
    println!("delivery, Redis per entry: {}", per_entry.join("; "));
    println!(
        "delivery, {N} entries: floor {:.0} entries/s, outbox {:.0} entries/s: {:.2} x the floor's rate (target >= 0.8)",
        N as f64 / floor_time.as_secs_f64(),
        N as f64 / outbox_time.as_secs_f64(),
        floor_time.as_secs_f64() / outbox_time.as_secs_f64()
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
    // The notifications go to mail:outbox too (notify = itself): wait until
    // each card is recorded as shown (its map entry), asking Redis: reading
    // the output file every few milliseconds would take the service's CPU.
    loop {
        let shown: usize = redis::cmd("HLEN")
            .arg(broker::keys::approval_map("mail"))
            .query_async(&mut store.conn)
            .await
            .unwrap();
        if shown >= p {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let park_time = start.elapsed();
    outbox.stop().await.unwrap();
    assert_eq!(d.delivered("mail.out").len(), p, "one card each");
    println!(
        "parking, {p} entries: {:.0} entries/s parked and notified, ratio per entry against the delivery floor {:.2}",
        p as f64 / park_time.as_secs_f64(),
        (park_time.as_secs_f64() / p as f64) / (floor_time.as_secs_f64() / N as f64)
    );

    // Deliveries side by side: each send waits 20 ms (the console's `latency_ms`,
    // standing in for a platform round trip), over 32 destinations; 32 in flight
    // against 1 in flight (the old sequential engine), same entries.
    let m = 320;
    let mut times = Vec::new();
    for in_flight in [1, 32] {
        let d = Deployment::new(&format!("[bridges.mail]\ntype = \"console\"\noutput = \"{{dir}}/mail.out\"\ninput = \"{{dir}}/mail.in\"\ndestinations = [\"*\"]\nlatency_ms = 20\nmax_in_flight = {in_flight}\n"));
        let mut store = d.store().await;
        let mut pipe = redis::pipe();
        for i in 0..m {
            pipe.cmd("XADD")
                .arg("mail:outbox")
                .arg("*")
                .arg("channel_id")
                .arg(format!("c{}", i % 32))
                .arg("content")
                .arg("hello")
                .ignore();
        }
        let _: () = pipe.query_async(&mut store.conn).await.unwrap();
        let start = Instant::now();
        let outbox = d.spawn("outbox", "mail");
        drained(&d, "mail:outbox", "mail-outbox", m).await;
        times.push(start.elapsed());
        outbox.stop().await.unwrap();
        assert_eq!(d.delivered("mail.out").len(), m);
    }
    println!(
        "side by side, {m} entries over 32 destinations, 20 ms per send: 1 in flight {:.0} entries/s, 32 in flight {:.0} entries/s, {:.1}x",
        m as f64 / times[0].as_secs_f64(),
        m as f64 / times[1].as_secs_f64(),
        times[0].as_secs_f64() / times[1].as_secs_f64()
    );
}
