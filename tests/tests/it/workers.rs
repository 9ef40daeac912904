//! Several workers per bridge: a killed worker's entries (parked and under way)
//! are taken over by a live one; entries handed out too often are poison.

use std::collections::HashMap;
use std::time::Duration;

use broker::keys;
use harness::TestStore;
use harness::{hash, stream, wait_until, Deployment};

use crate::SOON;

/// `mail` parks (asking through `desk`); `fast` delivers at once but hears of
/// each delivery 3 s later (its reply on the way back), so a kill finds its sends
/// under way; `slow` waits 3 s before it writes, one send at a time. All hand a
/// dead worker's entries over after 2 s.
fn config() -> String {
    r#"
[agents.ann]

[bridges.mail]
type = "console"
output = "{dir}/mail.out"
input = "{dir}/mail.in"
destinations = ["*"]
claim_idle_seconds = 2
approval = { required = true, notify = "desk", notify_channel = "ops", timeout = 3600, approvers = ["cli:op"], max_parked_per_agent = 0 }

[bridges.fast]
type = "console"
output = "{dir}/fast.out"
input = "{dir}/fast.in"
destinations = ["*"]
reply_latency_ms = 3000
claim_idle_seconds = 2

[bridges.slow]
type = "console"
output = "{dir}/slow.out"
input = "{dir}/slow.in"
destinations = ["*"]
latency_ms = 3000
max_in_flight = 1
claim_idle_seconds = 2

[bridges.desk]
type = "console"
output = "{dir}/desk.out"
input = "{dir}/desk.in"
destinations = ["ops"]
"#
    .to_string()
}

async fn send(store: &mut TestStore, bridge: &str, to: &str, content: &str) {
    store
        .xadd(
            &keys::agent_outbox("ann", bridge),
            &[
                ("channel_id", to.as_bytes()),
                ("content", content.as_bytes()),
            ],
        )
        .await
        .unwrap();
}

/// Sends `sig` (`-STOP`, `-CONT`) to a running service.
fn signal(p: &harness::Process, sig: &str) {
    let pid = p.0.id().to_string();
    let ok = std::process::Command::new("kill")
        .args([sig, &pid])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

/// Waits until the first worker made `bridge`'s group on ann's stream, so
/// what is written next is that worker's.
async fn group_exists(d: &Deployment, bridge: &str) {
    let (stream, group) = (
        keys::agent_outbox("ann", bridge),
        keys::outbox_group(bridge),
    );
    wait_until("the first worker's group exists", SOON, || async {
        let mut s = d.store().await;
        s.consumers(&stream, &group)
            .await
            .is_ok_and(|c| !c.is_empty())
            .then_some(())
    })
    .await;
}

/// The in-flight marks of stream `outbox` by delivery, as a taker reads
/// them (a run's mark counts for each send it lists).
async fn marks(s: &mut TestStore, outbox: &str) -> std::collections::BTreeMap<String, String> {
    let marks = hash(s, &keys::in_flight_marks(outbox)).await;
    let runs = hash(s, &keys::in_flight_runs(outbox)).await;
    broker::outbox::marks_by_delivery(outbox, &marks, &runs)
}

/// The in-flight marks of bridge `bridge`'s stream `outbox` (see [`marks`]),
/// and how many of its entries its workers hold pending.
async fn marks_and_held(
    d: &Deployment,
    outbox: &str,
    bridge: &str,
) -> (std::collections::BTreeMap<String, String>, u64) {
    let mut s = d.store().await;
    let marks = marks(&mut s, outbox).await;
    let held = holders(&mut s, outbox, &keys::outbox_group(bridge))
        .await
        .values()
        .sum();
    (marks, held)
}

/// How many entries of `stream` each consumer of the outbox group holds.
async fn holders(store: &mut TestStore, stream: &str, group: &str) -> HashMap<String, u64> {
    store
        .consumers(stream, group)
        .await
        .unwrap()
        .into_iter()
        .filter(|c| c.pending > 0)
        .map(|c| (c.name, c.pending))
        .collect()
}

fn counts(lines: impl Iterator<Item = String>) -> HashMap<String, usize> {
    let mut n = HashMap::new();
    for l in lines {
        *n.entry(l).or_default() += 1;
    }
    n
}

/// Worker `a` holds six parked entries and four sends under way when it is
/// killed with SIGKILL; worker `b` takes all of them over within a few seconds,
/// every approval was notified once, decisions on the taken approvals wake `b`
/// (well before its 30 s sweep), and every message is delivered exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_is_taken_over_and_each_entry_sent_once() {
    killed_worker_taken_over(Deployment::new(&config())).await;
}

/// The same on a Redis Cluster of three masters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_is_taken_over_on_a_cluster() {
    let (first, cluster) = harness::cluster::Cluster::start();
    let d = Deployment::with_redis_table(first, &cluster.redis_table(), &config());
    killed_worker_taken_over(d).await;
    drop(cluster);
}

async fn killed_worker_taken_over(d: Deployment) {
    let _desk = d.spawn("outbox", "desk");
    let mut store = d.store().await;
    let a_mail = d.process_with("cowboy-console-outbox", "mail", &["--worker", "a"]);
    let a_fast = d.process_with("cowboy-console-outbox", "fast", &["--worker", "a"]);

    let mail_stream = keys::agent_outbox("ann", "mail");
    let fast_stream = keys::agent_outbox("ann", "fast");
    // Written once `a` has its groups, so the entries are all `a`'s.
    wait_until("worker a's groups exist", SOON, || async {
        let mut s = d.store().await;
        let m = s.consumers(&mail_stream, &keys::outbox_group("mail")).await;
        let f = s.consumers(&fast_stream, &keys::outbox_group("fast")).await;
        (m.is_ok_and(|c| !c.is_empty()) && f.is_ok_and(|c| !c.is_empty())).then_some(())
    })
    .await;
    for i in 0..6 {
        send(
            &mut store,
            "mail",
            "bob@example.org",
            &format!("parked {i}"),
        )
        .await;
    }
    for i in 0..4 {
        send(
            &mut store,
            "fast",
            &format!("dest-{i}"),
            &format!("fast {i}"),
        )
        .await;
    }
    wait_until("six notifications on desk", SOON, || async {
        (d.delivered("desk.out").len() == 6).then_some(())
    })
    .await;
    wait_until("worker a holding four sends", SOON, || async {
        let mut s = d.store().await;
        let h = holders(&mut s, &fast_stream, &keys::outbox_group("fast")).await;
        (h.get("fast-a") == Some(&4)).then_some(())
    })
    .await;
    // Delivered, but worker a has not heard back: the taker must find them
    // there (the platform proves it) rather than send them again.
    wait_until("the four lines written", SOON, || async {
        (d.delivered("fast.out").len() == 4).then_some(())
    })
    .await;
    a_mail.kill();
    a_fast.kill();

    let _b_mail = d.process_with("cowboy-console-outbox", "mail", &["--worker", "b"]);
    let _b_fast = d.process_with("cowboy-console-outbox", "fast", &["--worker", "b"]);
    wait_until("worker b holding every parked entry", SOON, || async {
        let mut s = d.store().await;
        let h = holders(&mut s, &mail_stream, &keys::outbox_group("mail")).await;
        (h.get("mail-b") == Some(&6) && h.len() == 1).then_some(())
    })
    .await;
    let ids: Vec<String> = d
        .delivered("desk.out")
        .into_iter()
        .map(|l| l.approval_id.expect("notification carries its approval id"))
        .collect();
    // Re-pointed one by one as `b` handles what it took.
    wait_until("every record naming worker b", SOON, || async {
        let mut s = d.store().await;
        for id in &ids {
            let record = hash(&mut s, &keys::approval(id)).await;
            if record.get("worker").map(String::as_str) != Some("b") {
                return None;
            }
        }
        Some(())
    })
    .await;

    for id in &ids {
        let out = d.cowboy(&["approvals", "approve", id, "--as", "op"]);
        assert!(out.status.success(), "approve {id}: {out:?}");
    }
    // The sweep of `b` runs 30 s after its start: delivery within 10 s means the
    // decisions woke it on its own wake-up stream.
    wait_until("six approved messages delivered", SOON, || async {
        (d.delivered("mail.out").len() >= 6).then_some(())
    })
    .await;
    wait_until("four fast messages delivered", SOON, || async {
        (d.delivered("fast.out").len() >= 4).then_some(())
    })
    .await;
    let woke: Vec<_> = stream(&mut store, &keys::decisions_for("mail", "b")).await;
    // Each decision is announced before it is made, then told.
    let decided = woke.iter().filter(|w| w.contains_key("status")).count();
    assert_eq!(
        (decided, woke.len()),
        (6, 12),
        "every decision (and its announcement) went to worker b's wake-up stream"
    );

    // Let any duplicate surface before counting.
    wait_until("nothing left pending", SOON, || async {
        let mut s = d.store().await;
        let m = holders(&mut s, &mail_stream, &keys::outbox_group("mail")).await;
        let f = holders(&mut s, &fast_stream, &keys::outbox_group("fast")).await;
        (m.is_empty() && f.is_empty()).then_some(())
    })
    .await;
    let mail = counts(d.delivered("mail.out").into_iter().map(|l| l.content));
    let fast = counts(d.delivered("fast.out").into_iter().map(|l| l.content));
    let notes = counts(
        d.delivered("desk.out")
            .into_iter()
            .filter_map(|l| l.approval_id),
    );
    assert_eq!(mail.len(), 6, "{mail:?}");
    assert!(
        mail.values().all(|n| *n == 1),
        "each parked message once: {mail:?}"
    );
    assert_eq!(fast.len(), 4, "{fast:?}");
    assert!(
        fast.values().all(|n| *n == 1),
        "each fast message once: {fast:?}"
    );
    assert_eq!(notes.len(), 6, "{notes:?}");
    assert!(
        notes.values().all(|n| *n == 1),
        "each approval notified once: {notes:?}"
    );
}

/// An entry handed out more than `max_deliveries` times without an outcome (here:
/// a worker that took it and kept dying, as the pending list records it) is
/// dead-lettered as poison with a notice to the agent; the next entry goes out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_handed_out_too_often_is_set_aside_as_poison() {
    let d = Deployment::new(
        r#"
[agents.ann]

[bridges.fast]
type = "console"
output = "{dir}/fast.out"
input = "{dir}/fast.in"
destinations = ["*"]
claim_idle_seconds = 1
max_deliveries = 3
"#,
    );
    let mut store = d.store().await;
    let outbox = keys::agent_outbox("ann", "fast");
    let group = keys::outbox_group("fast");
    store.ensure_group(&outbox, &group).await.unwrap();
    let poison_id = store
        .xadd(
            &outbox,
            &[("channel_id", b"x"), ("content", b"kills its worker")],
        )
        .await
        .unwrap();
    // A worker `ghost` takes it, dies, is taken over, dies again...: three deliveries.
    haunt(&mut store, &outbox, &group, "fast-ghost", &poison_id, 3).await;
    let page = store
        .pending(&outbox, &group, "-", 10, None, 0)
        .await
        .unwrap();
    assert_eq!(page[0].deliveries, 3);

    let _outbox = d.spawn("outbox", "fast");
    let dead = wait_until("the poison entry in the dead letter", SOON, || async {
        let mut s = d.store().await;
        stream(&mut s, &keys::dead("fast")).await.into_iter().next()
    })
    .await;
    assert_eq!(dead.get("entry_id"), Some(&poison_id), "{dead:?}");
    assert!(
        dead.get("reason")
            .is_some_and(|r| r.contains("4 times") && r.contains("max_deliveries = 3")),
        "{dead:?}"
    );
    let notice = wait_until("a notice to the agent", SOON, || async {
        let mut s = d.store().await;
        stream(&mut s, &keys::agent_inbox("ann", "fast"))
            .await
            .into_iter()
            .next()
    })
    .await;
    assert_eq!(notice.get("status").map(String::as_str), Some("failed"));
    assert_eq!(notice.get("entry_id"), Some(&poison_id));

    send(&mut store, "fast", "y", "fine").await;
    let delivered = wait_until("the next entry delivered", SOON, || async {
        d.delivered("fast.out").into_iter().next()
    })
    .await;
    assert_eq!(delivered.content, "fine");
    assert_eq!(
        d.delivered("fast.out").len(),
        1,
        "the poison entry was never sent"
    );
    let left = store
        .pending(&outbox, &group, "-", 10, None, 0)
        .await
        .unwrap();
    assert!(left.is_empty(), "nothing left pending: {left:?}");
}

/// A worker name becomes part of keys: anything else is refused at start-up.
#[test]
fn a_bad_worker_name_fails_at_start_up() {
    let d = Deployment::new(&config());
    let p = d.process_with("cowboy-console-outbox", "fast", &["--worker", "a:b"]);
    let code = p.wait_code(Duration::from_secs(10));
    assert_eq!(code, Some(78));
    let log = std::fs::read_to_string(d.path("cowboy-console-outbox-fast--workera:b.log")).unwrap();
    assert!(log.contains("--worker"), "{log}");
}

/// A worker that was only paused (SIGSTOP) past `claim_idle_seconds` is taken
/// over like a dead one; when it wakes it finds its lease lapsed and fences
/// itself: it forgets the parked entries it tracked, so only the new holder
/// acts on their decisions, and each is delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_worker_is_taken_over_and_fences_itself_when_it_wakes() {
    paused_worker_taken_over(Deployment::new(&config())).await;
}

/// The same on a Redis Cluster of three masters: the claim, the lease and
/// the fence hold with the streams, marks and records on several nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_worker_is_taken_over_on_a_cluster() {
    let (first, cluster) = harness::cluster::Cluster::start();
    let d = Deployment::with_redis_table(first, &cluster.redis_table(), &config());
    paused_worker_taken_over(d).await;
    drop(cluster);
}

async fn paused_worker_taken_over(d: Deployment) {
    let _desk = d.spawn("outbox", "desk");
    let mut store = d.store().await;
    let a = d.process_with("cowboy-console-outbox", "mail", &["--worker", "a"]);
    let mail_stream = keys::agent_outbox("ann", "mail");
    let group = keys::outbox_group("mail");
    group_exists(&d, "mail").await;
    for i in 0..3 {
        send(
            &mut store,
            "mail",
            "bob@example.org",
            &format!("parked {i}"),
        )
        .await;
    }
    wait_until("three notifications on desk", SOON, || async {
        (d.delivered("desk.out").len() == 3).then_some(())
    })
    .await;
    let signal = |sig: &str| signal(&a, sig);
    signal("-STOP");
    let _b = d.process_with("cowboy-console-outbox", "mail", &["--worker", "b"]);
    wait_until(
        "worker b holding the paused worker's entries",
        SOON,
        || async {
            let mut s = d.store().await;
            let h = holders(&mut s, &mail_stream, &group).await;
            (h.get("mail-b") == Some(&3) && h.len() == 1).then_some(())
        },
    )
    .await;
    signal("-CONT");
    let log = d.path("cowboy-console-outbox-mail--workera.log");
    wait_until("worker a fencing itself", SOON, || async {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("lease lapsed")
            .then_some(())
    })
    .await;

    for line in d.delivered("desk.out") {
        let id = line.approval_id.unwrap();
        let out = d.cowboy(&["approvals", "approve", &id, "--as", "op"]);
        assert!(out.status.success(), "approve {id}: {out:?}");
    }
    wait_until("three approved messages delivered", SOON, || async {
        (d.delivered("mail.out").len() >= 3).then_some(())
    })
    .await;
    wait_until("nothing left pending", SOON, || async {
        let mut s = d.store().await;
        holders(&mut s, &mail_stream, &group)
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    let mail = counts(d.delivered("mail.out").into_iter().map(|l| l.content));
    assert_eq!(mail.len(), 3, "{mail:?}");
    assert!(mail.values().all(|n| *n == 1), "each once: {mail:?}");
    assert_eq!(
        d.delivered("desk.out").len(),
        3,
        "each approval notified once"
    );
    // Worker a lives on, as a worker again.
    assert!(
        std::fs::read_to_string(&log)
            .unwrap()
            .matches("outbox service stopped")
            .count()
            == 0
    );
    drop(a);
}

/// A worker paused in the middle of a send (its gate passed, the platform
/// not yet written) and another waiting behind it are taken over; neither is
/// sent twice. The taker cannot prove the first did not happen, so it reports
/// it `uncertain` and sends nothing; it sends the second, which never passed
/// its gate; when the paused worker wakes it completes the first (the one
/// send it had begun) and sends nothing else: its gate refuses the second, or
/// it forgets it on finding its lease lapsed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_paused_mid_send_never_sends_twice() {
    let d = Deployment::new(&config());
    let mut store = d.store().await;
    let a = d.process_with("cowboy-console-outbox", "slow", &["--worker", "a"]);
    group_exists(&d, "slow").await;
    send(&mut store, "slow", "dest-0", "begun").await;
    send(&mut store, "slow", "dest-1", "queued").await;
    // Both read by a; the first through its gate, inside its 3 s send; the
    // second waiting for room, unmarked (read for the first time, so no
    // earlier attempt can have marked it: its gate is its first mark).
    let outbox = keys::agent_outbox("ann", "slow");
    wait_until(
        "the first send past its gate, the second read",
        SOON,
        || async {
            let (m, held) = marks_and_held(&d, &outbox, "slow").await;
            (m.len() == 1 && m.values().all(|v| v == "writing:a") && held == 2).then_some(())
        },
    )
    .await;
    let signal = |sig: &str| signal(&a, sig);
    signal("-STOP");
    let _b = d.process_with("cowboy-console-outbox", "slow", &["--worker", "b"]);
    let notice = wait_until("the begun send reported uncertain", SOON, || async {
        let n = stream(&mut d.store().await, &keys::agent_inbox("ann", "slow")).await;
        n.into_iter()
            .find(|n| n.get("status").map(String::as_str) == Some("uncertain"))
    })
    .await;
    assert!(notice["reason"].contains("worker `a`"), "{notice:?}");
    wait_until("the queued message sent by b", SOON, || async {
        d.delivered("slow.out")
            .iter()
            .any(|l| l.content == "queued")
            .then_some(())
    })
    .await;
    signal("-CONT");
    wait_until("a completing the send it had begun", SOON, || async {
        d.delivered("slow.out")
            .iter()
            .any(|l| l.content == "begun")
            .then_some(())
    })
    .await;
    let log = d.path("cowboy-console-outbox-slow--workera.log");
    // Refused by its gate, or forgotten when a saw its lease lapsed: either way
    // a is done with it.
    wait_until("a letting go of the queued send", SOON, || async {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        (text.contains("taken over by another worker") || text.contains("lease lapsed"))
            .then_some(())
    })
    .await;
    let sent = counts(d.delivered("slow.out").into_iter().map(|l| l.content));
    assert_eq!(sent.get("begun"), Some(&1), "{sent:?}");
    assert_eq!(sent.get("queued"), Some(&1), "{sent:?}");
    drop(a);
}

/// Worker `a` of `slow`, started, and `contents` sent to one destination in
/// order: the first goes alone (3 s at the platform), the rest queue behind
/// it and pass their gate as one run.
async fn worker_a_sending(
    d: &Deployment,
    store: &mut TestStore,
    contents: &[&str],
) -> harness::Process {
    let a = d.process_with("cowboy-console-outbox", "slow", &["--worker", "a"]);
    group_exists(d, "slow").await;
    for content in contents {
        send(store, "slow", "dest", content).await;
    }
    a
}

/// The same in the middle of a run: three sends queued behind one
/// destination pass their gate together, and worker `a` is paused while the
/// first of them is at the platform. Its taker cannot tell which of the
/// three `a` had begun, so it sends none and reports them `uncertain`; when
/// `a` wakes its run's gate is stale, so it completes at most the send it
/// had begun and sends nothing it had not: no message reaches the platform
/// twice, and the two never begun not at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_paused_mid_run_sends_nothing_it_had_not_begun() {
    let d = Deployment::new(&config());
    let mut store = d.store().await;
    let a = worker_a_sending(&d, &mut store, &["alone", "begun", "run-2", "run-3"]).await;
    // "alone" goes first by itself; the three queued behind it then pass
    // their gate as one run, and "begun" is at the platform for 3 s.
    wait_until("the run past its gate", SOON, || async {
        let mut s = d.store().await;
        let m = marks(&mut s, &keys::agent_outbox("ann", "slow")).await;
        (m.len() == 3 && m.values().all(|v| v == "writing:a")).then_some(())
    })
    .await;
    signal(&a, "-STOP");
    let _b = d.process_with("cowboy-console-outbox", "slow", &["--worker", "b"]);
    let notices = wait_until("the run's three sends reported uncertain", SOON, || async {
        let n = stream(&mut d.store().await, &keys::agent_inbox("ann", "slow")).await;
        let uncertain: Vec<_> = n
            .into_iter()
            .filter(|n| n.get("status").map(String::as_str) == Some("uncertain"))
            .collect();
        (uncertain.len() == 3).then_some(uncertain)
    })
    .await;
    assert!(
        notices.iter().all(|n| n["reason"].contains("worker `a`")),
        "{notices:?}"
    );
    signal(&a, "-CONT");
    let log = d.path("cowboy-console-outbox-slow--workera.log");
    wait_until("a letting go of the rest of its run", SOON, || async {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        (text.contains("taken over by another worker") || text.contains("lease lapsed"))
            .then_some(())
    })
    .await;
    let sent = counts(d.delivered("slow.out").into_iter().map(|l| l.content));
    assert_eq!(sent.get("alone"), Some(&1), "{sent:?}");
    assert!(sent.get("begun").copied().unwrap_or(0) <= 1, "{sent:?}");
    assert_eq!(sent.get("run-2"), None, "{sent:?}");
    assert_eq!(sent.get("run-3"), None, "{sent:?}");
    drop(a);
}

/// A worker killed in the middle of a run and started again under its name
/// finds its run's mark: what the run had passed is a retry (found on the
/// platform if it got there, sent otherwise), so each message arrives once
/// and in order, and the run's mark is gone once its sends are done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_run_retries_it_and_leaves_no_mark() {
    let d = Deployment::new(&config());
    let mut store = d.store().await;
    let want = ["alone", "begun", "run-2", "run-3"];
    let a = worker_a_sending(&d, &mut store, &want).await;
    let outbox = keys::agent_outbox("ann", "slow");
    wait_until("the run of three past its gate", SOON, || async {
        let mut s = d.store().await;
        let runs = hash(&mut s, &keys::in_flight_runs(&outbox)).await;
        let m = marks(&mut s, &outbox).await;
        (runs.len() == 1 && m.len() >= 3 && m.values().all(|v| v == "writing:a")).then_some(())
    })
    .await;
    signal(&a, "-KILL");
    drop(a);
    let _a = d.process_with("cowboy-console-outbox", "slow", &["--worker", "a"]);
    let sent = wait_until("all four delivered", 3 * SOON, || async {
        let out = d.delivered("slow.out");
        (out.len() >= want.len()).then_some(out)
    })
    .await;
    let sent: Vec<&str> = sent.iter().map(|l| l.content.as_str()).collect();
    assert_eq!(sent, want, "each once, in order");
    wait_until("no mark left", SOON, || async {
        let mut s = d.store().await;
        let marks = hash(&mut s, &keys::in_flight_marks(&outbox)).await;
        let runs = hash(&mut s, &keys::in_flight_runs(&outbox)).await;
        (marks.is_empty() && runs.is_empty()).then_some(())
    })
    .await;
}

/// A send its run's gate refuses (a mark another worker left on an entry
/// that is this worker's again) stops the run there: it is asked again whose
/// it is, found this worker's and sent, and the sends behind it wait for it,
/// so the destination gets all four in the stream's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_refused_in_a_run_keeps_its_place() {
    let d = Deployment::new(&config());
    let mut store = d.store().await;
    let want = ["one", "two", "three", "four"];
    let _a = worker_a_sending(&d, &mut store, &want).await;
    let outbox = keys::agent_outbox("ann", "slow");
    // "one" at the platform (3 s), the other three read and queued behind
    // it, unmarked: a foreign mark on "two" now makes its gate refuse it.
    wait_until(
        "the first send past its gate, all four read",
        SOON,
        || async {
            let (m, held) = marks_and_held(&d, &outbox, "slow").await;
            (m.len() == 1 && held == 4).then_some(())
        },
    )
    .await;
    let entries = store.range(&outbox, "-", "+", 10).await.unwrap();
    let two = broker::outbox::delivery_key(&outbox, &entries[1].id);
    let _: () = redis::cmd("HSET")
        .arg(keys::in_flight_marks(&outbox))
        .arg(&two)
        .arg("started:zz")
        .query_async(&mut store.conn)
        .await
        .unwrap();
    // Four sends of 3 s each, one after another.
    let sent = wait_until("all four delivered", 3 * SOON, || async {
        let out = d.delivered("slow.out");
        (out.len() >= want.len()).then_some(out)
    })
    .await;
    let sent: Vec<&str> = sent.iter().map(|l| l.content.as_str()).collect();
    assert_eq!(sent, want, "each once, in order");
    let log = std::fs::read_to_string(d.path("cowboy-console-outbox-slow--workera.log")).unwrap();
    assert!(log.contains("its gate refused it"), "{log}");
}

/// A card bridge `cards` whose sends take 3 s, asked by console `mail`
/// (agent `ann`), with `extra` in its table; its notify stream's group made.
async fn slow_cards(extra: &str) -> (Deployment, TestStore) {
    let d = Deployment::new(&format!(
        r#"
[agents.ann]

[bridges.mail]
type = "console"
output = "{{dir}}/mail.out"
input = "{{dir}}/mail.in"
destinations = ["*"]
approval = {{ required = true, notify = "cards", notify_channel = "ops", timeout = 3600, approvers = ["cli:op"] }}

[bridges.cards]
type = "console"
output = "{{dir}}/cards.out"
input = "{{dir}}/cards.in"
destinations = ["ops"]
latency_ms = 3000
claim_idle_seconds = 2
{extra}
"#
    ));
    let mut store = d.store().await;
    store
        .ensure_group(&keys::outbox("cards"), &keys::outbox_group("cards"))
        .await
        .unwrap();
    (d, store)
}

/// Waits until `cards`'s in-flight marks are `want` (in any order).
async fn card_marks(d: &Deployment, what: &str, want: &[&str]) {
    wait_until(what, SOON, || async {
        let mut s = d.store().await;
        let m = marks(&mut s, &keys::outbox("cards")).await;
        let mut v: Vec<String> = m.into_values().collect();
        v.sort();
        (v == want).then_some(())
    })
    .await;
}

/// Pauses worker `a` of `cards`, lets worker `b` take over and show both
/// cards, wakes `a`, and checks what `a` did: it may complete the card it
/// had begun (`begun`, shown once or twice), and `other` appears once.
async fn cards_taken_over_while_paused(
    d: &Deployment,
    a: harness::Process,
    begun: &str,
    other: &str,
) {
    signal(&a, "-STOP");
    let _b = d.process_with("cowboy-console-outbox", "cards", &["--worker", "b"]);
    for what in [other, begun] {
        wait_until(&format!("b showing {what:?}"), SOON, || async {
            let n = d.delivered("cards.out");
            n.iter().any(|l| l.content.contains(what)).then_some(())
        })
        .await;
    }
    signal(&a, "-CONT");
    let log = d.path("cowboy-console-outbox-cards--workera.log");
    wait_until("a letting go", SOON, || async {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        (text.contains("taken over by another worker") || text.contains("lease lapsed"))
            .then_some(())
    })
    .await;
    let shown = d.delivered("cards.out");
    let count = |what: &str| shown.iter().filter(|l| l.content.contains(what)).count();
    assert_eq!(count(other), 1, "{shown:?}");
    assert!((1..=2).contains(&count(begun)), "{shown:?}");
    drop(a);
}

/// The same for approval cards: worker `a` of the notify bridge is paused
/// while showing one card, with a second queued behind it. Worker `b` takes
/// both over: it shows the queued card (which never passed `a`'s gate) and,
/// since a card cannot be proven absent and an unasked approval helps
/// nobody, shows the begun one again. When `a` wakes it may complete the
/// card it had begun, and shows nothing else: the queued card appears once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_card_worker_never_shows_a_queued_card_twice() {
    let (d, mut store) = slow_cards("max_in_flight = 1").await;
    let a = d.process_with("cowboy-console-outbox", "cards", &["--worker", "a"]);
    let _mail = d.spawn("outbox", "mail");
    send(&mut store, "mail", "bob@example.org", "begun").await;
    // The second card only once the first passed its gate: read with it,
    // the two would pass their gate together as a run.
    card_marks(&d, "the first card past its gate", &["writing:a"]).await;
    send(&mut store, "mail", "bob@example.org", "queued").await;
    card_marks(
        &d,
        "the first card past its gate, the second marked",
        &["started:a", "writing:a"],
    )
    .await;
    cards_taken_over_while_paused(&d, a, "| begun", "| queued").await;
}

/// Cards read together pass their gate together, as one run: worker `a` is
/// paused while showing the first of two such cards. Worker `b` shows both
/// again (each may have reached the platform: `a`'s marks say `writing:`).
/// When `a` wakes, its run's gate is stale (the pause counts), so it does not
/// show the second: that card appears once, shown by `b`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_worker_shows_nothing_more_of_a_run_of_cards() {
    let (d, mut store) = slow_cards("").await;
    let _mail = d.spawn("outbox", "mail");
    send(&mut store, "mail", "bob@example.org", "first").await;
    send(&mut store, "mail", "bob@example.org", "second").await;
    wait_until("both notifications written", SOON, || async {
        let n = stream(&mut d.store().await, &keys::outbox("cards"))
            .await
            .len();
        (n == 2).then_some(())
    })
    .await;
    // One read takes both: their gate is passed in one step.
    let a = d.process_with("cowboy-console-outbox", "cards", &["--worker", "a"]);
    card_marks(
        &d,
        "both cards past their gate together",
        &["writing:a", "writing:a"],
    )
    .await;
    cards_taken_over_while_paused(&d, a, "| first", "| second").await;
}

/// Hands entry `id` of `stream` to consumer `ghost` `times` times (a worker
/// that took it and died, again and again, as the pending list records it).
async fn haunt(
    store: &mut TestStore,
    stream: &str,
    group: &str,
    ghost: &str,
    id: &str,
    times: u64,
) {
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(group)
        .arg(ghost)
        .arg("STREAMS")
        .arg(stream)
        .arg(">")
        .query_async(&mut store.conn)
        .await
        .unwrap();
    for _ in 1..times {
        let taken = store.claim(stream, group, ghost, 0, &[id]).await.unwrap();
        assert_eq!(taken.len(), 1);
    }
}

/// A genuine notification handed out too often is not shown; its approval is
/// rejected by the broker, so the agent hears why instead of waiting forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_notification_rejects_its_approval() {
    let d = Deployment::new(
        r#"
[agents.ann]

[bridges.mail]
type = "console"
output = "{dir}/mail.out"
input = "{dir}/mail.in"
destinations = ["*"]
approval = { required = true, notify = "desk", notify_channel = "ops", timeout = 0, approvers = ["cli:op"] }

[bridges.desk]
type = "console"
output = "{dir}/desk.out"
input = "{dir}/desk.in"
destinations = ["ops"]
claim_idle_seconds = 1
max_deliveries = 3
"#,
    );
    let mut store = d.store().await;
    let desk = keys::outbox("desk");
    let group = keys::outbox_group("desk");
    store.ensure_group(&desk, &group).await.unwrap();
    let _mail = d.spawn("outbox", "mail");
    send(&mut store, "mail", "bob@example.org", "never shown").await;
    let note = wait_until("the notification written", SOON, || async {
        let mut s = d.store().await;
        s.range(&desk, "-", "+", 10)
            .await
            .unwrap()
            .into_iter()
            .next()
    })
    .await;
    haunt(&mut store, &desk, &group, "desk-ghost", &note.id, 3).await;

    let _desk = d.spawn("outbox", "desk");
    let notice = wait_until("a rejection notice to the agent", SOON, || async {
        let mut s = d.store().await;
        stream(&mut s, &keys::agent_inbox("ann", "mail"))
            .await
            .into_iter()
            .next()
    })
    .await;
    assert_eq!(
        notice.get("status").map(String::as_str),
        Some("rejected"),
        "{notice:?}"
    );
    assert!(
        notice
            .get("reason")
            .is_some_and(|r| r.contains("handed to a worker 4 times")),
        "{notice:?}"
    );
    assert_eq!(
        notice.get("approver").map(String::as_str),
        Some("broker:desk")
    );
    assert!(d.delivered("desk.out").is_empty(), "nothing shown");
    assert!(d.delivered("mail.out").is_empty(), "nothing sent");
    let dead = stream(&mut store, &keys::dead("desk")).await;
    assert_eq!(dead.len(), 1, "{dead:?}");
}

/// A decision whose wake-up was lost (its decider died between deciding and
/// waking) is delivered as soon as anyone answers again, not at some later
/// sweep: a repeated answer wakes the requester once more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answering_again_wakes_the_requester_of_a_decided_approval() {
    let d = Deployment::new(&config());
    let _desk = d.spawn("outbox", "desk");
    let _mail = d.spawn("outbox", "mail");
    let mut store = d.store().await;
    send(&mut store, "mail", "bob@example.org", "woken late").await;
    let id = wait_until("the notification", SOON, || async {
        d.delivered("desk.out").into_iter().next()
    })
    .await
    .approval_id
    .unwrap();
    harness::approve_unannounced(&mut store, "mail", &id).await;
    let out = d.cowboy(&["approvals", "approve", &id, "--as", "op"]);
    assert!(!out.status.success(), "a second answer is late: {out:?}");
    // Well before the 30 s sweep.
    let sent = wait_until("the approved entry delivered", SOON, || async {
        d.delivered("mail.out").into_iter().next()
    })
    .await;
    assert_eq!(sent.content, "woken late");
}

/// An entry read but never parked (a crash between the read and the park) is
/// parked at recovery and put in the pending index, so a prefix finds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_read_before_a_crash_is_parked_and_indexed_at_recovery() {
    let d = Deployment::new(&config());
    let _desk = d.spawn("outbox", "desk");
    let mut store = d.store().await;
    let outbox = keys::agent_outbox("ann", "mail");
    let group = keys::outbox_group("mail");
    store.ensure_group(&outbox, &group).await.unwrap();
    send(&mut store, "mail", "bob@example.org", "read, then a crash").await;
    // The default worker took it and died before parking it.
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(&group)
        .arg(keys::outbox_consumer("mail", keys::DEFAULT_WORKER))
        .arg("STREAMS")
        .arg(&outbox)
        .arg(">")
        .query_async(&mut store.conn)
        .await
        .unwrap();
    let _mail = d.spawn("outbox", "mail");
    let id = wait_until("the notification", SOON, || async {
        d.delivered("desk.out").into_iter().next()
    })
    .await
    .approval_id
    .unwrap();
    let score: Option<f64> = redis::cmd("ZSCORE")
        .arg(keys::pending("mail"))
        .arg(&id)
        .query_async(&mut store.conn)
        .await
        .unwrap();
    assert!(score.is_some(), "in the pending index");
    let out = d.cowboy(&["approvals", "approve", &id[..8], "--as", "op"]);
    assert!(out.status.success(), "{out:?}");
    let sent = wait_until("delivered", SOON, || async {
        d.delivered("mail.out").into_iter().next()
    })
    .await;
    assert_eq!(sent.content, "read, then a crash");
}

/// A restarted worker with thousands of parked entries serves a decision on
/// one it has recovered already while it is still recovering the rest: the
/// approved entry is delivered before the service reports itself running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_are_served_while_recovery_goes_on() {
    const PARKED: usize = 5_000;
    let d = Deployment::new(&config());
    let mut store = d.store().await;
    ann_sends_many(&mut store, PARKED).await;
    let outbox = d.process("cowboy-console-outbox", "mail");
    let first = wait_until("every entry parked", Duration::from_secs(120), || async {
        let ids: Vec<String> = redis::cmd("ZRANGE")
            .arg(keys::pending("mail"))
            .arg(0)
            .arg(-1)
            .query_async(&mut store.clone().conn)
            .await
            .unwrap();
        (ids.len() == PARKED).then(|| ids[0].clone())
    })
    .await;
    outbox.kill();
    let log = d.path("cowboy-console-outbox-mail.log");
    // The restarted service's log follows its predecessor's in the same file.
    let before = std::fs::read_to_string(&log).unwrap_or_default().len();
    let _outbox = d.process("cowboy-console-outbox", "mail");
    approve_as_op(&store, &d, &first).await;
    wait_until("the approved delivery", SOON, || async {
        (!d.delivered("mail.out").is_empty()).then_some(())
    })
    .await;
    let logged = std::fs::read_to_string(&log).unwrap()[before..].to_string();
    assert!(
        !logged.contains("outbox service running"),
        "delivered only after recovery ended:\n{logged}"
    );
    assert_eq!(d.delivered("mail.out").len(), 1, "only the approved entry");
}

/// A decision made while a restarted worker recovers, on an entry whose page
/// was read ahead (records and all) while the page before it is handled, is
/// acted on at once: the record read ahead predates it, and its wake-up comes
/// before the worker tracks the entry. Each approved entry is delivered, once,
/// with no sweep to find a missed one (the sweep reads two unwatched records
/// in 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_on_entries_read_ahead_are_each_acted_on() {
    // Recovery reads pages of 1,000 (`outbox/recovery.rs`): two pages.
    const PAGE: usize = 1_000;
    const PARKED: usize = 2 * PAGE;
    const DECIDED_AHEAD: usize = 50;
    let d = Deployment::new(&config());
    let mut store = d.store().await;
    let stream = keys::agent_outbox("ann", "mail");
    ann_sends_many(&mut store, PARKED).await;
    // Cards shown: the recovered records are then quiet, tracked from the
    // fields read ahead.
    let desk = d.spawn("outbox", "desk");
    let outbox = d.process("cowboy-console-outbox", "mail");
    wait_until(
        "every entry parked and its card shown",
        Duration::from_secs(120),
        || {
            let mut store = store.clone();
            async move {
                let parked: usize = redis::cmd("ZCARD")
                    .arg(keys::pending("mail"))
                    .query_async(&mut store.conn)
                    .await
                    .unwrap();
                // Asked in turn: desk's group exists once the cards are read.
                if parked < PARKED
                    || harness::entries_read(&mut store, "desk:outbox", "desk-outbox").await
                        < PARKED
                {
                    return None;
                }
                let waiting = harness::pending(&mut store, "desk:outbox", "desk-outbox").await;
                (waiting == 0).then_some(())
            }
        },
    )
    .await;
    outbox.kill();
    let key = broker::approval::IdKey::load(&mut store, "mail")
        .await
        .unwrap();
    let entries: Vec<(String, HashMap<String, String>)> = redis::cmd("XRANGE")
        .arg(&stream)
        .arg("-")
        .arg("+")
        .query_async(&mut store.conn)
        .await
        .unwrap();
    assert_eq!(entries.len(), PARKED);
    let decider = store.clone();
    let approve = |entry_id: &str| {
        let id = key.id_for(&stream, entry_id);
        let (decider, d) = (&decider, &d);
        async move { approve_as_op(decider, d, &id).await }
    };
    // The first page approved while the worker is down: handling it at
    // recovery (a thousand sends) takes a while.
    for (entry_id, _) in &entries[..PAGE] {
        approve(entry_id).await;
    }
    // Their records hold the decisions; without their wake-ups, the ones
    // made below are the first the worker serves (a batch at a time).
    let _: () = redis::cmd("XTRIM")
        .arg(keys::decisions("mail"))
        .arg("MAXLEN")
        .arg(0)
        .query_async(&mut store.conn)
        .await
        .unwrap();
    let _outbox = d.process("cowboy-console-outbox", "mail");
    // The second page is read once the worker took the first, and the
    // first is being handled (its thousand sends): a decision on the
    // second's entries now comes after their records were read, and its
    // wake-up is served between the two pages, before the worker tracks them.
    let second = &entries[PAGE].0;
    wait_until("the second page read", SOON, || {
        let mut store = store.clone();
        async move {
            let pending: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
                .arg(keys::agent_outbox("ann", "mail"))
                .arg("mail-outbox")
                .arg(second)
                .arg(second)
                .arg(1)
                .query_async(&mut store.conn)
                .await
                .unwrap();
            (pending[0].3 >= 2).then_some(())
        }
    })
    .await;
    for (entry_id, _) in &entries[2 * PAGE - DECIDED_AHEAD..2 * PAGE] {
        approve(entry_id).await;
    }
    let want = PAGE + DECIDED_AHEAD;
    // A bound for a slow machine (a thousand sends and fifty), not a pace.
    wait_until(
        "every approved entry delivered",
        Duration::from_secs(60),
        || async {
            let n = d.delivered("mail.out").len();
            (n >= want).then_some(n)
        },
    )
    .await;
    let sent = d.delivered("mail.out");
    let distinct: std::collections::HashSet<&str> =
        sent.iter().map(|s| s.content.as_str()).collect();
    assert_eq!(sent.len(), want, "each approved entry once");
    assert_eq!(distinct.len(), want, "each approved entry once");
    desk.stop().await.unwrap();
}

/// Writes `n` entries to ann's outbox of mail in one round trip.
async fn ann_sends_many(store: &mut TestStore, n: usize) {
    let mut pipe = redis::pipe();
    for i in 0..n {
        pipe.cmd("XADD")
            .arg(keys::agent_outbox("ann", "mail"))
            .arg("*")
            .arg("channel_id")
            .arg("bob")
            .arg("content")
            .arg(format!("m{i}"))
            .ignore();
    }
    let _: () = pipe.query_async(&mut store.conn).await.unwrap();
}

/// Approves `id` as `cli:op`, as the CLI would, and checks it was decided.
async fn approve_as_op(store: &TestStore, d: &Deployment, id: &str) {
    let answer = broker::approval::Answer::new(
        &broker::Clock::system(),
        broker::approval::Verdict::Approved,
        "cli:op",
        "",
    );
    let outcome = broker::approval::decide(&mut store.clone(), &d.config, id, answer)
        .await
        .unwrap();
    assert_eq!(outcome, broker::approval::Outcome::Decided);
}
