//! The gate on a Redis Cluster of three masters (`[redis] cluster`): the
//! protocol's keys spread over the nodes, the readers reading each stream on
//! its own connection, and slots moved under the services.

use std::collections::BTreeMap;

use broker::keys;
use harness::cluster::Cluster;
use harness::setup::Setup;
use harness::{pending, wait_until, Deployment};

use crate::approval::{agent_sends, approval_services, inbox_notices, notification, react};
use crate::SOON;

fn on_a_cluster(body: &str) -> (Deployment, Cluster) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_test_writer()
        .try_init();
    let (first, cluster) = Cluster::start();
    let d = Deployment::with_redis_table(first, &cluster.redis_table(), body);
    (d, cluster)
}

/// Which node holds each of the flow's keys: the test means something only
/// if they are spread.
fn owners(cluster: &Cluster, keys: &[String]) -> BTreeMap<u16, Vec<String>> {
    let mut by = BTreeMap::<u16, Vec<String>>::new();
    for k in keys {
        by.entry(cluster.owner_of(k)).or_default().push(k.clone());
    }
    by
}

/// Stops `services`, then checks the end of a flow: `delivered` sent in
/// that order, `cards` cards shown in all (one per entry), nothing left
/// pending on ann's stream.
async fn settled(
    d: &Deployment,
    services: impl IntoIterator<Item = harness::Running>,
    delivered: &[&str],
    cards: usize,
) {
    for s in services {
        s.stop().await.unwrap();
    }
    let contents: Vec<String> = d
        .delivered("mail.out")
        .into_iter()
        .map(|m| m.content)
        .collect();
    assert_eq!(contents, delivered);
    assert_eq!(d.delivered("desk.out").len(), cards, "one card per entry");
    let mut store = d.store().await;
    assert_eq!(
        pending(&mut store, "ann:mail:outbox", "mail-outbox").await,
        0
    );
}

/// Park, notify on another bridge, approve by reaction, reject with a
/// reason, restart the requesting outbox while an entry is parked: each
/// message is shown once, delivered once or refused with one notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_approval_flow_runs_on_a_cluster() {
    let (d, cluster) = on_a_cluster(&Setup::approval(3600).toml());
    let spread = owners(
        &cluster,
        &[
            keys::agent_outbox("ann", "mail"),
            keys::outbox("desk"),
            keys::decisions("mail"),
            keys::approval_map("desk"),
            keys::agent_inbox("ann", "mail"),
        ],
    );
    assert!(spread.len() >= 2, "the keys all on one node: {spread:?}");
    let [mail, desk_out, desk_in] = approval_services(&d);
    agent_sends(&d, "approve me", "r1").await;
    agent_sends(&d, "reject me", "r2").await;
    for n in 0..2 {
        let (_, external) = notification(&d, n).await;
        let card = d.delivered("desk.out")[n].clone();
        match card.content.contains("approve me") {
            true => react(&d, &external, "✅", "boss", ""),
            false => react(&d, &external, "❌", "boss", "not this one"),
        }
    }
    let sent = wait_until("the approved message delivered", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    assert_eq!(sent.content, "approve me");
    let notice = wait_until("the rejection notice", SOON, || async {
        inbox_notices(&d, "ann:mail:inbox")
            .await
            .into_iter()
            .find(|n| n.get("status").map(String::as_str) == Some("rejected"))
    })
    .await;
    assert_eq!(notice["reason"], "not this one");

    // Restarted while an entry is parked: found again, not shown twice.
    mail.crash();
    agent_sends(&d, "after the restart", "r3").await;
    let mail = d.spawn("outbox", "mail");
    let (_, external) = notification(&d, 2).await;
    react(&d, &external, "✅", "boss", "");
    wait_until("the third entry delivered", SOON, || async {
        (d.delivered("mail.out").len() == 2).then_some(())
    })
    .await;
    settled(
        &d,
        [mail, desk_out, desk_in],
        &["approve me", "after the restart"],
        3,
    )
    .await;
    let rejected = inbox_notices(&d, "ann:mail:inbox")
        .await
        .into_iter()
        .filter(|n| n.get("status").map(String::as_str) == Some("rejected"))
        .count();
    assert_eq!(rejected, 1, "one notice for the one rejection");

    // `cowboy status` says which master holds each stream.
    let out = d.cowboy(&["status"]);
    assert!(out.status.success(), "{out:?}");
    let status = String::from_utf8_lossy(&out.stdout).to_string();
    for stream in [keys::agent_outbox("ann", "mail"), keys::outbox("desk")] {
        let line = status
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{stream} ")))
            .unwrap_or_else(|| panic!("no line for {stream}:\n{status}"));
        let port = cluster.owner_of(&stream);
        let slot = cluster.slot_of(&stream);
        assert!(
            line.ends_with(&format!(":{port} (slot {slot})")),
            "{stream} is on {port}, slot {slot}: {line}"
        );
    }

    // The answers' requests were aged by the clock that dated them: `TIME`
    // was asked of the master holding their stream, and of no other node.
    let requests = keys::requests("mail", "surface:desk");
    let owner = cluster.owner_of(&requests);
    for &port in &cluster.ports {
        let asked = time_calls(&cluster, port);
        match port == owner {
            true => assert!(asked > 0, "no TIME on {port}, the requests' node"),
            false => assert_eq!(asked, 0, "TIME on {port}, not the requests' node ({owner})"),
        }
    }
}

/// How many times the node on `port` answered `TIME`.
fn time_calls(cluster: &Cluster, port: u16) -> u64 {
    cluster
        .info(port, "commandstats")
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_time:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// An approval nobody answers expires into one notice, on a cluster too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_approval_expires_on_a_cluster() {
    let (d, _cluster) = on_a_cluster(&Setup::approval(1).toml());
    let services = approval_services(&d);
    agent_sends(&d, "nobody looks", "r1").await;
    let notice = wait_until("the expiry notice", SOON, || async {
        inbox_notices(&d, "ann:mail:inbox").await.into_iter().next()
    })
    .await;
    assert_eq!(notice["status"], "expired");
    for s in services {
        s.stop().await.unwrap();
    }
    assert!(d.delivered("mail.out").is_empty());
}

/// Every slot of the node holding the agent's streams moves to another node
/// (`redis-cli --cluster reshard`, key by key) while entries flow and an
/// approval is parked: every entry is delivered once, in order, and the
/// parked one is decided after the move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reshard_under_flowing_entries_loses_and_doubles_nothing() {
    let setup = Setup::approval(3600).with(
        "[bridges.plain]\ntype = \"console\"\noutput = \"{dir}/plain.out\"\ninput = \"{dir}/plain.in\"\ndestinations = [\"*\"]\n",
    );
    let (d, cluster) = on_a_cluster(&setup.toml());
    let services = approval_services(&d);
    let plain = d.spawn("outbox", "plain");
    agent_sends(&d, "parked across the move", "r1").await;
    let (_, external) = notification(&d, 0).await;
    let stream = keys::agent_outbox("ann", "plain");
    let from = cluster.owner_of(&stream);
    let to = *cluster.ports.iter().find(|&&p| p != from).unwrap();
    let owned = cluster.slots_of(from);
    let writer = {
        let d_store = d.store().await;
        let stream = stream.clone();
        tokio::spawn(async move {
            let mut store = d_store;
            for i in 0..60 {
                let content = format!("m{i:02}");
                // An agent retries what the cluster refused mid-move.
                loop {
                    let r = store
                        .xadd(
                            &stream,
                            &[("channel_id", b"x"), ("content", content.as_bytes())],
                        )
                        .await;
                    if r.is_ok() {
                        break;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        })
    };
    let mover = tokio::task::spawn_blocking({
        let ports = cluster.ports.clone();
        move || harness::cluster::reshard_ports(&ports, from, to, owned)
    });
    mover.await.unwrap();
    writer.await.unwrap();
    assert_ne!(cluster.owner_of(&stream), from, "the stream's slot moved");
    react(&d, &external, "✅", "boss", "");
    let delivered = wait_until("all 60 delivered", SOON * 3, || async {
        let got = d.delivered("plain.out");
        (got.len() >= 60).then_some(got)
    })
    .await;
    let contents: Vec<String> = delivered.into_iter().map(|m| m.content).collect();
    let expected: Vec<String> = (0..60).map(|i| format!("m{i:02}")).collect();
    assert_eq!(contents, expected, "each once, in order");
    wait_until("the parked one delivered", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    plain.stop().await.unwrap();
    for s in services {
        s.stop().await.unwrap();
    }
    assert_eq!(d.delivered("mail.out").len(), 1);
    assert_eq!(d.delivered("desk.out").len(), 1, "one card");
}

/// An upgrade from the layout before cluster support: the ingest resumes from
/// the position an earlier version saved under the old name (nothing carried
/// twice), and a leftover in-flight mark of a stream the bridge no longer
/// reads stays where it was without stopping the outbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_keeps_the_saved_position_and_leftover_marks() {
    let d = Deployment::new(&Setup::approval(3600).toml());
    let line = |content: &str| serde_json::json!({"kind": "message", "channel_id": "ops", "author": "bea", "content": content});
    d.write_input("desk.in", line("carried before the upgrade"));
    let end = std::fs::metadata(d.path("desk.in")).unwrap().len();
    d.write_input("desk.in", line("written during the upgrade"));
    let mut store = d.store().await;
    let mut conn = store.conn.clone();
    let _: () = redis::AsyncCommands::set(&mut conn, keys::legacy_ingest_cursor("desk"), end)
        .await
        .unwrap();
    let leftover = broker::outbox::delivery_key("gone:desk:outbox", "1-0");
    let _: () = redis::AsyncCommands::hset(
        &mut conn,
        keys::legacy_in_flight("desk"),
        &leftover,
        "writing:old",
    )
    .await
    .unwrap();
    let services = [d.spawn("ingest", "desk"), d.spawn("outbox", "desk")];
    let carried = wait_until("the message after the saved position", SOON, || {
        let mut store = store.clone();
        async move {
            let inbox = harness::stream(&mut store, &keys::inbox("desk")).await;
            (!inbox.is_empty()).then_some(inbox)
        }
    })
    .await;
    let contents: Vec<&str> = carried.iter().map(|e| e["content"].as_str()).collect();
    assert_eq!(contents, ["written during the upgrade"], "nothing twice");
    wait_until("the position saved under the new name", SOON, || {
        let mut store = store.clone();
        async move {
            let at: Option<u64> =
                redis::AsyncCommands::get(&mut store.conn, keys::ingest_cursor("desk"))
                    .await
                    .unwrap();
            (at > Some(end)).then_some(())
        }
    })
    .await;
    for s in services {
        s.stop()
            .await
            .expect("the outbox started and stopped cleanly");
    }
    let old = harness::hash(&mut store, &keys::legacy_in_flight("desk")).await;
    assert_eq!(
        old.get(&leftover).map(String::as_str),
        Some("writing:old"),
        "left where it was"
    );
}

/// A cluster that speaks TLS only, to clients and between its nodes: every
/// service reaches every node over `rediss://` with the private CA in
/// `redis.ca_file`; an entry is parked, shown, approved and delivered once.
/// The same nodes under another CA are refused at once, as a configuration
/// error naming `redis.ca_file` and a node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls_with_a_private_ca() {
    let (first, cluster) = Cluster::start_tls();
    let (_, other) = first.ca();
    let table = cluster.redis_table();
    assert!(
        table.contains("rediss://") && table.contains("ca_file"),
        "{table}"
    );
    let d =
        Deployment::with_redis_table(first, &table, &Setup::approval(3600).with("[web]").toml());
    let services = approval_services(&d);
    agent_sends(&d, "over tls, sharded", "r1").await;
    let (id, external) = notification(&d, 0).await;
    crate::servers::the_cli_and_the_page_reach_redis(&d, &id).await;
    react(&d, &external, "✅", "boss", "");
    let sent = wait_until("the approved message delivered", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    assert_eq!(sent.content, "over tls, sharded");
    for s in services {
        s.stop().await.unwrap();
    }
    assert_eq!(d.delivered("mail.out").len(), 1);

    crate::servers::refused_under(&d, other).await;
    drop(cluster);
}

/// A batch of independent commands goes one pipeline per master, by the
/// slot map the service holds. After every slot of one master moved, that
/// map is stale: the old owner refuses the moved keys' commands with
/// `MOVED` (they did not run), which are sent again to the new owner, and
/// every other command stands. Each `INCR` runs exactly once: every key
/// reads 2 after two batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_sent_by_a_stale_slot_map_runs_each_command_once() {
    let (d, cluster) = on_a_cluster(&Setup::approval(3600).toml());
    let mut store = d.store().await;
    let keys: Vec<String> = (0..30).map(|i| format!("count:{i}")).collect();
    let batch = || {
        let mut pipe = redis::pipe();
        for k in &keys {
            pipe.incr(k, 1);
        }
        pipe
    };
    let first: Vec<i64> = batch().query_async(&mut store.conn).await.unwrap();
    assert_eq!(first, vec![1; keys.len()]);
    let from = cluster.owner_of(&keys[0]);
    let to = *cluster.ports.iter().find(|&&p| p != from).unwrap();
    let moved: Vec<&String> = keys
        .iter()
        .filter(|k| cluster.owner_of(k) == from)
        .collect();
    tokio::task::block_in_place(|| cluster.reshard(from, to, cluster.slots_of(from)));
    assert!(moved.iter().all(|k| cluster.owner_of(k) == to));
    let second: Vec<i64> = batch().query_async(&mut store.conn).await.unwrap();
    assert_eq!(
        second,
        vec![2; keys.len()],
        "{} keys had moved",
        moved.len()
    );
    // The stale map was used: the old owner refused the moved keys.
    let errors = cluster.info(from, "errorstats");
    assert!(
        errors.contains("errorstat_MOVED"),
        "no MOVED answered: {errors}"
    );
}

/// Three masters with a replica each, `wait_replicas = 1`. The master that
/// holds the agent's stream (and so the parked entry's pending state) is
/// killed (`SIGKILL`) while an approval waits; the other masters promote its
/// replica. The services follow the new map without a restart: the parked
/// entry is approved and delivered once; once the old master is back as a
/// replica (until then nothing that must wait for a replica goes on), an
/// entry written after the failover is parked, shown and delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_failover_loses_and_doubles_nothing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_test_writer()
        .try_init();
    let (first, mut cluster) = Cluster::start_with_replicas();
    let table = format!("{}\nwait_replicas = 1", cluster.redis_table());
    let mut d = Deployment::with_redis_table(first, &table, &Setup::approval(3600).toml());
    let services = approval_services(&d);
    agent_sends(&d, "before the failover", "r1").await;
    let (_, card) = notification(&d, 0).await;

    let victim = cluster.owner_of(&keys::agent_outbox("ann", "mail"));
    if victim == d.redis.port {
        d.redis.kill();
        tokio::task::block_in_place(|| cluster.wait_ok_without(victim));
    } else {
        tokio::task::block_in_place(|| cluster.kill(victim));
    }
    assert_ne!(
        cluster.owner_of(&keys::agent_outbox("ann", "mail")),
        victim,
        "the replica took the slot over"
    );
    react(&d, &card, "✅", "boss", "");
    if victim == d.redis.port {
        d.redis.restart();
        tokio::task::block_in_place(|| cluster.wait_in_sync(victim));
    } else {
        tokio::task::block_in_place(|| cluster.restart(victim));
    }
    // Steps that waited for a replica while none was back are retried on
    // the reader's back-off: bounded as the Sentinel tests are. Approved
    // entries keep no order between them, so the first is delivered before
    // the second is written (the flow's order is then the test's to check).
    wait_until(
        "the approved entry delivered after the failover",
        crate::servers::FAILOVER,
        || async { (!d.delivered("mail.out").is_empty()).then_some(()) },
    )
    .await;
    agent_sends(&d, "after the failover", "r2").await;
    let (_, card) = crate::servers::card_showing(&d, "after the failover").await;
    react(&d, &card, "✅", "boss", "");
    wait_until(
        "both messages delivered",
        crate::servers::FAILOVER,
        || async { (d.delivered("mail.out").len() >= 2).then_some(()) },
    )
    .await;
    settled(
        &d,
        services,
        &["before the failover", "after the failover"],
        2,
    )
    .await;
}

/// Commands the cluster client sends to several nodes reach every master
/// and answer for the cluster: a script loaded is known on each node, a
/// `DEL` over keys of three slots deletes all three, `WAIT` and `DBSIZE`
/// answer; each call answers within 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_for_several_nodes_reach_every_master() {
    let (d, cluster) = on_a_cluster(&Setup::approval(3600).toml());
    let mut store = d.store().await;
    async fn ask<T: redis::FromRedisValue>(store: &mut harness::TestStore, cmd: &redis::Cmd) -> T {
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            cmd.query_async(&mut store.conn),
        )
        .await
        .unwrap_or_else(|_| panic!("no answer in 5 s to {cmd:?}"))
        .unwrap()
    }
    let sha: String = ask(&mut store, redis::cmd("SCRIPT").arg("LOAD").arg("return 7")).await;
    for &port in &cluster.ports {
        let mut node = cluster.connect_to(port);
        let known: Vec<i64> = redis::cmd("SCRIPT")
            .arg("EXISTS")
            .arg(&sha)
            .query(&mut node)
            .unwrap();
        assert_eq!(known, vec![1], "script not loaded on node {port}");
    }
    let known: Vec<i64> = ask(
        &mut store,
        redis::cmd("SCRIPT").arg("EXISTS").arg(&sha).arg("0000"),
    )
    .await;
    assert_eq!(known, vec![1, 0]);
    let keys: Vec<String> = (0..)
        .map(|i| format!("spread:{i}"))
        .scan(BTreeMap::<u16, ()>::new(), |seen, k| {
            Some(seen.insert(cluster.owner_of(&k), ()).is_none().then_some(k))
        })
        .flatten()
        .take(3)
        .collect();
    for k in &keys {
        let _: () = ask(&mut store, redis::cmd("SET").arg(k).arg(1)).await;
    }
    let size: i64 = ask(&mut store, &redis::cmd("DBSIZE")).await;
    assert!(size >= 3, "DBSIZE counts every master's keys: {size}");
    let found: i64 = ask(&mut store, redis::cmd("EXISTS").arg(&keys)).await;
    assert_eq!(found, 3);
    let deleted: i64 = ask(&mut store, redis::cmd("DEL").arg(&keys)).await;
    assert_eq!(deleted, 3);
    let replicas: i64 = ask(&mut store, redis::cmd("WAIT").arg(0).arg(0)).await;
    assert_eq!(replicas, 0);
}

/// A command the cluster client sends to every node is not held up by
/// another request in flight on the same connection. The client queues its
/// per-node parts from inside its driver without waking it, so with a slow
/// request pending they waited until that request answered (with nothing
/// else under way, a service's first `SCRIPT LOAD` waited the 10 s reply
/// timeout, a CI failure). Here one master is kept busy by a 1.2 s script
/// (under the cluster's 2 s node timeout) sent on the service's connection; a script load sent on it meanwhile
/// must reach the other masters before the busy one is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_for_every_node_is_not_held_up_by_a_slow_one() {
    let (d, cluster) = on_a_cluster(&Setup::approval(3600).toml());
    let store = d.store().await;
    let busy_key = "busy:node";
    let busy_port = cluster.owner_of(busy_key);
    let other = *cluster.ports.iter().find(|&&p| p != busy_port).unwrap();
    let spin = redis::Script::new(
        "local function us() local t = redis.call('TIME') return t[1] * 1000000 + t[2] end \
         local from = us() repeat until us() - from > 1200000 return 1",
    );
    // Loaded beforehand, so that the busy script is one request alone.
    spin.load(&mut cluster.connect_to(busy_port)).unwrap();
    let mut conn = store.conn.clone();
    let busy = tokio::spawn(async move {
        redis::cmd("EVALSHA")
            .arg(spin.get_hash())
            .arg(1)
            .arg(busy_key)
            .query_async::<i64>(&mut conn)
            .await
    });
    // The busy master no longer answers anyone (its script runs).
    let probe_port = busy_port;
    wait_until("the busy master taken by its script", SOON, || async move {
        // A bare `PING` (no handshake a busy node would hold up).
        let answered = tokio::task::spawn_blocking(move || {
            use std::io::{Read, Write};
            let mut c = std::net::TcpStream::connect(("127.0.0.1", probe_port)).ok()?;
            c.set_read_timeout(Some(std::time::Duration::from_millis(100)))
                .ok()?;
            c.write_all(b"PING\r\n").ok()?;
            let mut answer = [0u8; 7];
            c.read_exact(&mut answer).ok()
        })
        .await
        .unwrap();
        answered.is_none().then_some(())
    })
    .await;
    let mut conn = store.conn.clone();
    let load = tokio::spawn(async move {
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg("return 'not held up'")
            .query_async::<String>(&mut conn)
            .await
    });
    let mut node = cluster.connect_to(other);
    let mut loaded_elsewhere = false;
    while !busy.is_finished() {
        // Blocking, so out of the runtime's two workers' way.
        let known: Vec<i64> = tokio::task::block_in_place(|| {
            redis::cmd("SCRIPT")
                .arg("EXISTS")
                .arg(redis::Script::new("return 'not held up'").get_hash())
                .query(&mut node)
                .unwrap()
        });
        if known == [1] {
            loaded_elsewhere = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(
        loaded_elsewhere,
        "the script reached node {other} only once the busy master was free"
    );
    assert_eq!(busy.await.unwrap().unwrap(), 1);
    load.await.unwrap().unwrap();
}

/// A key moved out of a slot still in migration is served at once by the
/// importing node: its old owner answers `ASK`, and the command goes there
/// after `ASKING`: a command alone, and a script in a batch beside another
/// key's (the batch goes straight to each master; the refused one is sent
/// again), each run once. Before, such a key was refused until the slot was
/// handed over (after 5 s of `ASK`, the step failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_in_a_slot_in_migration_is_served_where_it_went() {
    let (d, cluster) = on_a_cluster(&Setup::approval(3600).toml());
    let mut store = d.store().await;
    let key = "migrating:count";
    let from = cluster.owner_of(key);
    let to = *cluster.ports.iter().find(|&&p| p != from).unwrap();
    let other = (0..)
        .map(|i| format!("staying:{i}"))
        .find(|k| cluster.owner_of(k) == to)
        .unwrap();
    let _: i64 = redis::cmd("INCR")
        .arg(key)
        .query_async(&mut store.conn)
        .await
        .unwrap();
    tokio::task::block_in_place(|| cluster.begin_migration(key, from, to));
    let three = std::time::Duration::from_secs(3);
    let alone = tokio::time::timeout(
        three,
        redis::cmd("INCR")
            .arg(key)
            .query_async::<i64>(&mut store.conn),
    )
    .await
    .expect("a command alone: no answer in 3 s")
    .expect("a command alone");
    assert_eq!(alone, 2);
    let incr = redis::Script::new("return redis.call('INCR', KEYS[1])");
    let mut pipe = redis::pipe();
    pipe.load_script(&incr).ignore();
    pipe.invoke_script(&incr.key(key));
    pipe.invoke_script(&incr.key(&other));
    let batch = tokio::time::timeout(three, pipe.query_async::<Vec<i64>>(&mut store.conn))
        .await
        .expect("a batch: no answer in 3 s")
        .expect("a batch");
    assert_eq!(batch, vec![3, 1]);
    let errors = cluster.info(from, "errorstats");
    assert!(
        errors.contains("errorstat_ASK"),
        "no ASK answered: {errors}"
    );
    let asked = cluster.info(to, "commandstats");
    assert!(asked.contains("cmdstat_asking"), "no ASKING sent: {asked}");
    tokio::task::block_in_place(|| cluster.end_migration(key, to));
    let count: i64 = redis::cmd("GET")
        .arg(key)
        .query_async(&mut store.conn)
        .await
        .unwrap();
    assert_eq!(count, 3, "each command ran once");
}

/// Reads of many records, several chunks in flight at once, each chunk's
/// keys on every master: each comes back under its own id, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_records_read_at_once_come_back_in_order_from_every_master() {
    let (d, _cluster) = on_a_cluster(&Setup::approval(0).toml());
    crate::approval::records_read_at_once(&d).await;
}

/// The listing of every approval record by `SCAN` (a test helper; operators
/// list from the pending index) visits every master: records on each of the
/// three nodes are all found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_master_is_scanned_for_records() {
    let (d, cluster) = on_a_cluster(&Setup::approval(3600).toml());
    let mut store = d.store().await;
    let mut by_node = BTreeMap::<u16, String>::new();
    for _ in 0..200 {
        let id = uuid::Uuid::new_v4().to_string();
        by_node
            .entry(cluster.owner_of(&keys::approval(&id)))
            .or_insert(id);
        if by_node.len() == cluster.ports.len() {
            break;
        }
    }
    assert_eq!(by_node.len(), 3, "records on every node");
    for id in by_node.values() {
        let _: () = redis::cmd("HSET")
            .arg(keys::approval(id))
            .arg("status")
            .arg("pending")
            .query_async(&mut store.conn)
            .await
            .unwrap();
    }
    let mut listed = broker::approval::list_ids(&mut store).await.unwrap();
    listed.sort();
    let mut expected: Vec<String> = by_node.into_values().collect();
    expected.sort();
    assert_eq!(listed, expected);
}
