//! Escalation: an approval nobody answers in time is asked on the next
//! step's surface too, whose approvers may answer from then on.

use std::collections::HashMap;
use std::time::Duration;

use broker::config::Service;
use broker::keys;
use harness::setup::Setup;
use harness::{hash, stream, wait_until, Deployment};

use crate::approval::{agent_sends, notification, react};
use crate::fanout::{hall_shown, react_on_hall};
use crate::SOON;

/// mail asks desk; 5 s after parking, undecided, hall (channel `floor`) is
/// asked too and carol (a person: her console identity) may answer.
/// Deadline a minute.
fn ladder() -> Deployment {
    let setup = Setup::approval(60)
        .approval_key(
            "escalate = [{ after = 5, notify = \"hall\", notify_channel = \"floor\", people = [\"carol\"] }]",
        )
        .with("[bridges.hall]\ntype = \"console\"\noutput = \"{dir}/hall.out\"\ninput = \"{dir}/hall.in\"\ndestinations = [\"floor\"]\n\n[people.carol]\nidentities = [\"console:carol\"]\n");
    Deployment::new(&setup.toml())
}

fn paused_services(d: &Deployment) -> Vec<harness::Running> {
    let timing = broker::timing::Timing::default();
    vec![
        d.run_paused::<console::Console>(Service::Outbox, "mail", timing),
        d.run_paused::<console::Console>(Service::Outbox, "desk", timing),
        d.run_paused::<console::Console>(Service::Ingest, "desk", timing),
        d.run_paused::<console::Console>(Service::Outbox, "hall", timing),
        d.run_paused::<console::Console>(Service::Ingest, "hall", timing),
    ]
}

async fn trail(d: &Deployment) -> Vec<HashMap<String, String>> {
    let mut store = d.store().await;
    stream(&mut store, &keys::audit("mail")).await
}

async fn record(d: &Deployment, id: &str) -> HashMap<String, String> {
    let mut store = d.store().await;
    hash(&mut store, &keys::approval(id)).await
}

/// On paused time: carol (a step's approver) answering before the step is
/// ignored; nobody answers for 5 s, so hall is asked (a card on `floor`),
/// the step is audited, sealed on the record, and desk's card is told; then
/// carol's answer on hall decides, and the message is sent once.
#[tokio::test(start_paused = true)]
async fn an_unanswered_approval_climbs_the_ladder_and_is_decided_there() {
    let time = harness::Frozen::hold();
    let d = ladder();
    let services = paused_services(&d);
    agent_sends(&d, "deploy friday", "r1").await;
    let (id, desk_card) = notification(&d, 0).await;
    react(&d, &desk_card, "✅", "carol", "");
    wait_until("carol's early answer ignored", SOON, || async {
        trail(&d)
            .await
            .into_iter()
            .any(|e| e["event"] == "ignored" && e["by"] == "console:carol")
            .then_some(())
    })
    .await;
    assert!(
        d.delivered("hall.out").is_empty(),
        "no step before its time"
    );

    let hall = time
        .advance_until("hall asked", Duration::from_secs(10), || async {
            d.delivered("hall.out").first().cloned()
        })
        .await;
    assert_eq!(hall.approval_id.as_deref(), Some(id.as_str()));
    assert_eq!(hall.channel_id, "floor");
    assert!(
        hall.content
            .contains("Escalated: escalated 1 step: asked on desk, hall"),
        "the new card says it is an escalation: {}",
        hall.content
    );
    let r = record(&d, &id).await;
    assert_eq!(r["escalated"], "1");
    assert_eq!(r["also"], "hall");
    let steps: Vec<_> = trail(&d)
        .await
        .into_iter()
        .filter(|e| e["event"] == "escalated")
        .collect();
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!(steps[0]["notify"], "hall");
    assert_eq!(steps[0]["count"], "1");
    let mut store = d.store().await;
    let told = stream(&mut store, &keys::outbox("desk")).await;
    assert!(
        told.iter()
            .any(|e| e.get("approval_outcome").map(String::as_str) == Some("escalated")),
        "desk's card is told of the step: {told:?}"
    );

    carol_approves_on_hall(&d, &time, &hall.external_id, "deploy friday").await;
    for s in services {
        s.stop().await.unwrap();
    }
    assert_eq!(d.delivered("mail.out").len(), 1);
}

/// A writer of an unedited record who names an editor in it (and an
/// "agent's version") does not get a step's card to claim an edit: who
/// edited is shown only for an edited version, which the bridge seals.
#[tokio::test(start_paused = true)]
async fn a_steps_card_claims_no_edit_a_writer_put_in_the_record() {
    let time = harness::Frozen::hold();
    let d = ladder();
    let services = paused_services(&d);
    agent_sends(&d, "deploy friday", "r1").await;
    let (id, _) = notification(&d, 0).await;
    let mut store = d.store().await;
    let zeros = "0".repeat(64);
    harness::write_record(
        &mut store,
        &id,
        &[("edited_by", "cli:ceo"), ("original_sha256", &zeros)],
    )
    .await;
    let hall = time
        .advance_until("hall asked", Duration::from_secs(10), || async {
            d.delivered("hall.out").first().cloned()
        })
        .await;
    assert!(
        hall.content
            .contains("\nEdited:    no (as the agent wrote it)\n"),
        "{}",
        hall.content
    );
    assert!(!hall.content.contains("cli:ceo"), "{}", hall.content);
    for s in services {
        s.stop().await.unwrap();
    }
}

/// carol's ✅ on hall's card `external`, once it is answerable: the message
/// `content` is sent.
async fn carol_approves_on_hall(
    d: &Deployment,
    time: &harness::Frozen,
    external: &str,
    content: &str,
) {
    hall_shown(d, external).await;
    react_on_hall(d, external, "✅", "carol");
    let sent = time
        .advance_until("the approved message", Duration::from_secs(5), || async {
            d.delivered("mail.out").first().cloned()
        })
        .await;
    assert_eq!(sent.content, content);
}

/// An answer before the step's time: no escalation, ever. And a record
/// that says it escalated without the bridge's seal lets nobody new decide:
/// carol's approval on it is refused as tampered.
#[tokio::test(start_paused = true)]
async fn an_answer_in_time_means_no_step_and_a_forged_step_lets_nobody_in() {
    let time = harness::Frozen::hold();
    let d = ladder();
    let services = paused_services(&d);
    agent_sends(&d, "first", "r1").await;
    let (first, card) = notification(&d, 0).await;
    agent_sends(&d, "second", "r2").await;
    let (second, _) = notification(&d, 1).await;
    react(&d, &card, "✅", "boss", "");
    time.advance_until("the first approved", Duration::from_secs(3), || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    // The second's record claims a step was taken, without the seal.
    let mut admin = d.store().await;
    let _: () =
        redis::AsyncCommands::hset(&mut admin.conn, keys::approval(&second), "escalated", "1")
            .await
            .unwrap();
    let seen = record(&d, &second).await["message_sha256"].clone();
    let answer = broker::approval::Answer::new(
        &broker::Clock::starting_at(broker::now_secs_f64()),
        broker::approval::Verdict::Approved,
        "console:carol",
        "",
    )
    .seeing(&seen);
    // An approver's edit does not seal the forged step into the record.
    let change = broker::approval::edit::Change {
        content: Some("second, edited".into()),
        seen: Some(seen.clone()),
        ..Default::default()
    };
    let edit = broker::approval::edit::edit(
        &mut admin,
        &d.config,
        &broker::Clock::starting_at(broker::now_secs_f64()),
        &second,
        &change,
        "cli:op",
    )
    .await;
    assert!(
        matches!(&edit, Err(e) if e.to_string().contains("changed outside the broker")),
        "{edit:?}"
    );
    let outcome = broker::approval::decide(&mut admin, &d.config, &second, answer)
        .await
        .unwrap();
    assert!(
        matches!(
            outcome,
            broker::approval::Outcome::Late(broker::approval::Late::Tampered)
        ),
        "{outcome:?}"
    );
    time.advance(Duration::from_secs(10)).await;
    assert!(
        d.delivered("hall.out").is_empty(),
        "the first was decided in time, the second's forged step is not one"
    );
    assert!(
        !trail(&d).await.iter().any(|e| e["event"] == "escalated"),
        "no step taken"
    );
    assert_eq!(record(&d, &first).await.get("escalated"), None);
    for s in services {
        s.stop().await.unwrap();
    }
    assert_eq!(d.delivered("mail.out").len(), 1, "only the first was sent");
}

/// A step's surface holds the records' passwords from the start (it must,
/// to show the step's card): it lists itself on an approval before the step
/// (its card fields forged). The requesting outbox's sweeps write nothing to
/// it before the step; the step is taken on time all the same, its card
/// shown, and its approver decides.
#[tokio::test(start_paused = true)]
async fn a_step_surface_cannot_be_asked_before_its_step() {
    let time = harness::Frozen::hold();
    let d = ladder();
    let quick = broker::timing::Timing {
        sweep_every: Duration::from_millis(500),
        ..Default::default()
    };
    let mut services = paused_services(&d);
    services.remove(0).stop().await.unwrap();
    services.push(d.run_paused::<console::Console>(Service::Outbox, "mail", quick));
    agent_sends(&d, "wait for it", "r1").await;
    let (id, _) = notification(&d, 0).await;
    let mut store = d.store().await;
    let _: () = redis::cmd("HSET")
        .arg(keys::approval(&id))
        .arg(&[
            "also",
            "hall",
            "hall.notify",
            "hall",
            "hall.notify_channel",
            "floor",
        ])
        .query_async(&mut store.conn)
        .await
        .unwrap();
    time.advance(Duration::from_secs(3)).await;
    assert!(
        stream(&mut store, &keys::outbox("hall")).await.is_empty(),
        "nothing written to the step's surface before the step"
    );
    let hall = time
        .advance_until(
            "the step taken on time",
            Duration::from_secs(10),
            || async { d.delivered("hall.out").first().cloned() },
        )
        .await;
    assert_eq!(record(&d, &id).await["also"], "hall", "listed once");
    carol_approves_on_hall(&d, &time, &hall.external_id, "wait for it").await;
    for s in services {
        s.stop().await.unwrap();
    }
}
