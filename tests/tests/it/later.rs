//! "Later": an approver's snooze moves the deadline, within its bounds, and
//! never decides; the agent is not told `expired` while snoozed.

use std::collections::HashMap;
use std::time::Duration;

use broker::config::Service;
use broker::{approval, keys};
use harness::setup::Setup;
use harness::{hash, stream, wait_until, Deployment};

use crate::approval::{inbox_notices, notification, react};
use crate::SOON;

async fn record(d: &Deployment, id: &str) -> HashMap<String, String> {
    let mut store = d.store().await;
    hash(&mut store, &keys::approval(id)).await
}

async fn trail(d: &Deployment) -> Vec<HashMap<String, String>> {
    let mut store = d.store().await;
    stream(&mut store, &keys::audit("mail")).await
}

/// On paused time: a stranger's 💤 moves nothing; boss's 💤 moves the
/// deadline by `approval.snooze`, audited with who and why; a snooze past
/// `max_snooze` and one past `max_snoozes` are refused; past the first
/// deadline nothing expires, and the agent (who asked for progress) hears
/// the new deadline; at the last one it expires, and says it was snoozed (a
/// deadline moved without the bridge's seal is not honoured). The same
/// request applied twice moves the deadline once.
/// Nothing was counted toward the quorum by any of it.
#[tokio::test(start_paused = true)]
async fn later_moves_the_deadline_within_its_bounds_and_never_decides() {
    let time = harness::Frozen::hold();
    let setup = Setup::approval(4)
        .approval_key("snooze = 3")
        .approval_key("max_snooze = 5")
        .approval_key("max_snoozes = 2")
        .toml();
    let d = Deployment::new(&setup);
    let timing = broker::timing::Timing::default();
    let services = [
        d.run_paused::<console::Console>(Service::Outbox, "mail", timing),
        d.run_paused::<console::Console>(Service::Outbox, "desk", timing),
        d.run_paused::<console::Console>(Service::Ingest, "desk", timing),
    ];
    // The agent asks for progress (as `cowboy mcp` does): it hears deadlines.
    d.store()
        .await
        .xadd(
            &keys::agent_outbox("ann", "mail"),
            &[
                ("channel_id", b"bob@example.org".as_slice()),
                ("content", b"after lunch"),
                ("request_id", b"r1"),
                ("notices", b"all"),
            ],
        )
        .await
        .unwrap();
    let (id, external) = notification(&d, 0).await;
    let first: u64 = record(&d, &id).await["expires_at"].parse().unwrap();

    react(&d, &external, "💤", "mallory", "");
    react(&d, &external, "💤", "boss", "in a meeting");
    let snoozed = wait_until("boss's snooze applied", SOON, || async {
        let r = record(&d, &id).await;
        (r.get("snoozes").map(String::as_str) == Some("1")).then_some(r)
    })
    .await;
    assert_eq!(snoozed["expires_at"], (first + 3).to_string());
    assert_eq!(snoozed["snoozed_until"], (first + 3).to_string());
    assert_eq!(snoozed["snoozed_by"], "console:boss");
    assert_eq!(snoozed["status"], "pending");
    let events = trail(&d).await;
    let snoozes: Vec<_> = events.iter().filter(|e| e["event"] == "snoozed").collect();
    assert_eq!(snoozes.len(), 1, "mallory's 💤 moved nothing: {events:?}");
    assert_eq!(snoozes[0]["by"], "console:boss");
    assert_eq!(snoozes[0]["reason"], "in a meeting");
    assert_eq!(snoozes[0]["until"], (first + 3).to_string());
    assert!(
        events
            .iter()
            .any(|e| e["event"] == "ignored" && e["by"] == "console:mallory"),
        "the stranger's snooze is in the trail as ignored: {events:?}"
    );

    // Straight through the rules (as the CLI without [operators] does).
    let store = d.store().await;
    let clock = broker::Clock::starting_at(broker::now_secs_f64());
    let config = d.config.clone();
    let later = |who: &'static str, seconds: u64, request: &'static str| {
        let (config, id, mut store) = (config.clone(), id.clone(), store.clone());
        async move {
            let later = approval::snooze::Later {
                seconds: Some(seconds),
                reason: "back at 3",
                request,
            };
            approval::snooze::snooze(&mut store, &config, &clock, &id, who, later).await
        }
    };
    let refused = |r: &broker::Result<approval::snooze::Snoozed>, what: &str| matches!(r, Err(broker::Error::Operator { message, .. }) if message.contains(what));
    let too_long = later("cli:op", 6, "n1").await;
    assert!(refused(&too_long, "max_snooze"), "{too_long:?}");
    assert!(
        trail(&d).await.iter().any(|e| e["event"] == "ignored"
            && e["by"] == "cli:op"
            && e["why"].contains("max_snooze")),
        "a refused snooze is in the trail"
    );
    let stranger = later("cli:eve", 2, "n2").await;
    assert!(refused(&stranger, "may not answer"), "{stranger:?}");
    let second = later("cli:op", 5, "n3").await.unwrap();
    assert_eq!((second.until, second.count, second.max), (first + 8, 2, 2));
    // The same request applied again (a failure after it, retried) moves
    // nothing twice and is not refused as one snooze too many.
    let again = later("cli:op", 5, "n3").await.unwrap();
    assert_eq!((again.until, again.count), (first + 8, 2));
    let third = later("cli:op", 1, "n4").await;
    assert!(refused(&third, "max_snoozes"), "{third:?}");
    assert_eq!(record(&d, &id).await["expires_at"], (first + 8).to_string());

    // Past the first deadline and the first snooze's: nothing expires.
    let lead = first as f64 + 6.0 - clock.now_secs_f64();
    time.advance(Duration::from_secs_f64(lead.max(0.0))).await;
    let notices = inbox_notices(&d, "ann:mail:inbox").await;
    assert!(
        notices.iter().all(|n| n["status"] == "parked"),
        "nothing but progress before the snoozed deadline: {notices:?}"
    );
    let deadlines: Vec<&str> = notices.iter().map(|n| n["expires_at"].as_str()).collect();
    assert!(
        deadlines.contains(&(first + 8).to_string().as_str()),
        "the agent heard the new deadline: {deadlines:?}"
    );
    let r = record(&d, &id).await;
    assert_eq!(r["status"], "pending");
    assert!(
        r.get("approvals").is_none_or(|a| a.is_empty()),
        "a snooze counts toward nothing: {r:?}"
    );

    // A writer of records without the bridge's key (the notify side's
    // password) moves the deadline far away: not sealed, so not honoured.
    let mut admin = d.store().await;
    let far = (first + 100_000).to_string();
    let _: () =
        redis::AsyncCommands::hset(&mut admin.conn, keys::approval(&id), "expires_at", &far)
            .await
            .unwrap();
    let expired = time
        .advance_until(
            "the expiry at the snoozed deadline",
            Duration::from_secs(5),
            || async {
                inbox_notices(&d, "ann:mail:inbox")
                    .await
                    .into_iter()
                    .find(|n| n["status"] == "expired")
            },
        )
        .await;
    assert!(
        expired["reason"].contains("2 snooze"),
        "the expiry says it was snoozed: {expired:?}"
    );
    for s in services {
        s.stop().await.unwrap();
    }
    assert!(d.delivered("mail.out").is_empty());
    assert_eq!(
        trail(&d)
            .await
            .iter()
            .filter(|e| e["event"] == "snoozed")
            .count(),
        3,
        "the request applied again is in the trail again (written at least once)"
    );
}

/// The digest lines on desk.out (messages, not cards).
fn digests(d: &Deployment) -> Vec<console::send::Delivered> {
    d.delivered("desk.out")
        .into_iter()
        .filter(|l| l.approval_id.is_none())
        .collect()
}

/// Moves paused time to `secs` past the turn of the next hour (one jump, once
/// the services are idle: mail has read and acked every wake-up, the cards'
/// included, so no request of theirs is on the wire to time out), then lets
/// their loops run.
async fn past_the_next_hour(d: &Deployment, clock: &broker::Clock, secs: u64) {
    let wakes = keys::decisions("mail");
    let group = keys::outbox_group("mail");
    wait_until("mail idle: every wake-up read and acked", SOON, || async {
        let mut store = d.store().await;
        let written = stream(&mut store, &wakes).await.len();
        let read = harness::entries_read(&mut store, &wakes, &group).await;
        let unacked = harness::pending(&mut store, &wakes, &group).await;
        (read == written && unacked == 0).then_some(())
    })
    .await;
    let now = clock.now_secs_f64();
    let next = ((now as u64) / 3600 + 1) * 3600 + secs;
    tokio::time::advance(Duration::from_secs_f64(next as f64 - now)).await;
    harness::real_sleep(Duration::from_millis(50)).await;
}

/// `approval.digest = "hourly"`: nothing in the hour the services started;
/// at the turn of the next, one message through desk listing what waits,
/// oldest first, with the page's links; no second one in that hour; none
/// at the next turn once nothing waits.
#[tokio::test(start_paused = true)]
async fn a_digest_lists_what_waits_once_an_hour_and_nothing_when_nothing_does() {
    let _time = harness::Frozen::hold();
    let setup = Setup::approval(0)
        .approval_key("digest = \"hourly\"")
        .approval_key("digest_channel = \"digests\"")
        .desk_destinations(&["ops", "digests"])
        .with("[web]\npublic_url = \"https://approvals.example.org\"\n")
        .toml();
    let d = Deployment::new(&setup);
    let timing = broker::timing::Timing::default();
    let services = [
        d.run_paused::<console::Console>(Service::Outbox, "mail", timing),
        d.run_paused::<console::Console>(Service::Outbox, "desk", timing),
    ];
    let clock = broker::Clock::starting_at(broker::now_secs_f64());
    for (content, request) in [("first", "r1"), ("second", "r2")] {
        crate::approval::agent_sends(&d, content, request).await;
    }
    let (first, _) = notification(&d, 0).await;
    let (second, _) = notification(&d, 1).await;
    assert!(digests(&d).is_empty(), "nothing in the hour it started");

    past_the_next_hour(&d, &clock, 1).await;
    let digest = wait_until("the hour's digest", SOON, || async {
        digests(&d).into_iter().next()
    })
    .await;
    assert_eq!(digest.channel_id, "digests");
    assert_eq!(
        digest.subject.as_deref(),
        Some("2 approval(s) waiting on mail")
    );
    let (a, b) = (
        digest.content.find(&first).expect("lists the first"),
        digest.content.find(&second).expect("lists the second"),
    );
    assert!(a < b, "oldest first: {}", digest.content);
    assert!(
        digest
            .content
            .contains(&format!("https://approvals.example.org/approval/{first}")),
        "{}",
        digest.content
    );
    assert!(
        !digest.content.contains("first\n") && !digest.content.contains("| "),
        "no content of the messages: {}",
        digest.content
    );

    // A forged digest (anyone who writes desk's flat outbox may try) and an
    // agent's message to the digest channel: neither is delivered.
    let mut store = d.store().await;
    let sent: Vec<String> = redis::AsyncCommands::keys(&mut store.conn, "mail:digest:*")
        .await
        .unwrap();
    let of = sent[0].replacen("mail:digest:", "mail:", 1);
    let subject = digest.subject.clone().unwrap();
    store
        .xadd(
            &keys::outbox("desk"),
            &[
                ("digest_of", of.as_bytes()),
                ("channel_id", b"digests".as_slice()),
                ("subject", subject.as_bytes()),
                (
                    "content",
                    b"urgent: approve everything at https://evil.example",
                ),
            ],
        )
        .await
        .unwrap();
    store
        .xadd(
            &keys::agent_outbox("ann", "desk"),
            &[
                ("channel_id", b"digests".as_slice()),
                ("content", b"a look-alike digest"),
            ],
        )
        .await
        .unwrap();
    let refused = wait_until("both refused", SOON, || {
        let mut store = store.clone();
        async move {
            let dead = stream(&mut store, &keys::dead("desk")).await;
            (dead.len() == 2).then_some(dead)
        }
    })
    .await;
    assert!(
        refused
            .iter()
            .any(|e| e["reason"].contains("not the digest"))
            && refused
                .iter()
                .any(|e| e["reason"].contains("approval requests are shown")),
        "{refused:?}"
    );

    // Later in the same hour: no second digest.
    tokio::time::advance(Duration::from_secs(600)).await;
    harness::real_sleep(Duration::from_millis(300)).await;
    assert_eq!(digests(&d).len(), 1, "one digest an hour");

    for id in [&first, &second] {
        crate::approval::approve_directly(&d, id, "console:boss").await;
    }
    wait_until("both delivered", SOON, || async {
        (d.delivered("mail.out").len() == 2).then_some(())
    })
    .await;
    past_the_next_hour(&d, &clock, 1).await;
    harness::real_sleep(Duration::from_millis(300)).await;
    assert_eq!(digests(&d).len(), 1, "nothing waits: no digest");
    let sent: Vec<String> = redis::AsyncCommands::keys(&mut store.conn, "mail:digest:*")
        .await
        .unwrap();
    assert_eq!(sent.len(), 1, "one period sent: {sent:?}");
    for s in services {
        s.stop().await.unwrap();
    }
}
