//! Fan-out: one approval asked on several surfaces at once (`approval.also`),
//! one card each; an answer on any of them counts, people count once across
//! them, and every card closes with the approval.

use std::collections::HashMap;

use broker::{approval, keys, Clock};
use harness::setup::Setup;
use harness::{hash, stream, wait_until, Deployment};
use serde_json::json;

use crate::approval::{agent_sends, first_sent, notification, react};
use crate::ledger::edit_as;
use crate::SOON;

/// `setup`, asking also on console bridge `hall` (channel `floor`).
fn fanned_out(setup: Setup) -> Deployment {
    let setup = setup
        .approval_key("also = [{ notify = \"hall\", notify_channel = \"floor\" }]")
        .with(
        "[bridges.hall]\ntype = \"console\"\noutput = \"{dir}/hall.out\"\ninput = \"{dir}/hall.in\"\ndestinations = [\"floor\"]\n",
    );
    Deployment::new(&setup.toml())
}

/// mail's outbox, and each surface's outbox and ingest.
fn services(d: &Deployment) -> Vec<harness::Running> {
    vec![
        d.spawn("outbox", "mail"),
        d.spawn("outbox", "desk"),
        d.spawn("ingest", "desk"),
        d.spawn("outbox", "hall"),
        d.spawn("ingest", "hall"),
    ]
}

/// The n-th card on hall, once recorded as shown: (approval id, external id).
async fn hall_card(d: &Deployment, n: usize) -> (String, String) {
    let line = wait_until("a card on hall.out", SOON, || async {
        d.delivered("hall.out").get(n).cloned()
    })
    .await;
    let external = line.external_id.clone();
    assert_eq!(
        line.channel_id, "floor",
        "hall's card goes to its own channel"
    );
    hall_shown(d, &external).await;
    (
        line.approval_id.expect("a card names its approval"),
        external,
    )
}

/// Waits until hall's card `external` is recorded as shown (answerable).
pub(crate) async fn hall_shown(d: &Deployment, external: &str) {
    let store = d.store().await;
    wait_until("hall's card recorded as shown", SOON, || {
        let (mut store, external) = (store.clone(), external.to_string());
        async move {
            hash(&mut store, &keys::approval_map("hall"))
                .await
                .contains_key(&external)
                .then_some(())
        }
    })
    .await;
}

pub(crate) fn react_on_hall(d: &Deployment, external: &str, emoji: &str, user: &str) {
    d.write_input(
        "hall.in",
        json!({"kind": "reaction", "message_id": external, "emoji": emoji, "user": user, "reason": ""}),
    );
}

async fn map_of(d: &Deployment, surface: &str) -> HashMap<String, String> {
    let mut store = d.store().await;
    hash(&mut store, &keys::approval_map(surface)).await
}

async fn trail(d: &Deployment) -> Vec<HashMap<String, String>> {
    let mut store = d.store().await;
    stream(&mut store, &keys::audit("mail")).await
}

/// One approval, two cards (desk's on `ops`, hall's on `floor`), each shown
/// and audited; boss answers on hall: the message is sent once, and both
/// cards are disarmed (their outcome shown, their map entries gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_on_either_surface_decides_and_closes_both_cards() {
    let d = fanned_out(Setup::approval(3600));
    let _services = services(&d);
    agent_sends(&d, "ship it", "r1").await;
    let (id, desk_card) = notification(&d, 0).await;
    let (hall_id, hall_card) = hall_card(&d, 0).await;
    assert_eq!(id, hall_id, "one approval, a card on each surface");
    let record = hash(&mut d.store().await, &keys::approval(&id)).await;
    assert_eq!(record["also"], "hall");
    assert_eq!(record["hall.notify_channel"], "floor");
    assert_eq!(record["hall.notify_external_id"], hall_card);
    assert_eq!(record["notify_external_id"], desk_card);
    let shown: Vec<String> = trail(&d)
        .await
        .into_iter()
        .filter(|e| e["event"] == "notified")
        .map(|e| e["notify"].clone())
        .collect();
    assert!(
        shown.contains(&"desk".to_string()) && shown.contains(&"hall".to_string()),
        "both cards are in the trail: {shown:?}"
    );

    react_on_hall(&d, &hall_card, "✅", "boss");
    let sent = first_sent(&d).await;
    assert_eq!(sent.content, "ship it");
    wait_until("both cards disarmed", SOON, || async {
        let (desk, hall) = (map_of(&d, "desk").await, map_of(&d, "hall").await);
        (!desk.contains_key(&desk_card) && !hall.contains_key(&hall_card)).then_some(())
    })
    .await;
    // Each surface was told the outcome (and took it: nothing pending).
    for surface in ["desk", "hall"] {
        let mut store = d.store().await;
        let outcomes: Vec<_> = stream(&mut store, &keys::outbox(surface))
            .await
            .into_iter()
            .filter(|e| e.get("approval_outcome").map(String::as_str) == Some("approved"))
            .collect();
        assert_eq!(outcomes.len(), 1, "{surface} is told the outcome once");
    }
    // A late answer on desk's card changes nothing.
    react(&d, &desk_card, "❌", "boss", "");
    assert_eq!(d.delivered("mail.out").len(), 1, "sent once");
}

/// An edit supersedes both cards: each surface shows the new version on a new
/// card, an answer to an old card (on either surface) is late, and an answer
/// to a new one decides the edited version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_supersedes_the_cards_on_every_surface() {
    let d = fanned_out(Setup::approval(3600));
    let _services = services(&d);
    agent_sends(&d, "the draft", "r1").await;
    let (id, old_desk) = notification(&d, 0).await;
    let (_, old_hall) = hall_card(&d, 0).await;
    edit_as(&d, &id, "the final text", "console:boss").await;
    let mut store = d.store().await;
    let (_, new_desk) = notification(&d, 1).await;
    let (_, new_hall) = hall_card(&d, 1).await;
    assert_ne!(new_desk, old_desk);
    assert_ne!(new_hall, old_hall);
    let record = hash(&mut store, &keys::approval(&id)).await;
    assert_eq!(record["hall.superseded"], old_hall);
    assert_eq!(record["superseded"], old_desk);
    assert!(!map_of(&d, "hall").await.contains_key(&old_hall));

    // cli:op approves through hall's old card: nobody can, it is disarmed;
    // an answer bound to it by hand is late as superseded.
    let late = approval::decide(
        &mut store,
        &d.config,
        &id,
        approval::Answer {
            card: Some(&old_hall),
            ..approval::Answer::new(&Clock::system(), approval::Verdict::Approved, "cli:op", "")
        },
    )
    .await
    .unwrap();
    assert!(
        matches!(late, approval::Outcome::Late(approval::Late::Superseded)),
        "{late:?}"
    );
    react_on_hall(&d, &new_hall, "✅", "boss");
    let sent = first_sent(&d).await;
    assert_eq!(sent.content, "the final text");
}

/// Under a quorum of two across the fan-out, a person counts once whichever
/// surfaces they answer on; a second person makes two. Each surface's
/// ingest is a password of its own, so two console surfaces can meet a
/// quorum of two without `trust_surfaces` (which the config refuses with
/// two surfaces of one type: either password answers as anyone of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_person_on_two_surfaces_counts_once_toward_a_quorum() {
    let trusting = Setup::approval(3600)
        .approvers(&["console:boss", "console:carol"])
        .approval_key("quorum = 2")
        .approval_key("trust_surfaces = true")
        .approval_key("also = [{ notify = \"hall\", notify_channel = \"floor\" }]")
        .with("[bridges.hall]\ntype = \"console\"\ndestinations = [\"floor\"]\noutput = \"/o\"\ninput = \"/i\"\n\n[people.boss]\nidentities = [\"console:boss\"]\n\n[people.carol]\nidentities = [\"console:carol\"]\n")
        .toml()
        .replace("{dir}", "/tmp");
    let refused = broker::config::Config::parse(&format!(
        "[redis]\nurl = \"redis://127.0.0.1:1\"\n{trusting}"
    ))
    .expect_err("two console surfaces with trust_surfaces");
    assert!(
        refused
            .to_string()
            .contains("bridges.mail.approval.trust_surfaces"),
        "{refused}"
    );
    let d = fanned_out(
        Setup::approval(3600)
            .approvers(&["console:boss", "console:carol"])
            .approval_key("quorum = 2")
            .with("[people.boss]\nidentities = [\"console:boss\"]\n\n[people.carol]\nidentities = [\"console:carol\"]\n"),
    );
    let _services = services(&d);
    agent_sends(&d, "needs two", "r1").await;
    let (id, desk_card) = notification(&d, 0).await;
    let (_, hall_card) = hall_card(&d, 0).await;
    react(&d, &desk_card, "✅", "boss", "");
    wait_until("boss's approval counted", SOON, || async {
        trail(&d)
            .await
            .into_iter()
            .any(|e| e["event"] == "answered" && e["by"] == "console:boss")
            .then_some(())
    })
    .await;
    // Again on hall: the same person, not counted again.
    react_on_hall(&d, &hall_card, "✅", "boss");
    wait_until(
        "boss's second approval refused as counted",
        SOON,
        || async {
            trail(&d)
                .await
                .into_iter()
                .any(|e| e["event"] == "ignored" && e["by"] == "console:boss")
                .then_some(())
        },
    )
    .await;
    let record = hash(&mut d.store().await, &keys::approval(&id)).await;
    assert_eq!(record["status"], "pending", "one person is one approval");
    assert!(d.delivered("mail.out").is_empty());
    react_on_hall(&d, &hall_card, "✅", "carol");
    let sent = first_sent(&d).await;
    assert_eq!(sent.content, "needs two");
    let record = hash(&mut d.store().await, &keys::approval(&id)).await;
    assert_eq!(record["approval_people"].lines().count(), 2);
}

/// A surface's password can write every card field of the records it shows
/// (Redis ACLs do not reach inside a hash): hall's, compromised, points
/// desk's card at another channel on desk's allow-list and wipes its
/// progress. The sweep finds desk's notification again (it is still in
/// desk's outbox, bound to the channel the config names); desk shows
/// nothing anywhere else, and the approval still decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_surface_cannot_send_another_surfaces_card_elsewhere() {
    let d = fanned_out(Setup::approval(3600).desk_destinations(&["ops", "general"]));
    let timing = broker::timing::Timing {
        sweep_every: std::time::Duration::from_millis(100),
        ..Default::default()
    };
    let _services = [
        d.run_timed::<console::Console>(broker::config::Service::Outbox, "mail", timing),
        d.spawn("outbox", "desk"),
        d.spawn("ingest", "desk"),
        d.spawn("outbox", "hall"),
        d.spawn("ingest", "hall"),
    ];
    agent_sends(&d, "for ops only", "r1").await;
    let (id, _) = notification(&d, 0).await;
    let (_, hall) = hall_card(&d, 0).await;
    let mut store = d.store().await;
    let key = keys::approval(&id);
    let _: () = redis::cmd("HSET")
        .arg(&key)
        .arg("notify_channel")
        .arg("general")
        .query_async(&mut store.conn)
        .await
        .unwrap();
    let _: () = redis::cmd("HDEL")
        .arg(&key)
        .arg(&["notified", "notify_entry", "notify_external_id"])
        .query_async(&mut store.conn)
        .await
        .unwrap();
    // The sweep's repair: the notification found again and noted.
    wait_until("desk's notification noted again by the sweep", SOON, || {
        let (mut store, key) = (store.clone(), key.clone());
        async move {
            hash(&mut store, &key)
                .await
                .contains_key("notified")
                .then_some(())
        }
    })
    .await;
    react_on_hall(&d, &hall, "✅", "boss");
    assert_eq!(first_sent(&d).await.content, "for ops only");
    // Desk took and handled everything, its outcome included.
    wait_until("desk's outbox all handled", SOON, || async {
        let mut store = d.store().await;
        let desk = keys::outbox("desk");
        let groups: redis::streams::StreamInfoGroupsReply =
            redis::AsyncCommands::xinfo_groups(&mut store.conn, &desk)
                .await
                .unwrap();
        let last: Vec<String> = stream_ids(&mut store, &desk).await;
        let group = groups.groups.first()?;
        let told = stream(&mut store, &desk)
            .await
            .iter()
            .any(|e| e.get("approval_outcome").map(String::as_str) == Some("approved"));
        (told && group.pending == 0 && last.last() == Some(&group.last_delivered_id)).then_some(())
    })
    .await;
    let channels: Vec<String> = d
        .delivered("desk.out")
        .into_iter()
        .map(|l| l.channel_id)
        .collect();
    assert!(
        channels.iter().all(|c| c == "ops"),
        "desk showed a card off its configured channel: {channels:?}"
    );
}

/// The ids of every entry of stream `key`, in order.
async fn stream_ids(store: &mut harness::TestStore, key: &str) -> Vec<String> {
    let reply: redis::streams::StreamRangeReply =
        redis::AsyncCommands::xrange_all(&mut store.conn, key)
            .await
            .unwrap();
    reply.ids.into_iter().map(|e| e.id).collect()
}

/// hall's password (compromised) wipes desk's card from the record, so an
/// edit cannot list it as superseded and it stays in desk's card map. A ✅
/// on it still answers for the version it shows (its map entry, which only
/// desk writes, says which): late, never an approval of the edited text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_card_answers_only_for_the_version_it_shows() {
    let d = fanned_out(Setup::approval(3600));
    let _services = services(&d);
    agent_sends(&d, "what boss saw", "r1").await;
    let (id, desk_card) = notification(&d, 0).await;
    hall_card(&d, 0).await;
    let mut store = d.store().await;
    let key = keys::approval(&id);
    let _: () = redis::cmd("HDEL")
        .arg(&key)
        .arg("notify_external_id")
        .query_async(&mut store.conn)
        .await
        .unwrap();
    edit_as(&d, &id, "what boss never saw", "cli:op").await;
    assert!(
        map_of(&d, "desk").await.contains_key(&desk_card),
        "the wiped card stays armed (the edit could not find it)"
    );
    react(&d, &desk_card, "✅", "boss", "");
    wait_until(
        "boss's answer to the old card refused as late",
        SOON,
        || async {
            trail(&d)
                .await
                .into_iter()
                .any(|e| {
                    e["event"] == "ignored"
                        && e["by"] == "console:boss"
                        && e.get("why").is_some_and(|w| w.contains("edited"))
                })
                .then_some(())
        },
    )
    .await;
    assert_eq!(hash(&mut store, &key).await["status"], "pending");
    assert!(d.delivered("mail.out").is_empty(), "nothing sent");
}
