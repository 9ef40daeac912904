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
