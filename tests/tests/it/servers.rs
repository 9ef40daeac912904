//! The servers the gate runs on, beyond one plain `redis-server`: Redis over
//! TLS with a private CA. (Valkey runs the ACL and approval-flow tests of
//! `acl.rs`.)

use std::time::Duration;

use broker::config::RedisConfig;
use broker::{keys, Error};
use harness::sentinel::Sentinels;
use harness::TestStore;
use harness::{wait_until, Deployment, RedisServer};

use crate::approval::{
    agent_sends, approval_services, first_sent, notification, react, recorded_as_shown,
};
use crate::approval_config;

/// Every service reaches a TLS-only Redis through `rediss://` with the
/// private CA in `redis.ca_file`: an approval is parked, shown, approved and
/// sent. The same server under another CA is refused at once, as a
/// configuration error naming the server; `redis://` to a host that is not
/// loopback is refused before anything is sent, naming `redis.url`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls_with_a_private_ca() {
    let redis = RedisServer::start_tls();
    let (ca, other) = redis.ca();
    assert!(redis.url().starts_with("rediss://"));
    let d = Deployment::build(
        redis,
        &format!("ca_file = \"{}\"", ca.display()),
        &harness::setup::Setup::approval(3600).with("[web]").toml(),
    );
    let services = approval_services(&d);
    agent_sends(&d, "over tls", "r1").await;
    let (id, card) = notification(&d, 0).await;
    the_cli_and_the_page_reach_redis(&d, &id).await;
    react(&d, &card, "✅", "boss", "");
    assert_eq!(first_sent(&d).await.content, "over tls");
    for s in services {
        s.stop().await.unwrap();
    }

    refused_under(&d, other).await;
    let plain = RedisConfig {
        url: "redis://192.0.2.1:6379".into(),
        ca_file: None,
        ..d.config.redis.clone()
    };
    match broker::Store::connect(&plain).await {
        Err(Error::Config(e)) => assert!(e.to_string().contains("redis.url"), "{e}"),
        Err(e) => panic!("not a configuration error: {e}"),
        Ok(_) => panic!("plain TCP to another host was allowed"),
    }
}

/// `d`'s servers under the CA `ca`, which signed nothing of theirs: refused
/// at once, as a configuration error naming `redis.ca_file` and a server.
pub(crate) async fn refused_under(d: &Deployment, ca: std::path::PathBuf) {
    let wrong = RedisConfig {
        ca_file: Some(ca),
        ..d.config.redis.clone()
    };
    match broker::Store::connect(&wrong).await {
        Err(Error::Config(e)) => {
            let text = e.to_string();
            assert!(
                text.contains("redis.ca_file") && text.contains("127.0.0.1:"),
                "{text}"
            );
        }
        Err(e) => panic!("not a configuration error: {e}"),
        Ok(_) => panic!("an untrusted certificate was accepted"),
    }
}

/// The CLI lists approval `id` and the page's `/metrics` answers, each
/// reaching Redis as the deployment's `[redis]` says (TLS, a cluster).
pub(crate) async fn the_cli_and_the_page_reach_redis(d: &Deployment, id: &str) {
    let out = d.cowboy(&["approvals", "list"]);
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && listed.contains(&id[..8]),
        "cowboy approvals list: {out:?}"
    );
    let web = harness::web::WebServer::start(d).await;
    let metrics = reqwest::get(web.url("/metrics")).await.unwrap();
    let status = metrics.status();
    let text = metrics.text().await.unwrap_or_default();
    assert!(
        status.is_success() && text.contains("cowboy_"),
        "/metrics: {status} {text}"
    );
    web.stop().await;
}

/// The card on desk.out that shows `text` (approval id, external id), once
/// it is recorded as shown.
pub(crate) async fn card_showing(d: &Deployment, text: &str) -> (String, String) {
    let line = wait_until(&format!("a card showing {text:?}"), FAILOVER, || async {
        d.delivered("desk.out")
            .into_iter()
            .find(|l| l.approval_id.is_some() && l.content.contains(text))
    })
    .await;
    recorded_as_shown(d, &line.external_id, FAILOVER).await;
    (line.approval_id.unwrap_or_default(), line.external_id)
}

/// Writes to ann's outbox as the agent would, through a failover: it asks the
/// Sentinels again until a master takes the entry.
pub(crate) async fn agent_sends_through(d: &Deployment, content: &str, request_id: &str) {
    wait_until(
        &format!("the master taking {content:?}"),
        FAILOVER,
        || async {
            let mut store = broker::Store::connect(&d.config.redis).await.ok()?;
            store
                .xadd(
                    &keys::agent_outbox("ann", "mail"),
                    &[
                        ("channel_id", b"bob@example.org".as_slice()),
                        ("content", content.as_bytes()),
                        ("request_id", request_id.as_bytes()),
                    ],
                )
                .await
                .ok()
        },
    )
    .await;
}

/// A failover and what follows it, bounded: while no replica is back, the
/// steps that wait for one back off (up to 12.8 s by then) before the next try.
pub(crate) const FAILOVER: Duration = Duration::from_secs(60);

/// Behind three Sentinels with `wait_replicas = 1`, the master is killed
/// (`SIGKILL`) twice while approvals are pending and entries flow; the
/// services follow each promoted replica without a restart (and wait, when
/// no replica is left, until the dead master is back as one). Entries parked
/// before a failover stay parked and are decided after it; what was approved
/// is delivered once; entries written during the failover are parked, shown
/// and delivered; no card is shown twice and every approval has one outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failovers_lose_and_double_nothing() {
    // The services' logs, shown when the test fails.
    let _ = tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_test_writer()
        .try_init();
    let master = RedisServer::start();
    let first = master.port;
    let mut set = Sentinels::start(&master);
    let table = format!("{}wait_replicas = 1\n", set.redis_table());
    let mut d = Deployment::with_redis_table(master, &table, &approval_config(3600));
    let services = approval_services(&d);

    agent_sends_through(&d, "approved-before", "r1").await;
    let (_, card) = card_showing(&d, "approved-before").await;
    react(&d, &card, "✅", "boss", "");
    agent_sends_through(&d, "parked-one", "r2").await;
    agent_sends_through(&d, "parked-two", "r3").await;
    let (_, parked_one) = card_showing(&d, "parked-one").await;
    let (_, parked_two) = card_showing(&d, "parked-two").await;

    // First failover: the replica is promoted.
    d.redis.kill();
    agent_sends_through(&d, "during-first", "r4").await;
    let second = set.replica.port;
    tokio::task::block_in_place(|| set.wait_master(second));
    // With no replica left nothing that must wait for one goes on; the old
    // master comes back empty, as the new one's replica at once (left a
    // master until a Sentinel demotes it, a loaded machine has seen the
    // Sentinels promote it, empty, when the new master missed their pings).
    d.redis.restart_as_replica_of(second);
    tokio::task::block_in_place(|| set.wait_replica(first));
    react(&d, &parked_one, "✅", "boss", "");
    react(&d, &parked_two, "❌", "boss", "not now");
    let (_, during) = card_showing(&d, "during-first").await;
    react(&d, &during, "✅", "boss", "");

    // Second failover, back to the first server.
    set.replica.kill();
    agent_sends_through(&d, "during-second", "r5").await;
    tokio::task::block_in_place(|| set.wait_master(first));
    set.replica.restart_as_replica_of(first);
    tokio::task::block_in_place(|| set.wait_replica(second));
    let (_, late) = card_showing(&d, "during-second").await;
    react(&d, &late, "✅", "boss", "");

    // Each approved message is delivered, or (when a kill fell inside its
    // send, which the test does not time) reported `uncertain` and never sent
    // again; the agent hears of the rejection.
    let approved = [
        ("approved-before", "r1"),
        ("parked-one", "r2"),
        ("during-first", "r4"),
        ("during-second", "r5"),
    ];
    let (sent, notices) = wait_until(
        "each approved message delivered or reported uncertain, and the rejection told",
        FAILOVER,
        || async {
            let sent = d.delivered("mail.out");
            let mut store = d.store().await;
            let notices = harness::stream(&mut store, "ann:mail:inbox").await;
            let told = |request: &str, status: &str| {
                notices
                    .iter()
                    .any(|n| n["request_id"] == request && n["status"] == status)
            };
            let settled = approved.iter().all(|(text, request)| {
                sent.iter().any(|s| s.content == *text) || told(request, "uncertain")
            });
            (settled && told("r3", "rejected")).then_some((sent, notices))
        },
    )
    .await;
    for (text, _) in approved {
        let times = sent.iter().filter(|s| s.content == text).count();
        assert!(times <= 1, "{text:?} was delivered {times} times");
    }
    assert!(
        sent.iter()
            .all(|s| approved.iter().any(|(text, _)| s.content == *text)),
        "only approved messages are delivered: {sent:?}"
    );
    // Approved after the last kill, its send cannot have been cut.
    assert!(
        sent.iter().any(|s| s.content == "during-second"),
        "{sent:?}"
    );
    for (_, request) in approved {
        let told = notices
            .iter()
            .filter(|n| n["request_id"] == request && n["status"] == "uncertain")
            .count();
        assert!(told <= 1, "{request} told uncertain {told} times");
    }
    let told: Vec<(&str, &str, &str)> = notices
        .iter()
        .filter(|n| n["status"] != "uncertain")
        .map(|n| {
            (
                n["request_id"].as_str(),
                n["status"].as_str(),
                n["reason"].as_str(),
            )
        })
        .collect();
    assert_eq!(told, [("r3", "rejected", "not now")], "one notice, once");
    for n in notices.iter().filter(|n| n["status"] == "uncertain") {
        let request = n["request_id"].as_str();
        assert!(
            approved.iter().any(|(_, r)| *r == request),
            "only an approved send may be uncertain: {n:?}"
        );
    }
    for text in [
        "approved-before",
        "parked-one",
        "parked-two",
        "during-first",
        "during-second",
    ] {
        let cards = d
            .delivered("desk.out")
            .into_iter()
            .filter(|l| l.content.contains(text))
            .count();
        assert_eq!(cards, 1, "{text:?} was shown {cards} times");
    }
    // `cowboy status` shows the topology it found: the master the Sentinels
    // name now, and its replica.
    let status = d.cowboy(&["status"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains("master `cowboy` through 3 Sentinels")
            && text.contains(&format!("at 127.0.0.1:{first}"))
            && text.contains(&format!("replicas 127.0.0.1:{second}")),
        "{text}"
    );
    for s in services {
        s.stop().await.unwrap();
    }
}

/// Acknowledged writes counted across three failovers, `wait_replicas = 1`.
/// Each round the agent writes two entries and waits for a replica to have
/// them (`WAIT 1` after `XADD`, as `docs/protocol.md` tells agents); both are
/// parked and shown (a card is shown only once its record is on a replica)
/// and approved from the CLI (its exit acknowledges the decision); then the
/// master is killed at once, while the approved sends may be under way.
/// After the three failovers nothing acknowledged is lost and nothing is
/// doubled: every one of the six messages is delivered exactly once (or, if
/// the kill fell inside its send, reported `uncertain`, never sent again),
/// each was shown on one card, and no approval was rejected or expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_three_failovers() {
    let master = RedisServer::start();
    let mut set = Sentinels::start(&master);
    let table = format!("{}wait_replicas = 1\n", set.redis_table());
    let mut d = Deployment::with_redis_table(master, &table, &approval_config(3600));
    let services = approval_services(&d);
    // The data servers' ports, the master's first.
    let mut ports = [d.redis.port, set.replica.port];
    let mut texts = Vec::new();
    for round in 0..3 {
        let sent: Vec<String> = (0..2).map(|n| format!("round-{round}-{n}")).collect();
        for text in &sent {
            agent_sends_through(&d, text, text).await;
            let mut store = TestStore::connect(&d.config.redis).await.unwrap();
            let replicas: i64 = redis::cmd("WAIT")
                .arg(1)
                .arg(5000)
                .query_async(&mut store.conn)
                .await
                .unwrap();
            assert!(replicas >= 1, "{text}: no replica acknowledged the entry");
        }
        for text in &sent {
            let (id, _) = card_showing(&d, text).await;
            let out = d.cowboy(&["approvals", "approve", &id, "--as", "op"]);
            assert!(out.status.success(), "approve {text} ({id}): {out:?}");
        }
        texts.extend(sent);
        // At once: whatever the master acknowledged must be on the replica.
        if ports[0] == d.redis.port {
            d.redis.kill();
        } else {
            set.replica.kill();
        }
        tokio::task::block_in_place(|| set.wait_master(ports[1]));
        // Back as the new master's replica at once (a Sentinel would make it
        // one too, in its own time: under load, longer than the bound).
        if ports[0] == d.redis.port {
            d.redis.restart_as_replica_of(ports[1]);
        } else {
            set.replica.restart_as_replica_of(ports[1]);
        }
        tokio::task::block_in_place(|| set.wait_replica(ports[0]));
        ports.swap(0, 1);
    }

    let uncertain = |notices: &[std::collections::HashMap<String, String>], text: &str| {
        notices
            .iter()
            .any(|n| n["status"] == "uncertain" && n["request_id"] == text)
    };
    let notices = wait_until("every message delivered or uncertain", FAILOVER, || async {
        let mut store = d.store().await;
        let notices = harness::stream(&mut store, "ann:mail:inbox").await;
        let sent = d.delivered("mail.out");
        texts
            .iter()
            .all(|t| sent.iter().any(|s| &s.content == t) || uncertain(&notices, t))
            .then_some(notices)
    })
    .await;
    let sent = d.delivered("mail.out");
    for text in &texts {
        let times = sent.iter().filter(|s| &s.content == text).count();
        assert!(times <= 1, "{text:?} was delivered {times} times");
        assert!(
            !(times == 1 && uncertain(&notices, text)),
            "{text:?} delivered and reported uncertain"
        );
        let cards = d
            .delivered("desk.out")
            .into_iter()
            .filter(|l| l.content.contains(text.as_str()))
            .count();
        assert_eq!(cards, 1, "{text:?} was shown {cards} times");
    }
    let refused: Vec<_> = notices
        .iter()
        .filter(|n| n["status"] != "uncertain")
        .collect();
    assert!(
        refused.is_empty(),
        "an approved message was refused: {refused:?}"
    );
    for s in services {
        s.stop().await.unwrap();
    }
}

/// Every connection to Redis carries TCP keepalive, so a server that vanishes
/// without closing its sockets (a host that lost power, a partition) fails a
/// blocked read instead of leaving it waiting forever: the kernel's view
/// (`ss`) of the shared connection and of a blocking read's shows the timer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_carry_tcp_keepalive() {
    let redis = RedisServer::start();
    let config = RedisConfig {
        url: redis.url(),
        ..RedisConfig::default()
    };
    let store = broker::Store::connect(&config).await.unwrap();
    let _blocking = store.blocking().await.unwrap();
    let out = std::process::Command::new("ss")
        .args(["-tnoH", "state", "established"])
        .arg(format!("( dport = :{} )", redis.port))
        .output()
        .expect("ss (iproute2) runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let sockets: Vec<&str> = text.lines().collect();
    assert!(sockets.len() >= 2, "two connections expected: {text}");
    assert!(
        sockets.iter().all(|s| s.contains("timer:(keepalive")),
        "a connection without keepalive: {text}"
    );
}

/// A Redis that verifies clients' certificates (`tls-auth-clients yes`):
/// without `client_cert_file` the handshake is refused; with the certificate
/// its CA signed, the shared connection and a blocking read both work. A
/// certificate without its key is a configuration error naming the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_verifying_client_certificates() {
    let redis = RedisServer::start_tls_verifying_clients();
    let (ca, _) = redis.ca();
    let (cert, key) = redis.client_cert();
    let anonymous = RedisConfig {
        url: redis.url(),
        ca_file: Some(ca),
        ..RedisConfig::default()
    };
    assert!(
        broker::Store::connect(&anonymous).await.is_err(),
        "a client without a certificate was let in"
    );
    let known = RedisConfig {
        client_cert_file: Some(cert.clone()),
        client_key_file: Some(key),
        ..anonymous.clone()
    };
    let mut store = broker::Store::connect(&known).await.unwrap();
    let id = store.xadd("s", &[("k", b"v".as_slice())]).await.unwrap();
    let mut blocking = store.blocking().await.unwrap();
    let len: u64 = redis::cmd("XLEN")
        .arg("s")
        .query_async(&mut blocking)
        .await
        .unwrap();
    assert_eq!((len, id.is_empty()), (1, false));
    let halfway = format!(
        "[redis]\nurl = \"{}\"\nclient_cert_file = \"{}\"\n",
        redis.url(),
        cert.display()
    );
    let e = broker::Config::parse(&halfway).unwrap_err().to_string();
    assert!(e.contains("redis.client_key_file"), "{e}");
}
