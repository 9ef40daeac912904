//! The in-flight scripts (`broker/src/outbox/inflight.rs`) on a real Redis,
//! on marks laid out by hand: the paths a service reaches only under timings
//! it cannot be steered into (a run listed between marking and the gate, two
//! runs listing one entry, a gate whose answer was lost), and the trim.

use std::collections::HashMap;

use broker::keys;
use broker::outbox::inflight_scripts as lua;
use harness::RedisServer;
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

const STREAM: &str = "ann:outbox";
const GROUP: &str = "ann-outbox";

/// A private Redis with `n` entries in [`STREAM`], ids `1-1` to `1-{n}` (so
/// some are prefixes of others), all handed out once to consumer `a`
/// (worker `a`).
struct Rig {
    _redis: RedisServer,
    conn: MultiplexedConnection,
}

/// The ids of a rig's entries, in order.
const IDS: [&str; 12] = [
    "1-1", "1-2", "1-3", "1-4", "1-5", "1-6", "1-7", "1-8", "1-9", "1-10", "1-11", "1-12",
];

async fn rig(n: usize) -> Rig {
    assert!(n <= IDS.len());
    let redis = RedisServer::start();
    let client = redis::Client::open(redis.url()).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the test redis");
    let () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(STREAM)
        .arg(GROUP)
        .arg("$")
        .arg("MKSTREAM")
        .query_async(&mut conn)
        .await
        .expect("XGROUP CREATE");
    for i in 1..=n {
        let _: String = conn
            .xadd(
                STREAM,
                format!("1-{i}"),
                &[("content", format!("line {i}"))],
            )
            .await
            .expect("XADD");
    }
    let read: redis::streams::StreamReadReply = conn
        .xread_options(
            &[STREAM],
            &[">"],
            &redis::streams::StreamReadOptions::default()
                .group(GROUP, "a")
                .count(n),
        )
        .await
        .expect("XREADGROUP");
    let ids: Vec<&str> = read.keys[0].ids.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, IDS[..n], "all handed out to a");
    Rig {
        _redis: redis,
        conn,
    }
}

impl Rig {
    /// Hands entries out again to `consumer`, as a takeover or a restart's
    /// re-read does: their delivery count goes past one.
    async fn hand_out_again(&mut self, consumer: &str, ids: &[&str]) {
        let _: redis::Value = redis::cmd("XCLAIM")
            .arg(STREAM)
            .arg(GROUP)
            .arg(consumer)
            .arg(0)
            .arg(ids)
            .query_async(&mut self.conn)
            .await
            .expect("XCLAIM");
    }

    async fn set_run(&mut self, mark: &str, owner: &str, ids: &[&str]) {
        self.hset(keys::in_flight_runs(STREAM), mark, &run_value(owner, ids))
            .await;
    }

    async fn hset(&mut self, key: String, field: &str, value: &str) {
        let () = self
            .conn
            .hset(&key, field, value)
            .await
            .unwrap_or_else(|e| panic!("HSET {key} {field}: {e}"));
    }

    async fn runs(&mut self) -> HashMap<String, String> {
        self.conn
            .hgetall(keys::in_flight_runs(STREAM))
            .await
            .expect("HGETALL runs")
    }

    async fn marks(&mut self) -> HashMap<String, String> {
        self.conn
            .hgetall(keys::in_flight_marks(STREAM))
            .await
            .expect("HGETALL marks")
    }

    /// The gate of a run by worker (and consumer) `worker`.
    async fn gate_run(&mut self, worker: &str, mark: &str, ids: &[&str]) -> Vec<i64> {
        let mut sorted = ids.to_vec();
        sorted.sort_by_key(|id| broker::store::id_order(id));
        redis::Script::new(lua::GATE_RUN)
            .key(keys::in_flight_marks(STREAM))
            .key(STREAM)
            .key(keys::in_flight_runs(STREAM))
            .arg(worker)
            .arg(GROUP)
            .arg(worker)
            .arg(sorted[0])
            .arg(sorted[sorted.len() - 1])
            .arg(mark)
            .arg(ids)
            .invoke_async(&mut self.conn)
            .await
            .expect("GATE_RUN")
    }

    /// Marking one delivery by worker (and consumer) `worker`.
    async fn mark(&mut self, worker: &str, id: &str) -> String {
        redis::Script::new(lua::MARK)
            .key(keys::in_flight_marks(STREAM))
            .key(STREAM)
            .key(keys::in_flight_runs(STREAM))
            .arg(keys::delivery_key(STREAM, id))
            .arg(worker)
            .arg(GROUP)
            .arg(worker)
            .arg(id)
            .invoke_async(&mut self.conn)
            .await
            .expect("MARK")
    }

    /// Marking several deliveries at once by worker (and consumer) `worker`.
    async fn mark_many(&mut self, worker: &str, ids: &[&str]) -> Vec<String> {
        let script = redis::Script::new(lua::MARK_MANY);
        let mut inv = script.prepare_invoke();
        inv.key(keys::in_flight_marks(STREAM))
            .key(STREAM)
            .key(keys::in_flight_runs(STREAM))
            .arg(worker)
            .arg(GROUP)
            .arg(worker);
        for id in ids {
            inv.arg(delivery(id)).arg(*id);
        }
        inv.invoke_async(&mut self.conn).await.expect("MARK_MANY")
    }

    async fn ungate(&mut self, worker: &str, mark: &str, ids: &[&str]) {
        let _: i64 = redis::Script::new(lua::UNGATE)
            .key(keys::in_flight_runs(STREAM))
            .arg(worker)
            .arg(mark)
            .arg(ids)
            .invoke_async(&mut self.conn)
            .await
            .expect("UNGATE");
    }

    async fn trim_run(&mut self, mark: &str) -> i64 {
        redis::Script::new(lua::TRIM_RUN)
            .key(keys::in_flight_runs(STREAM))
            .key(STREAM)
            .arg(GROUP)
            .arg(mark)
            .invoke_async(&mut self.conn)
            .await
            .expect("TRIM_RUN")
    }

    async fn ack(&mut self, id: &str) {
        let _: i64 = self.conn.xack(STREAM, GROUP, &[id]).await.expect("XACK");
    }
}

fn run_value(owner: &str, ids: &[&str]) -> String {
    format!("{owner}\n {} ", ids.join(" "))
}

fn delivery(id: &str) -> String {
    keys::delivery_key(STREAM, id)
}

#[tokio::test]
async fn a_runs_gate_moves_this_workers_older_listing_to_the_sends_own_mark() {
    let mut r = rig(3).await;
    let (e0, e1, e2) = ("1-1", "1-2", "1-3");
    // Worker a's run listed e0 and e1, then a restarted and was handed
    // them again; its new run's gate is asked before they were marked.
    r.set_run("a:old", "writing:a", &[e0, e1]).await;
    r.hand_out_again("a", &[e0, e1]).await;

    let gate = r.gate_run("a", "a:new", &[e0, e1, e2]).await;

    assert_eq!(
        gate,
        vec![2, 2, 1],
        "e0 and e1 pass as the retries they are, e2 afresh"
    );
    let marks = r.marks().await;
    assert_eq!(
        marks.get(&delivery(e0)).map(String::as_str),
        Some("writing:a")
    );
    assert_eq!(
        marks.get(&delivery(e1)).map(String::as_str),
        Some("writing:a")
    );
    assert_eq!(marks.len(), 2, "{marks:?}");
    let runs = r.runs().await;
    assert_eq!(
        runs,
        HashMap::from([("a:new".to_string(), run_value("writing:a", &[e2]))]),
        "the old run's mark goes once all it listed moved; the new one lists only e2"
    );
}

#[tokio::test]
async fn another_workers_run_listing_an_entry_wins_over_this_workers_own() {
    // Whichever of the two runs' marks Redis hands back first.
    for order in [["a:old", "b:run"], ["b:run", "a:old"]] {
        let mut r = rig(1).await;
        let e0 = "1-1";
        for mark in order {
            let owner = format!("writing:{}", &mark[..1]);
            r.set_run(mark, &owner, &[e0]).await;
        }
        r.hand_out_again("a", &[e0]).await;
        let before = r.runs().await;

        assert_eq!(r.gate_run("a", "a:new", &[e0]).await, vec![0], "{order:?}");
        assert_eq!(
            r.mark("a", e0).await,
            "writing:b",
            "{order:?}: worker b may still complete it"
        );
        assert_eq!(r.runs().await, before, "{order:?}: nothing moved or added");
        assert!(r.marks().await.is_empty(), "{order:?}: no mark written");
    }
}

/// No gate writes a run mark that is not `writing:`; one found (damaged, or
/// written by hand) must not make a send look another worker's.
#[tokio::test]
async fn a_run_mark_not_saying_writing_counts_for_nothing() {
    let mut r = rig(1).await;
    let e0 = "1-1";
    r.set_run("b:run", "started:b", &[e0]).await;
    r.hand_out_again("a", &[e0]).await;

    assert_eq!(r.gate_run("a", "a:new", &[e0]).await, vec![1]);
    assert_eq!(r.runs().await["a:new"], run_value("writing:a", &[e0]));
}

#[tokio::test]
async fn marking_moves_this_workers_run_listing_to_the_sends_own_mark() {
    let mut r = rig(2).await;
    let (e0, e1) = ("1-1", "1-2");
    r.set_run("a:old", "writing:a", &[e0, e1]).await;
    r.hand_out_again("a", &[e0, e1]).await;

    assert_eq!(r.mark("a", e0).await, "writing:a", "a retry of its own");
    assert_eq!(r.marks().await[&delivery(e0)], "writing:a");
    assert_eq!(r.runs().await["a:old"], run_value("writing:a", &[e1]));
    assert_eq!(r.mark("a", e1).await, "writing:a");
    assert!(
        r.runs().await.is_empty(),
        "the run's mark goes with its last entry"
    );
}

#[tokio::test]
async fn marking_a_batch_reads_runs_as_marking_one_does() {
    let mut r = rig(5).await;
    let [e0, e1, e2, e3, e4] = ["1-1", "1-2", "1-3", "1-4", "1-5"];
    r.set_run("a:old", "writing:a", &[e0, e1]).await;
    r.set_run("b:run", "writing:b", &[e2]).await;
    r.hand_out_again("a", &[e0, e1, e2, e3]).await;
    // e4 was taken over by b: no longer a's to mark.
    r.hand_out_again("b", &[e4]).await;

    let answers = r.mark_many("a", &[e0, e1, e2, e3, e4]).await;

    assert_eq!(
        answers,
        vec!["writing:a", "writing:a", "writing:b", "", "not-mine"]
    );
    assert_eq!(
        r.marks().await,
        HashMap::from([
            (delivery(e0), "writing:a".to_string()),
            (delivery(e1), "writing:a".to_string()),
            (delivery(e3), "started:a".to_string()),
        ]),
        "a's own run moved to its sends' marks; b's is left to b"
    );
    assert_eq!(
        r.runs().await,
        HashMap::from([("b:run".to_string(), run_value("writing:b", &[e2]))])
    );
}

#[tokio::test]
async fn a_gate_whose_answer_was_lost_leaves_no_mark_behind() {
    let mut r = rig(3).await;
    let ids = &IDS[..3];
    // Redis passed the run, the answer never reached the worker: it sends
    // nothing and takes the run's entries out of its mark.
    assert_eq!(r.gate_run("a", "a:lost", ids).await, vec![1, 1, 1]);
    r.ungate("a", "a:lost", ids).await;
    assert!(r.runs().await.is_empty());
    // Its next gate for them is a first attempt again, not a retry.
    r.hand_out_again("a", ids).await;
    assert_eq!(r.gate_run("a", "a:next", ids).await, vec![1, 1, 1]);
}

#[tokio::test]
async fn ungating_takes_entries_out_of_this_workers_run_only() {
    let mut r = rig(3).await;
    let (e0, e1, e2) = ("1-1", "1-2", "1-3");
    r.set_run("a:run", "writing:a", &[e0, e1, e2]).await;

    r.ungate("b", "a:run", &[e1]).await;
    assert_eq!(
        r.runs().await["a:run"],
        run_value("writing:a", &[e0, e1, e2]),
        "b's ungate changes nothing of a's"
    );
    r.ungate("a", "a:run", &[e1]).await;
    assert_eq!(r.runs().await["a:run"], run_value("writing:a", &[e0, e2]));
    r.ungate("a", "a:run", &[e0, e2]).await;
    assert!(
        r.runs().await.is_empty(),
        "the mark goes once it lists none"
    );
}

#[tokio::test]
async fn a_gate_finds_another_workers_listing_by_exact_id_among_many() {
    let mut r = rig(12).await;
    let ids = &IDS[..];
    // b's run lists 1-10 and 1-12; 1-1 is a prefix of both.
    r.set_run("b:run", "writing:b", &["1-10", "1-12"]).await;
    r.hand_out_again("a", ids).await;

    // A few ids are found by plain search, many by reading the run's list.
    assert_eq!(r.gate_run("a", "a:few", &["1-1"]).await, vec![1]);
    r.ungate("a", "a:few", &["1-1"]).await;
    let gate = r.gate_run("a", "a:many", ids).await;
    let refused: Vec<&str> = ids
        .iter()
        .zip(&gate)
        .filter(|(_, g)| **g == 0)
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(refused, vec!["1-10", "1-12"], "gate {gate:?}");
    let listed: Vec<&str> = ids
        .iter()
        .copied()
        .filter(|id| !refused.contains(id))
        .collect();
    assert_eq!(r.runs().await["a:many"], run_value("writing:a", &listed));
}

#[tokio::test]
async fn the_trim_drops_a_runs_mark_once_none_of_its_entries_is_pending() {
    let mut r = rig(3).await;
    let (e0, e1, e2) = ("1-1", "1-2", "1-3");
    r.set_run("a:run", "writing:a", &[e0, e1, e2]).await;
    r.hset(keys::in_flight_runs(STREAM), "z:junk", "no newline")
        .await;

    assert_eq!(r.trim_run("a:gone").await, 0, "no such mark");
    assert_eq!(r.trim_run("a:run").await, 0, "all pending: under way");
    r.ack(e0).await;
    r.ack(e2).await;
    assert_eq!(
        r.trim_run("a:run").await,
        0,
        "e1, in the middle, still pending"
    );
    r.ack(e1).await;
    assert_eq!(r.trim_run("a:run").await, 1);
    assert_eq!(
        r.trim_run("z:junk").await,
        1,
        "a value listing nothing goes"
    );
    assert!(r.runs().await.is_empty());
}

#[tokio::test]
async fn a_takers_clear_takes_the_entry_out_of_every_run_of_that_worker_only() {
    let mut r = rig(2).await;
    let (e0, e1) = ("1-1", "1-2");
    r.set_run("b:1", "writing:b", &[e0, e1]).await;
    r.set_run("b:2", "writing:b", &[e0]).await;
    r.set_run("c:1", "writing:c", &[e0]).await;
    r.hset(keys::in_flight_marks(STREAM), &delivery(e0), "writing:b")
        .await;
    r.hset(keys::in_flight_marks(STREAM), &delivery(e1), "writing:c")
        .await;

    // What a taker does once it recorded e0's outcome: b's marks of it go,
    // wherever b listed it; c's marks are c's to clear.
    let _: i64 = redis::Script::new(lua::CLEAR)
        .key(keys::in_flight_marks(STREAM))
        .key(keys::in_flight_runs(STREAM))
        .arg("b")
        .arg(2)
        .arg(delivery(e0))
        .arg(delivery(e1))
        .arg(0)
        .arg("*")
        .arg(e0)
        .invoke_async(&mut r.conn)
        .await
        .expect("CLEAR");

    assert_eq!(
        r.marks().await,
        HashMap::from([(delivery(e1), "writing:c".to_string())])
    );
    assert_eq!(
        r.runs().await,
        HashMap::from([
            ("b:1".to_string(), run_value("writing:b", &[e1])),
            ("c:1".to_string(), run_value("writing:c", &[e0])),
        ])
    );
}
