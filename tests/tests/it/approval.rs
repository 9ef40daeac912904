//! The approval loop end to end: park, notify, decide, settle.

use std::collections::HashMap;
use std::time::Duration;

use broker::{approval, keys};
use harness::setup::Setup;
use harness::{command_counts, hash, pending, stream, wait_until, Deployment};
use serde_json::json;

use crate::{approval_config, SOON};

/// Writes an entry to ann's outbox for `mail`, as the agent would.
pub(crate) async fn agent_sends(d: &Deployment, content: &str, request_id: &str) -> String {
    let mut store = d.store().await;
    store
        .xadd(
            &keys::agent_outbox("ann", "mail"),
            &[
                ("channel_id", b"bob@example.org"),
                ("content", content.as_bytes()),
                ("request_id", request_id.as_bytes()),
            ],
        )
        .await
        .unwrap()
}

/// Waits for the n-th notification on desk's output and returns (approval id, external id).
pub(crate) async fn notification(d: &Deployment, n: usize) -> (String, String) {
    let (id, external) = notification_written(d, n).await;
    recorded_as_shown(d, &external, SOON).await;
    (id, external)
}

/// Waits (at most `bound`) until desk's card `external` is recorded as shown:
/// answerable from then on (just after it is written: a human never answers
/// within those milliseconds, a test would).
pub(crate) async fn recorded_as_shown(d: &Deployment, external: &str, bound: Duration) {
    let store = d.store().await;
    let external = external.to_string();
    wait_until("the card recorded as shown", bound, || {
        let mut store = store.clone();
        let external = external.clone();
        async move {
            harness::hash(&mut store, &keys::approval_map("desk"))
                .await
                .contains_key(&external)
                .then_some(())
        }
    })
    .await;
}

/// The n-th notification as written on desk.out (approval id, external id),
/// whether or not it was recorded as shown (a card an edit superseded never is).
pub(crate) async fn notification_written(d: &Deployment, n: usize) -> (String, String) {
    let line = wait_until("an approval notification on desk.out", SOON, || async {
        d.delivered("desk.out").get(n).cloned()
    })
    .await;
    (
        line.approval_id.expect("notification carries approval_id"),
        line.external_id,
    )
}

pub(crate) fn react(d: &Deployment, external_id: &str, emoji: &str, user: &str, reason: &str) {
    d.write_input(
        "desk.in",
        json!({"kind": "reaction", "message_id": external_id, "emoji": emoji, "user": user, "reason": reason}),
    );
}

/// The services an approval needs: mail's and desk's outboxes, desk's ingest.
pub(crate) fn approval_services(d: &Deployment) -> [harness::Running; 3] {
    [
        d.spawn("outbox", "mail"),
        d.spawn("outbox", "desk"),
        d.spawn("ingest", "desk"),
    ]
}

/// Approves `id` as `who` directly, as the administrator's CLI would (no
/// surface, no request), and expects it decided.
pub(crate) async fn approve_directly(d: &Deployment, id: &str, who: &str) {
    let answer = broker::approval::Answer::new(
        &broker::Clock::system(),
        broker::approval::Verdict::Approved,
        who,
        "",
    );
    let mut store = d.store().await;
    let outcome = broker::approval::decide(&mut store, &d.config, id, answer)
        .await
        .unwrap();
    assert!(
        matches!(outcome, broker::approval::Outcome::Decided),
        "{outcome:?}"
    );
}

/// The first message mail delivered, once there is one.
pub(crate) async fn first_sent(d: &Deployment) -> console::send::Delivered {
    wait_until("the approved message", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await
}

pub(crate) async fn inbox_notices(d: &Deployment, key: &str) -> Vec<HashMap<String, String>> {
    let mut store = d.store().await;
    stream(&mut store, key).await
}

/// Approval on: the entry is parked with every record field, the notification
/// carries the approval id and the full content, and nothing is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parks_with_a_complete_record_and_notification() {
    let d = Deployment::new(&approval_config(3600));
    let services = [d.spawn("outbox", "mail"), d.spawn("outbox", "desk")];
    let content = format!("line one\n{}", "x".repeat(500));
    let entry_id = agent_sends(&d, &content, "req-7").await;
    let (id, external) = notification(&d, 0).await;

    let mut store = d.store().await;
    let record = hash(&mut store, &keys::approval(&id)).await;
    let want = [
        ("status", "pending".to_string()),
        ("source", "mail".into()),
        ("channel_id", "bob@example.org".into()),
        ("content_preview", content.chars().take(200).collect()),
        ("stream", "ann:mail:outbox".into()),
        ("entry_id", entry_id.clone()),
        ("agent", "ann".into()),
        ("notify", "desk".into()),
        ("notify_channel", "ops".into()),
        (
            "message_sha256",
            approval::message_sha256("bob@example.org", None, None, &content),
        ),
        ("content_bytes", content.len().to_string()),
    ];
    for (field, value) in want {
        assert_eq!(record.get(field), Some(&value), "record field {field}");
    }
    let created: u64 = record["created_at"].parse().unwrap();
    let expires: u64 = record["expires_at"].parse().unwrap();
    assert_eq!(expires, created + 3600);
    assert!(!record.contains_key("approver"));
    // `message_sha256` binds the content; a digest of the content alone is
    // no longer written (nothing read it).
    assert!(!record.contains_key("content_sha256"));
    // The id is keyed with the bridge's secret (the agent cannot compute it).
    let key = approval::IdKey::load(&mut store, "mail").await.unwrap();
    assert_eq!(id, key.id_for("ann:mail:outbox", &entry_id));

    let note = &d.delivered("desk.out")[0];
    assert_eq!(note.channel_id, "ops");
    assert!(
        note.content
            .contains(&format!("| line one\n| {}\n", "x".repeat(500))),
        "full content in the notification, every line marked"
    );
    assert!(note.content.contains(&record["message_sha256"]));
    assert!(note.content.contains("bob@example.org"));
    assert_eq!(
        hash(&mut store, &keys::approval_map("desk"))
            .await
            .get(&external),
        Some(&approval::repo::map_value(&id, &record["message_sha256"])),
        "the notify bridge maps its message to the approval"
    );
    assert!(
        d.delivered("mail.out").is_empty(),
        "nothing leaves before a decision"
    );
    assert_eq!(
        pending(&mut store, "ann:mail:outbox", "mail-outbox").await,
        1,
        "parked entry stays pending"
    );
    for s in services {
        s.stop().await.unwrap();
    }
}

/// ✅ by an approver delivers exactly once and removes the record and the map entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approved_by_an_approver_is_delivered_once() {
    let d = Deployment::new(&approval_config(3600));
    let services = [
        d.spawn("outbox", "mail"),
        d.spawn("outbox", "desk"),
        d.spawn("ingest", "desk"),
    ];
    agent_sends(&d, "ship it", "r1").await;
    let (id, external) = notification(&d, 0).await;
    react(&d, &external, "✅", "boss", "");
    let sent = wait_until("delivery on mail.out", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    assert_eq!(
        (sent.channel_id.as_str(), sent.content.as_str()),
        ("bob@example.org", "ship it")
    );
    let mut store = d.store().await;
    wait_until("the record is deleted", SOON, || {
        let mut store = store.clone();
        let id = id.clone();
        async move {
            hash(&mut store, &keys::approval(&id))
                .await
                .is_empty()
                .then_some(())
        }
    })
    .await;
    for s in services {
        s.stop().await.unwrap();
    }
    assert_eq!(d.delivered("mail.out").len(), 1, "delivered exactly once");
    assert!(hash(&mut store, &keys::approval_map("desk"))
        .await
        .is_empty());
    assert_eq!(
        pending(&mut store, "ann:mail:outbox", "mail-outbox").await,
        0
    );
    assert!(
        inbox_notices(&d, "ann:mail:inbox").await.is_empty(),
        "no notice on success"
    );
}

/// An entry on the flat outbox (no agent) is parked, asked and delivered like
/// an agent's: a batch from the flat stream alone names no agent, which once
/// sent Redis an empty pipeline and stopped the outbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flat_stream_entry_is_parked_and_approved() {
    let d = Deployment::new(&approval_config(3600));
    let services = approval_services(&d);
    let mut store = d.store().await;
    store
        .xadd(
            &keys::outbox("mail"),
            &[
                ("channel_id", b"bob@example.org"),
                ("content", b"from the flat stream"),
            ],
        )
        .await
        .unwrap();
    let (_, external) = notification(&d, 0).await;
    react(&d, &external, "✅", "boss", "");
    let sent = wait_until("delivery on mail.out", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    assert_eq!(sent.content, "from the flat stream");
    for s in services {
        s.stop().await.unwrap();
    }
}

/// ✅ from someone not on the approvers list changes nothing; the real approver
/// can still decide afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_cannot_approve() {
    let d = Deployment::new(&approval_config(3600));
    let services = [
        d.spawn("outbox", "mail"),
        d.spawn("outbox", "desk"),
        d.spawn("ingest", "desk"),
    ];
    agent_sends(&d, "secret", "r1").await;
    let (id, external) = notification(&d, 0).await;
    let mut store = d.store().await;
    // The console ingest answers in file order: once the cursor passes the
    // stranger's line, it has been handled.
    react(&d, &external, "✅", "mallory", "");
    react(&d, &external, "✅", "", "");
    let end = std::fs::metadata(d.path("desk.in")).unwrap().len();
    wait_until("the ingest handled both lines", SOON, || {
        let mut store = store.clone();
        async move {
            let at: Option<u64> =
                redis::AsyncCommands::get(&mut store.conn, keys::ingest_cursor("desk"))
                    .await
                    .unwrap();
            (at == Some(end)).then_some(())
        }
    })
    .await;
    let record = hash(&mut store, &keys::approval(&id)).await;
    assert_eq!(record["status"], "pending");
    assert!(!record.contains_key("approver"));
    assert_eq!(
        hash(&mut store, &keys::approval_map("desk"))
            .await
            .get(&external),
        Some(&approval::repo::map_value(&id, &record["message_sha256"])),
        "map entry kept"
    );
    assert!(d.delivered("mail.out").is_empty());
    react(&d, &external, "✅", "boss", "");
    wait_until("delivery after the real approval", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    for s in services {
        s.stop().await.unwrap();
    }
}

/// ❌ with a reason: nothing is sent and the agent's notice carries the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejection_reaches_the_agent_with_its_reason() {
    let d = Deployment::new(&approval_config(3600));
    let services = [
        d.spawn("outbox", "mail"),
        d.spawn("outbox", "desk"),
        d.spawn("ingest", "desk"),
    ];
    let entry_id = agent_sends(&d, "rude words", "req-42").await;
    let (id, external) = notification(&d, 0).await;
    react(&d, &external, "❌", "boss", "too rude");
    let notice = wait_until("a notice on ann:mail:inbox", SOON, || async {
        inbox_notices(&d, "ann:mail:inbox").await.into_iter().next()
    })
    .await;
    assert_eq!(notice["kind"], "notice");
    assert_eq!(notice["status"], "rejected");
    assert_eq!(notice["reason"], "too rude");
    assert_eq!(notice["approver"], "console:boss");
    assert_eq!(notice["approval_id"], id);
    assert_eq!(notice["entry_id"], entry_id);
    assert_eq!(notice["request_id"], "req-42");
    let mut store = d.store().await;
    // The notify side deletes the record once its notification shows the outcome.
    wait_until("the record is deleted", SOON, || {
        let mut store = store.clone();
        let id = id.clone();
        async move {
            hash(&mut store, &keys::approval(&id))
                .await
                .is_empty()
                .then_some(())
        }
    })
    .await;
    for s in services {
        s.stop().await.unwrap();
    }
    assert!(
        d.delivered("mail.out").is_empty(),
        "a rejected entry is never sent"
    );
    assert_eq!(
        pending(&mut store, "ann:mail:outbox", "mail-outbox").await,
        0
    );
}

/// `timeout = 1`: the approval expires into a notice; a late ✅ changes nothing
/// but its map entry is dropped. On paused time: no notice before the
/// deadline, one as soon as it passes.
#[tokio::test(start_paused = true)]
async fn expiry_gives_a_notice_and_late_answers_are_ignored() {
    use broker::config::Service;
    let time = harness::Frozen::hold();
    let d = Deployment::new(&approval_config(1));
    let timing = broker::timing::Timing::default();
    let outbox = d.run_paused::<console::Console>(Service::Outbox, "mail", timing);
    let desk = d.run_paused::<console::Console>(Service::Outbox, "desk", timing);
    agent_sends(&d, "too slow", "r9").await;
    let (id, external) = notification(&d, 0).await;
    time.advance(Duration::from_millis(500)).await;
    assert!(
        inbox_notices(&d, "ann:mail:inbox").await.is_empty(),
        "expired half-way to its deadline"
    );
    let notice = time
        .advance_until("an expiry notice", Duration::from_secs(3), || async {
            inbox_notices(&d, "ann:mail:inbox").await.into_iter().next()
        })
        .await;
    assert_eq!(notice["status"], "expired");
    assert_eq!(notice["approval_id"], id);
    assert!(notice["reason"].contains("1 seconds"));
    outbox.stop().await.unwrap();
    desk.stop().await.unwrap();

    // A late answer arrives for an approval the requesting side already settled
    // (its map entry restored here, as if the settle had not cleaned it up).
    let mut store = d.store().await;
    let _: () =
        redis::AsyncCommands::hset(&mut store.conn, keys::approval_map("desk"), &external, &id)
            .await
            .unwrap();
    let outcome = approval::resolve_approval(
        &mut store,
        &d.config,
        "desk",
        &external,
        approval::Answer::new(
            &broker::Clock::system(),
            approval::Verdict::Approved,
            "console:boss",
            "",
        ),
    )
    .await
    .unwrap();
    assert_eq!(outcome, approval::Outcome::Late(approval::Late::Missing));
    assert!(
        hash(&mut store, &keys::approval_map("desk"))
            .await
            .is_empty(),
        "map entry dropped"
    );
    assert!(d.delivered("mail.out").is_empty());
}

/// A late ✅ on a record that is past its deadline but not yet settled is ignored:
/// the deadline is read before the status.
#[tokio::test(start_paused = true)]
async fn answers_after_the_deadline_do_not_count() {
    use broker::config::Service;
    // On paused time, so the record is still unsettled when the requesting
    // service is stopped however loaded the machine; the answer's own clock
    // then stands past the deadline.
    let time = harness::Frozen::hold();
    let d = Deployment::new(&approval_config(3));
    let timing = broker::timing::Timing::default();
    let desk = d.run_paused::<console::Console>(Service::Outbox, "desk", timing);
    // No requesting service runs after parking, so nothing settles the record.
    let outbox = d.run_paused::<console::Console>(Service::Outbox, "mail", timing);
    agent_sends(&d, "late", "r").await;
    let (id, external) = notification(&d, 0).await;
    outbox.crash();
    let mut store = d.store().await;
    let expires: f64 = hash(&mut store, &keys::approval(&id)).await["expires_at"]
        .parse()
        .unwrap();
    // Answered a moment after the deadline, by the answer's own clock: no sleep.
    let after = broker::Clock::starting_at(expires + 0.05);
    let outcome = approval::resolve_approval(
        &mut store,
        &d.config,
        "desk",
        &external,
        approval::Answer::new(&after, approval::Verdict::Approved, "console:boss", ""),
    )
    .await
    .unwrap();
    assert_eq!(outcome, approval::Outcome::Late(approval::Late::Expired));
    assert_eq!(
        hash(&mut store, &keys::approval(&id)).await["status"],
        "pending",
        "expired is never written"
    );
    assert!(!hash(&mut store, &keys::approval_map("desk"))
        .await
        .contains_key(&external));
    // The restarted service settles it as expired, never as approved.
    let outbox = d.run_paused::<console::Console>(Service::Outbox, "mail", timing);
    let notice = time
        .advance_until("an expiry notice", Duration::from_secs(5), || async {
            inbox_notices(&d, "ann:mail:inbox").await.into_iter().next()
        })
        .await;
    assert_eq!(notice["status"], "expired");
    outbox.stop().await.unwrap();
    desk.stop().await.unwrap();
    assert!(d.delivered("mail.out").is_empty());
}

/// A restart while parked sends no second notification and still delivers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_while_parked_resumes_without_a_second_notification() {
    let d = Deployment::new(&approval_config(0));
    let desk = [d.spawn("outbox", "desk"), d.spawn("ingest", "desk")];
    let outbox = d.spawn("outbox", "mail");
    agent_sends(&d, "survive me", "r").await;
    let (id, external) = notification(&d, 0).await;
    outbox.crash();
    let mut store = d.store().await;
    assert_eq!(
        hash(&mut store, &keys::approval(&id)).await["expires_at"],
        "0",
        "timeout 0 never expires"
    );
    // Also simulate a crash between writing the notification and recording it.
    let _: () = redis::AsyncCommands::hdel(&mut store.conn, keys::approval(&id), "notified")
        .await
        .unwrap();

    let outbox = d.spawn("outbox", "mail");
    wait_until(
        "the restarted service finds the notification again",
        SOON,
        || {
            let mut store = store.clone();
            let id = id.clone();
            async move {
                hash(&mut store, &keys::approval(&id))
                    .await
                    .contains_key("notified")
                    .then_some(())
            }
        },
    )
    .await;
    assert_eq!(
        stream(&mut store, "desk:outbox").await.len(),
        1,
        "one notification only"
    );
    approved_once_after_restart(&d, &external, outbox, desk).await;
    assert_eq!(d.delivered("desk.out").len(), 1);
}

/// Approves desk's card `external` after mail's outbox restarted, and checks
/// the message is delivered once; stops the services.
async fn approved_once_after_restart<const N: usize>(
    d: &Deployment,
    external: &str,
    outbox: harness::Running,
    desk: [harness::Running; N],
) {
    react(d, external, "✅", "boss", "");
    wait_until("delivery after restart", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    outbox.stop().await.unwrap();
    for s in desk {
        s.stop().await.unwrap();
    }
    assert_eq!(d.delivered("mail.out").len(), 1);
}

/// A record value that is not UTF-8 (any surface can write a record) stops
/// neither recovery nor the rest of its page: the restarted service tracks
/// the entry, and approving it sends it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_value_that_is_not_utf8_does_not_stop_a_recovery() {
    let d = Deployment::new(&approval_config(0));
    let desk = [d.spawn("outbox", "desk"), d.spawn("ingest", "desk")];
    let outbox = d.spawn("outbox", "mail");
    agent_sends(&d, "survive me", "r").await;
    let (id, external) = notification(&d, 0).await;
    outbox.stop().await.unwrap();
    let mut store = d.store().await;
    for field in ["reminded", "agent"] {
        let _: () = redis::cmd("HSET")
            .arg(keys::approval(&id))
            .arg(field)
            .arg(b"\xff\xfe".as_slice())
            .query_async(&mut store.conn)
            .await
            .unwrap();
    }
    let outbox = d.spawn("outbox", "mail");
    approved_once_after_restart(&d, &external, outbox, desk).await;
}

/// A decision wakes the requesting service at once, not at its next timer tick
/// (the longest block is 5 s; the delivery must come well before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_wakes_the_requesting_service() {
    let d = Deployment::new(&approval_config(0));
    let services = [d.spawn("outbox", "mail"), d.spawn("outbox", "desk")];
    agent_sends(&d, "now please", "r").await;
    let (id, _) = notification(&d, 0).await;
    // Both outbox services must be parked in their blocking reads, so only the
    // decision itself can wake the requester.
    let mut store = d.store().await;
    wait_until("both outboxes blocked in XREADGROUP", SOON, || {
        let mut store = store.clone();
        async move {
            let info: String = redis::cmd("INFO")
                .arg("clients")
                .query_async(&mut store.conn)
                .await
                .unwrap();
            let blocked = info
                .lines()
                .find_map(|l| l.strip_prefix("blocked_clients:"))
                .and_then(|n| n.trim().parse::<u32>().ok())
                .unwrap_or(0);
            (blocked >= 2).then_some(())
        }
    })
    .await;
    approval::decide(
        &mut store,
        &d.config,
        &id,
        approval::Answer::new(
            &broker::Clock::system(),
            approval::Verdict::Approved,
            "cli:op",
            "",
        ),
    )
    .await
    .unwrap();
    wait_until(
        "delivery within 2 s of the decision",
        Duration::from_secs(2),
        || async { d.delivered("mail.out").first().cloned() },
    )
    .await;
    for s in services {
        s.stop().await.unwrap();
    }
}

/// Reads of many records (`approvals list`, the page's queue, reviews) go a
/// thousand per round trip, several at once: each record comes back under its
/// own id, in order across the chunks' edges, and a gone one as none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_records_read_at_once_each_come_back_under_their_own_id() {
    records_read_at_once(&Deployment::new(&approval_config(0))).await;
}

/// The check of [`many_records_read_at_once_each_come_back_under_their_own_id`]
/// on deployment `d` (approval required on `mail`, nothing parked yet).
pub(crate) async fn records_read_at_once(d: &Deployment) {
    let mut store = d.store().await;
    // Nothing pending: nothing read, no error.
    let none = approval::Approvals::on(&mut store)
        .load_many(&[])
        .await
        .unwrap();
    assert!(none.is_empty());
    let out = d.cowboy(&["approvals", "list"]);
    assert!(out.status.success() && out.stdout.is_empty(), "{out:?}");
    let out = d.cowboy_with_input(&["approvals", "review", "--as", "op"], "");
    assert!(out.status.success(), "{out:?}");
    let key = approval::IdKey::from_bytes([7; 32], "mail");
    let ids: Vec<String> = (0..2_500)
        .map(|i| key.id_for("mail:outbox", &format!("{i}-0")))
        .collect();
    let mut pipe = redis::pipe();
    // Every seventh is gone (settled and deleted, say), the last one too.
    for (i, id) in ids.iter().enumerate() {
        if i % 7 == 3 || i == ids.len() - 1 {
            continue;
        }
        pipe.hset_multiple(
            keys::approval(id),
            &[
                ("status", "pending".to_string()),
                ("source", "mail".to_string()),
                ("channel_id", format!("to-{i}")),
                ("created_at", "1".to_string()),
                ("expires_at", "0".to_string()),
            ],
        )
        .ignore()
        .zadd("mail:pending", id, i)
        .ignore();
    }
    let () = pipe.query_async(&mut store.conn).await.unwrap();
    let here = |i: usize| i % 7 != 3 && i != ids.len() - 1;
    let expect = |i: usize, r: Option<&approval::Record>| match (here(i), r) {
        (true, Some(r)) => assert_eq!(r.channel_id, format!("to-{i}"), "record {i}"),
        (false, None) => {}
        (_, r) => panic!("record {i}: {:?}", r.map(|r| &r.channel_id)),
    };
    let some = approval::Approvals::on(&mut store)
        .load_fields_many(&ids, &[approval::field::CHANNEL_ID])
        .await
        .unwrap();
    assert_eq!(some.len(), ids.len());
    for (i, r) in some.iter().enumerate() {
        expect(i, r.as_ref());
    }
    let whole = approval::Approvals::on(&mut store)
        .load_many(&ids)
        .await
        .unwrap();
    assert_eq!(whole.len(), ids.len());
    for (i, r) in whole.iter().enumerate() {
        expect(i, r.as_ref());
    }
    // The CLI's list: one line per record there, each under its own id.
    let out = d.cowboy(&["approvals", "list"]);
    assert!(out.status.success(), "{out:?}");
    let listed = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = listed.lines().collect();
    let there: Vec<usize> = (0..ids.len()).filter(|&i| here(i)).collect();
    assert_eq!(lines.len(), there.len(), "{listed}");
    for (line, i) in lines.iter().zip(there) {
        assert!(
            line.starts_with(&ids[i]) && line.contains(&format!(" -> to-{i} ")),
            "line for record {i}: {line}"
        );
    }
}

/// The message sent must be the message approved: a record whose whole-message
/// digest does not match the entry refuses the send with a notice and a dead letter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_digest_mismatch_refuses_the_send() {
    let d = Deployment::new(&approval_config(0));
    let services = [d.spawn("outbox", "mail"), d.spawn("outbox", "desk")];
    agent_sends(&d, "approved text", "r").await;
    let (id, _) = notification(&d, 0).await;
    let mut store = d.store().await;
    // A record whose digest is not the entry's, sealed as if the bridge had
    // written it (what only a bug could make): the send-time check refuses.
    let mut record = approval::Approvals::on(&mut store)
        .load(&id)
        .await
        .unwrap()
        .unwrap();
    record.message_sha256 = "0".repeat(64);
    let seal = approval::IdKey::existing(&mut store, "mail")
        .await
        .unwrap()
        .unwrap()
        .seal_version(&record);
    let _: () = redis::AsyncCommands::hset_multiple(
        &mut store.conn,
        keys::approval(&id),
        &[
            ("message_sha256", record.message_sha256.as_str()),
            ("version_seal", seal.as_str()),
        ],
    )
    .await
    .unwrap();
    approval::decide(
        &mut store,
        &d.config,
        &id,
        approval::Answer::new(
            &broker::Clock::system(),
            approval::Verdict::Approved,
            "cli:op",
            "",
        ),
    )
    .await
    .unwrap();
    let notice = wait_until("a failure notice", SOON, || async {
        inbox_notices(&d, "ann:mail:inbox").await.into_iter().next()
    })
    .await;
    assert_eq!(notice["status"], "failed");
    assert!(
        notice["reason"].contains("differs from the approved"),
        "{}",
        notice["reason"]
    );
    let dead = stream(&mut store, "mail:dead").await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0]["field:content"], "approved text");
    for s in services {
        s.stop().await.unwrap();
    }
    assert!(d.delivered("mail.out").is_empty());
}

/// Without approval, entries are delivered and acked, from both stream layouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_off_delivers_and_acks() {
    let d = Deployment::new(
        "[agents.ann]\n[bridges.mail]\ntype = \"console\"\noutput = \"{dir}/mail.out\"\ninput = \"{dir}/mail.in\"\ndestinations = [\"*\"]\n",
    );
    let outbox = d.spawn("outbox", "mail");
    let mut store = d.store().await;
    store
        .xadd(
            "mail:outbox",
            &[
                ("channel_id", b"c1"),
                ("content", b"flat"),
                ("subject", b"s"),
                ("reply_to", b"m0"),
            ],
        )
        .await
        .unwrap();
    store
        .xadd(
            "ann:mail:outbox",
            &[("channel_id", b"c2"), ("content", b"per-agent")],
        )
        .await
        .unwrap();
    let sent = wait_until("two deliveries", SOON, || async {
        let d2 = d.delivered("mail.out");
        (d2.len() == 2).then_some(d2)
    })
    .await;
    let mut contents: Vec<_> = sent.iter().map(|s| s.content.as_str()).collect();
    contents.sort();
    assert_eq!(contents, ["flat", "per-agent"]);
    let flat = sent.iter().find(|s| s.content == "flat").unwrap();
    assert_eq!(
        (flat.subject.as_deref(), flat.reply_to.as_deref()),
        (Some("s"), Some("m0"))
    );
    assert_ne!(sent[0].external_id, sent[1].external_id);
    outbox.stop().await.unwrap();
    assert_eq!(pending(&mut store, "mail:outbox", "mail-outbox").await, 0);
    assert_eq!(
        pending(&mut store, "ann:mail:outbox", "mail-outbox").await,
        0
    );
    assert!(hash(&mut store, "approval:mail_map").await.is_empty());
}

/// Redis goes away and comes back (with its data, as a persisting Redis does):
/// the outbox reconnects by itself, the parked entry is still parked and is
/// delivered on approval, and new entries flow again. Without its data, the
/// groups are created again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_survives_a_redis_restart() {
    let redis =
        harness::RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut d = Deployment::with_redis(redis, &approval_config(0));
    let services = [d.spawn("outbox", "mail"), d.spawn("outbox", "desk")];
    agent_sends(&d, "before the restart", "r1").await;
    let (id, _) = notification(&d, 0).await;
    d.redis.restart();
    let mut store = d.store().await;
    assert_eq!(
        hash(&mut store, &keys::approval(&id)).await["status"],
        "pending"
    );
    approval::decide(
        &mut store,
        &d.config,
        &id,
        approval::Answer::new(
            &broker::Clock::system(),
            approval::Verdict::Approved,
            "cli:op",
            "",
        ),
    )
    .await
    .unwrap();
    wait_until(
        "delivery after the restart",
        Duration::from_secs(30),
        || async { d.delivered("mail.out").first().cloned() },
    )
    .await;
    agent_sends(&d, "after the restart", "r2").await;
    notification(&d, 1).await;
    for s in services {
        s.stop().await.unwrap();
    }
    assert_eq!(d.delivered("mail.out").len(), 1);
    assert_eq!(
        d.delivered("desk.out").len(),
        2,
        "one notification each, none repeated"
    );
}

/// Waiting costs the same whatever is parked: over five sweep periods of an
/// idle outbox (on paused time: two and a half minutes of the services'
/// time), 256 parked entries cost Redis at most one sweep slice (64 record
/// reads) more than 128 do, and at most three commands a sweep more than
/// none: every card is known shown (its surface said so), so a sweep reads
/// only its blind slice of two records and the stream's oldest entry; the
/// rest is beats, lease renewals and takeover checks. A command per parked
/// entry and period would be 640 more.
#[tokio::test(start_paused = true)]
async fn idle_cost_does_not_grow_with_parked_entries() {
    let time = harness::Frozen::hold();
    let none = idle_commands(&time, 0).await;
    let few = idle_commands(&time, 128).await;
    let many = idle_commands(&time, 256).await;
    assert!(
        many <= none + 5 * 3,
        "idle commands over five sweep periods: {none} with none parked, {many} with 256"
    );
    // Per sweep period, both services together: at most one slice of record
    // reads (the bound the round robin of every record had), and about 30
    // commands of beats, lease renewals and takeover checks.
    assert!(
        few <= 5 * (64 + 40),
        "{few} commands over five sweep periods with 128 parked"
    );
    assert!(
        many <= few + 64,
        "idle commands over five sweep periods: {few} with 128 parked, {many} with 256"
    );
}

/// A decider that dies between deciding and waking the requester announced
/// the change first (`approval::Wake::Changed`): the next sweep reads that
/// record, finds it approved and delivers it, although every card is known
/// shown and the blind slice (two records a sweep, in id order) would reach
/// the last of 64 only in its 32nd sweep. Not before the sweep is due.
#[tokio::test(start_paused = true)]
async fn an_announced_decision_whose_wake_up_was_lost_is_read_at_the_next_sweep() {
    announced_decision(false).await;
}

/// The same when a sweep read the record between the announcement and the
/// decision (still pending then): an announcement holds for a second read.
#[tokio::test(start_paused = true)]
async fn an_announcement_read_before_its_decision_landed_is_read_again() {
    announced_decision(true).await;
}

/// An announced decision made without its wake-up, after one sweep period
/// if `read_between`, is delivered by a sweep.
async fn announced_decision(read_between: bool) {
    use broker::config::Service;
    let time = harness::Frozen::hold();
    let d = Deployment::new(&approval_config(0));
    let mut store = d.store().await;
    for i in 0..64 {
        let content = format!("m{i}");
        let fields = [
            ("channel_id", "bob@example.org".as_bytes()),
            ("content", content.as_bytes()),
        ];
        store.xadd("ann:mail:outbox", &fields).await.unwrap();
    }
    let timing = broker::timing::Timing::default();
    let services = [
        d.run_paused::<console::Console>(Service::Outbox, "mail", timing),
        d.run_paused::<console::Console>(Service::Outbox, "desk", timing),
    ];
    wait_until("every approval notified", SOON, || async {
        (d.delivered("desk.out").len() == 64).then_some(())
    })
    .await;
    wake_ups_handled(&d, 64).await;
    let mut ids = approval::list_ids(&mut store).await.unwrap();
    ids.sort();
    let id = ids.pop().unwrap();
    let record = hash(&mut store, &keys::approval(&id)).await;
    let worker = record.get("worker").cloned().unwrap_or_default();
    approval::wake(&mut store, "mail", &worker, &id, approval::Wake::Changed)
        .await
        .unwrap();
    wake_ups_handled(&d, 65).await;
    if read_between {
        time.advance(timing.sweep_every + Duration::from_secs(1))
            .await;
    }
    // No wake-up after it.
    harness::approve_unannounced(&mut store, "mail", &id).await;
    if !read_between {
        time.advance(timing.sweep_every / 2).await;
        assert!(
            d.delivered("mail.out").is_empty(),
            "delivered before the sweep was due"
        );
    }
    let sent = time
        .advance_until(
            "the approved entry delivered",
            timing.sweep_every,
            || async { d.delivered("mail.out").into_iter().next() },
        )
        .await;
    assert_eq!(sent.content, record["content_preview"]);
    for s in services {
        s.stop().await.unwrap();
    }
}

/// Waits until mail's default worker has read and acked every wake-up
/// written to it (at least `at_least` of them).
async fn wake_ups_handled(d: &Deployment, at_least: usize) {
    let (wakes, group) = (keys::decisions("mail"), keys::outbox_group("mail"));
    wait_until("every wake-up read and acked", SOON, || async {
        let mut store = d.store().await;
        let written = stream(&mut store, &wakes).await.len();
        let read = harness::entries_read(&mut store, &wakes, &group).await;
        let unacked = pending(&mut store, &wakes, &group).await;
        (written >= at_least && read == written && unacked == 0).then_some(())
    })
    .await;
}

/// Commands an idle requester and its surface send Redis over five sweep
/// periods, with `parked` approvals waiting (all shown).
async fn idle_commands(time: &harness::Frozen, parked: usize) -> u64 {
    use broker::config::Service;
    let d = Deployment::new(&approval_config(0));
    let mut store = d.store().await;
    for i in 0..parked {
        store
            .xadd(
                "ann:mail:outbox",
                &[
                    ("channel_id", b"bob@example.org"),
                    ("content", format!("m{i}").as_bytes()),
                ],
            )
            .await
            .unwrap();
    }
    let timing = broker::timing::Timing::default();
    let services = [
        d.run_paused::<console::Console>(Service::Outbox, "mail", timing),
        d.run_paused::<console::Console>(Service::Outbox, "desk", timing),
    ];
    wait_until("every approval notified", SOON, || async {
        (d.delivered("desk.out").len() == parked).then_some(())
    })
    .await;
    // The batched marks and the first sweep go by before counting, and every
    // record is marked shown (else a sweep would ask again, which is not
    // idling).
    time.advance(timing.sweep_every + Duration::from_secs(5))
        .await;
    wait_until("every card recorded as shown", SOON, || {
        let mut store = store.clone();
        async move {
            let ids = approval::list_ids(&mut store).await.unwrap();
            let mut shown = 0;
            for id in &ids {
                shown += hash(&mut store, &keys::approval(id))
                    .await
                    .contains_key("notify_external_id") as usize;
            }
            (shown == parked).then_some(())
        }
    })
    .await;
    // And their surface's word of it read, so none is read while counting.
    wake_ups_handled(&d, parked).await;
    // Each reader's blocking `XREADGROUP` is asked again when its `BLOCK`
    // runs out, on Redis's clock, which paused time does not move: once per
    // five real seconds per service, however long this machine takes to
    // move through the window. It waits for new entries and decisions, never
    // for a parked one, so it is left out of the count.
    let idle = |counts: std::collections::BTreeMap<String, u64>| -> u64 {
        counts
            .into_iter()
            .filter(|(name, _)| name != "xreadgroup")
            .map(|(_, n)| n)
            .sum()
    };
    let before = idle(command_counts(&mut store).await);
    time.advance(timing.sweep_every * 5).await;
    let during = idle(command_counts(&mut store).await) - before;
    for s in services {
        s.stop().await.unwrap();
    }
    during
}

/// With deliveries side by side (`max_in_flight = 8`, each send taking 50 ms),
/// every entry is delivered once and the order per destination is the stream's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_side_by_side_keep_order_per_destination() {
    let d = Deployment::new(
        "[agents.ann]\n[bridges.mail]\ntype = \"console\"\noutput = \"{dir}/mail.out\"\ninput = \"{dir}/mail.in\"\ndestinations = [\"*\"]\nmax_in_flight = 8\nlatency_ms = 50\n",
    );
    let mut store = d.store().await;
    let mut sent = Vec::new();
    for i in 0..40 {
        let channel = format!("c{}", i % 3);
        let content = format!("{channel}-{i}");
        store
            .xadd(
                "ann:mail:outbox",
                &[
                    ("channel_id", channel.as_bytes()),
                    ("content", content.as_bytes()),
                ],
            )
            .await
            .unwrap();
        sent.push((channel, content));
    }
    let outbox = d.spawn("outbox", "mail");
    let out = wait_until("all 40 delivered", SOON, || async {
        let out = d.delivered("mail.out");
        (out.len() >= 40).then_some(out)
    })
    .await;
    outbox.stop().await.unwrap();
    assert_eq!(d.delivered("mail.out").len(), 40, "each once");
    for c in ["c0", "c1", "c2"] {
        let want: Vec<&str> = sent
            .iter()
            .filter(|(ch, _)| ch == c)
            .map(|(_, t)| t.as_str())
            .collect();
        let got: Vec<&str> = out
            .iter()
            .filter(|l| l.channel_id == c)
            .map(|l| l.content.as_str())
            .collect();
        assert_eq!(got, want, "order kept for {c}");
    }
    let mut store = d.store().await;
    assert_eq!(
        pending(&mut store, "ann:mail:outbox", "mail-outbox").await,
        0
    );
}

/// Approved entries are sent beside the loop, side by side: four approvals of a
/// bridge whose sends take 3 s each all have their sends under way before the
/// first finishes, and a new entry is parked and notified meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approved_deliveries_run_side_by_side_and_block_nothing() {
    let d = Deployment::new(&Setup::approval(0).mail("latency_ms = 3000").toml());
    let _desk = d.spawn("outbox", "desk");
    let _outbox = d.process("cowboy-console-outbox", "mail");
    let mut ids = Vec::new();
    for i in 0..4 {
        agent_sends(&d, &format!("slow {i}"), &format!("r{i}")).await;
        ids.push(notification(&d, i).await.0);
    }
    for id in &ids {
        let out = d.cowboy(&["approvals", "approve", id, "--as", "op"]);
        assert!(out.status.success(), "{out:?}");
    }
    wait_until("every approved send started", SOON, || async {
        let mut store = d.store().await;
        for id in &ids {
            if !hash(&mut store, &keys::approval(id))
                .await
                .contains_key("delivery_started")
            {
                return None;
            }
        }
        Some(())
    })
    .await;
    agent_sends(&d, "meanwhile", "r9").await;
    notification(&d, 4).await;
    assert!(
        d.delivered("mail.out").is_empty(),
        "all of this happened before the first 3 s send finished"
    );
    let sent = wait_until("four deliveries", SOON, || async {
        let sent = d.delivered("mail.out");
        (sent.len() == 4).then_some(sent)
    })
    .await;
    let mut contents: Vec<String> = sent.into_iter().map(|l| l.content).collect();
    contents.sort();
    assert_eq!(contents, ["slow 0", "slow 1", "slow 2", "slow 3"]);
}

/// While an approved entry's send is under way, neither its entry vanishing
/// from the stream (the agent trims it) nor the approval being answered again
/// closes it early: it is settled once, as delivered, and told so once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_send_under_way_is_settled_once() {
    let d = Deployment::new(&Setup::approval(0).mail("latency_ms = 2000").toml());
    let _desk = d.spawn("outbox", "desk");
    let _outbox = d.process("cowboy-console-outbox", "mail");
    agent_sends(&d, "once", "r1").await;
    let (id, _) = notification(&d, 0).await;
    let out = d.cowboy(&["approvals", "approve", &id, "--as", "op"]);
    assert!(out.status.success(), "{out:?}");
    let mut store = d.store().await;
    wait_until("the approved send under way", SOON, || async {
        hash(&mut store.clone(), &keys::approval(&id))
            .await
            .contains_key("delivery_started")
            .then_some(())
    })
    .await;
    let _: i64 = redis::cmd("XTRIM")
        .arg(keys::agent_outbox("ann", "mail"))
        .arg("MAXLEN")
        .arg(0)
        .query_async(&mut store.conn)
        .await
        .unwrap();
    // Answering again wakes the requester again.
    let again = d.cowboy(&["approvals", "approve", &id, "--as", "op"]);
    assert!(!again.status.success(), "already approved");
    wait_until("the delivery", SOON, || async {
        (d.delivered("mail.out").len() == 1).then_some(())
    })
    .await;
    wait_until("the record closed", SOON, || async {
        hash(&mut store.clone(), &keys::approval(&id))
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    let outcomes: Vec<_> = stream(&mut store, "desk:outbox")
        .await
        .into_iter()
        .filter(|e| e.contains_key("approval_outcome"))
        .collect();
    assert_eq!(outcomes.len(), 1, "{outcomes:?}");
    assert_eq!(outcomes[0]["approval_outcome"], "approved");
    let notices = inbox_notices(&d, "ann:mail:inbox").await;
    assert!(
        notices.iter().all(|n| n["status"] != "failed"),
        "{notices:?}"
    );
    assert_eq!(d.delivered("mail.out").len(), 1);
}
