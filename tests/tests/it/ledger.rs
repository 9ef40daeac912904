//! The approval ledger: the audit trail, quorum, review and reconciling
//! uncertain deliveries, on a real Redis with console bridges.

use broker::audit::{self, Entry, Filter};
use broker::{approval, keys, Clock};
use harness::setup::Setup;
use harness::{hash, wait_until, Deployment};

use crate::approval::{
    agent_sends, approval_services, approve_directly, first_sent, inbox_notices, notification,
    notification_written, react,
};
use crate::{approval_config, SOON};

/// The trail of one approval, oldest first.
async fn history(d: &Deployment, id: &str) -> Vec<Entry> {
    let mut store = d.store().await;
    let filter = Filter {
        approval: Some(id.to_string()),
        ..Filter::default()
    };
    audit::query(&mut store, &d.config, &filter).await.unwrap()
}

fn events(h: &[Entry]) -> Vec<&str> {
    h.iter().map(|e| e.event.as_str()).collect()
}

/// Waits until approval `id`'s trail holds `n` entries.
async fn history_of_len(d: &Deployment, id: &str, n: usize) -> Vec<Entry> {
    wait_until(&format!("{n} audit entries for {id}"), SOON, || async {
        let h = history(d, id).await;
        (h.len() >= n).then_some(h)
    })
    .await
}

async fn record_gone(d: &Deployment, id: &str) {
    let store = d.store().await;
    wait_until("the record is deleted", SOON, || {
        let mut store = store.clone();
        async move {
            hash(&mut store, &keys::approval(id))
                .await
                .is_empty()
                .then_some(())
        }
    })
    .await;
}

/// An approved and a rejected approval leave their whole history, in order,
/// with who and the digest, after their records are gone; a stranger's answer
/// is in it as ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trail_of_approved_and_rejected_approvals_outlives_the_records() {
    let d = Deployment::new(&approval_config(3600));
    let services = [
        d.spawn("outbox", "mail"),
        d.spawn("outbox", "desk"),
        d.spawn("ingest", "desk"),
    ];
    let first = agent_sends(&d, "ship it", "r1").await;
    let (yes, yes_card) = notification(&d, 0).await;
    agent_sends(&d, "drop it", "r2").await;
    let (no, no_card) = notification(&d, 1).await;
    let parked_digest =
        hash(&mut d.store().await, &keys::approval(&yes)).await["message_sha256"].clone();

    react(&d, &yes_card, "✅", "eve", "");
    history_of_len(&d, &yes, 3).await;
    react(&d, &yes_card, "✅", "boss", "");
    react(&d, &no_card, "❌", "boss", "not today");
    wait_until("the approved message is sent", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    record_gone(&d, &yes).await;
    record_gone(&d, &no).await;

    let h = history_of_len(&d, &yes, 6).await;
    assert_eq!(
        events(&h),
        [
            "parked",
            "notified",
            "ignored",
            "answered",
            "decided",
            "delivered"
        ],
        "{h:#?}"
    );
    assert_eq!(h[0].get("agent"), Some("ann"));
    assert_eq!(h[0].get("entry_id"), Some(first.as_str()));
    assert_eq!(h[0].get("destination"), Some("bob@example.org"));
    assert_eq!(h[0].get("digest"), Some(parked_digest.as_str()));
    assert_eq!(h[1].get("notify"), Some("desk"));
    assert_eq!(h[1].get("external_id"), Some(yes_card.as_str()));
    assert_eq!(h[2].get("by"), Some("console:eve"));
    assert_eq!(h[2].get("why"), Some("not an approver"));
    assert_eq!(h[3].get("by"), Some("console:boss"));
    assert_eq!(h[4].get("verdict"), Some("approved"));
    assert_eq!(h[4].get("digest"), Some(parked_digest.as_str()));
    assert_eq!(
        h[5].get("digest"),
        Some(parked_digest.as_str()),
        "what went out is what was approved"
    );
    assert_eq!(
        h[5].get("external_id"),
        Some(d.delivered("mail.out")[0].external_id.as_str())
    );

    let h = history_of_len(&d, &no, 4).await;
    assert_eq!(
        events(&h),
        ["parked", "notified", "answered", "decided"],
        "{h:#?}"
    );
    assert_eq!(h[3].get("verdict"), Some("rejected"));
    assert_eq!(h[3].get("reason"), Some("not today"));

    // The CLI shows the same history, as text and as JSON lines.
    let out = d.cowboy(&["approvals", "show", &yes]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        text.contains("the record is gone") && text.contains("delivered"),
        "{text}"
    );
    let out = d.cowboy(&["audit", "--approval", &no[..8], "--json"]);
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert_eq!(lines[3]["fields"]["reason"], "not today");
    let out = d.cowboy(&["audit", "--agent", "ann"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 10, "both approvals of ann:\n{text}");
    for s in services {
        s.stop().await.unwrap();
    }
}

/// An expired approval's trail says so, and an answer after the deadline is
/// in it as ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trail_of_an_expired_approval_shows_the_late_answer() {
    let d = Deployment::new(&approval_config(3));
    let desk = d.spawn("outbox", "desk");
    let outbox = d.spawn("outbox", "mail");
    agent_sends(&d, "too slow", "r").await;
    let (id, card) = notification(&d, 0).await;
    history_of_len(&d, &id, 2).await;
    outbox.crash();
    let mut store = d.store().await;
    let expires: f64 = hash(&mut store, &keys::approval(&id)).await["expires_at"]
        .parse()
        .unwrap();
    // Stamped well past the deadline (its own clock), so after the expiry too.
    let after = broker::Clock::starting_at(expires + 30.0);
    let answer = approval::Answer::new(&after, approval::Verdict::Approved, "console:boss", "");
    let outcome = approval::resolve_approval(&mut store, &d.config, "desk", &card, answer)
        .await
        .unwrap();
    assert_eq!(outcome, approval::Outcome::Late(approval::Late::Expired));
    let outbox = d.spawn("outbox", "mail");
    record_gone(&d, &id).await;
    let h = history_of_len(&d, &id, 4).await;
    assert_eq!(
        events(&h),
        ["parked", "notified", "expired", "ignored"],
        "{h:#?}"
    );
    assert_eq!(h[3].get("why"), Some("late: expired"));
    assert_eq!(h[3].get("by"), Some("console:boss"));
    outbox.stop().await.unwrap();
    desk.stop().await.unwrap();
}

/// Appends trim what is older than `audit.retention_days` behind them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_trims_old_audit_entries() {
    let d = Deployment::new(&format!(
        "[audit]\nretention_days = 90\n{}",
        approval_config(3600)
    ));
    let mut store = d.store().await;
    let now = broker::now_secs_f64();
    let event = |at: f64| audit::Event::new("mail", audit::Kind::Parked, "a", at);
    audit::append(&mut store, &d.config, &[event(now), event(now)])
        .await
        .unwrap();
    // 89 days on, both are kept.
    audit::append(&mut store, &d.config, &[event(now + 89.0 * 86_400.0)])
        .await
        .unwrap();
    let trail = keys::audit("mail");
    assert_eq!(harness::stream(&mut store, &trail).await.len(), 3);
    // 91 days on, the first two are more than 90 days old; the third is not.
    audit::append(&mut store, &d.config, &[event(now + 91.0 * 86_400.0)])
        .await
        .unwrap();
    let kept = harness::stream(&mut store, &trail).await;
    assert_eq!(kept.len(), 2, "{kept:?}");
    assert!(kept[0]["at"].parse::<f64>().unwrap() > now + 88.0 * 86_400.0);
}

/// The people behind the approvers of the quorum tests: boss answers on two
/// surfaces (two console names), amy and carl on one.
const QUORUM_PEOPLE: &str = "\n[people.boss]\nidentities = [\"console:boss\", \"console:bigboss\"]\n\n[people.amy]\nidentities = [\"console:amy\"]\n\n[people.carl]\nidentities = [\"console:carl\"]\n";

/// A deployment whose `mail` needs two of `approvers` (the people of
/// [`QUORUM_PEOPLE`]), with mail's and desk's outboxes and desk's ingest running.
fn quorum_of_two(approvers: &[&str]) -> (Deployment, [harness::Running; 3]) {
    let config = Setup::approval(3600)
        .approvers(approvers)
        .approval_key("quorum = 2")
        .approval_key("trust_surfaces = true")
        .with(QUORUM_PEOPLE)
        .toml();
    let d = Deployment::new(&config);
    let services = [
        d.spawn("outbox", "mail"),
        d.spawn("outbox", "desk"),
        d.spawn("ingest", "desk"),
    ];
    (d, services)
}

/// A count of approvals is told to the agent whose outbox the entry is in
/// (taken from the record's stream, one its bridge reads), not to an agent
/// a writer of the record names in its `agent` field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_is_told_to_the_agent_whose_entry_it_is() {
    let (d, services) = quorum_of_two(&["console:boss", "console:amy"]);
    let mut store = d.store().await;
    store
        .xadd(
            &keys::agent_outbox("ann", "mail"),
            &[
                ("channel_id", b"bob@example.org".as_slice()),
                ("content", b"after lunch"),
                ("notices", b"all"),
            ],
        )
        .await
        .unwrap();
    let (id, external) = notification(&d, 0).await;
    harness::write_record(&mut store, &id, &[("agent", "bea")]).await;
    react(&d, &external, "✅", "boss", "");
    let ann = keys::agent_inbox("ann", "mail");
    wait_until("ann told of one approval of two", SOON, || async {
        inbox_notices(&d, &ann)
            .await
            .iter()
            .any(|n| n.get("reason").is_some_and(|r| r.contains("1 of 2")))
            .then_some(())
    })
    .await;
    assert!(
        inbox_notices(&d, &keys::agent_inbox("bea", "mail"))
            .await
            .is_empty(),
        "nothing for the agent the record names"
    );
    for s in services {
        s.stop().await.unwrap();
    }
}

/// The last card shown for approval `id` (a new one after each edit), once
/// there are `n` cards for it.
async fn card_of(d: &Deployment, id: &str, n: usize) -> String {
    let card = wait_until(&format!("card {n} of {id}"), SOON, || async {
        let cards: Vec<String> = d
            .delivered("desk.out")
            .into_iter()
            .filter(|l| l.approval_id.as_deref() == Some(id))
            .map(|l| l.external_id)
            .collect();
        (cards.len() >= n).then(|| cards[n - 1].clone())
    })
    .await;
    // Shown is not yet answerable: its map entry follows (with the batch).
    wait_until(&format!("card {n} of {id} answerable"), SOON, || async {
        let map = hash(&mut d.store().await, &keys::approval_map("desk")).await;
        map.contains_key(&card).then_some(())
    })
    .await;
    card
}

/// Approver `console:boss` replaces approval `id`'s content, from the version
/// it has now.
async fn edit_as_boss(d: &Deployment, id: &str, content: &str) {
    edit_as(d, id, content, "console:boss").await;
}

/// Approver `editor` replaces approval `id`'s content, from the version it
/// has now.
pub(crate) async fn edit_as(d: &Deployment, id: &str, content: &str, editor: &str) {
    let mut store = d.store().await;
    let digest = hash(&mut store, &keys::approval(id)).await["message_sha256"].clone();
    let change = approval::edit::Change {
        content: Some(content.into()),
        seen: Some(digest),
        ..Default::default()
    };
    approval::edit::edit(&mut store, &d.config, &Clock::system(), id, &change, editor)
        .await
        .unwrap();
}

/// A quorum counts people: boss approving as `console:boss` and again as
/// `console:bigboss` is one approval. Under a quorum the editor proposes and
/// others dispose: boss edits, boss's approval of the edit is not counted,
/// amy's and carl's are, and the edited version is sent once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_person_counts_once_and_an_editor_does_not_count() {
    let (d, services) = quorum_of_two(&[
        "console:boss",
        "console:bigboss",
        "console:amy",
        "console:carl",
    ]);
    agent_sends(&d, "the secret is hunter2", "r1").await;
    let (id, card) = notification(&d, 0).await;
    react(&d, &card, "✅", "boss", "");
    react(&d, &card, "✅", "bigboss", "");
    let h = history_of_len(&d, &id, 4).await;
    assert_eq!(h[2].get("count"), Some("1/2"), "{h:#?}");
    assert_eq!(h[3].get("by"), Some("console:bigboss"), "{h:#?}");
    assert_eq!(h[3].get("why"), Some("already counted for this approver"));
    let mut store = d.store().await;
    assert_eq!(
        hash(&mut store, &keys::approval(&id)).await["status"],
        "pending"
    );

    // boss edits: the counted approval is revoked, and boss proposes only.
    edit_as_boss(&d, &id, "the secret is [redacted]").await;
    let card = card_of(&d, &id, 2).await;
    // Answerable once recorded as shown (its map entry and `notified` go together).
    let h = history_of_len(&d, &id, 6).await;
    assert_eq!(events(&h)[4..], ["edited", "notified"], "{h:#?}");
    react(&d, &card, "✅", "bigboss", "");
    let h = history_of_len(&d, &id, 7).await;
    assert_eq!(h[6].get("by"), Some("console:bigboss"), "{h:#?}");
    assert!(h[6].get("why").unwrap().contains("editor"), "{h:#?}");
    react(&d, &card, "✅", "amy", "");
    history_of_len(&d, &id, 8).await;
    assert!(
        d.delivered("mail.out").is_empty(),
        "the editor and one other are not two"
    );
    react(&d, &card, "✅", "carl", "");
    let sent = wait_until("the edited message is sent", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    assert_eq!(sent.content, "the secret is [redacted]");
    for s in services {
        s.stop().await.unwrap();
    }
    assert_eq!(d.delivered("mail.out").len(), 1);
}

/// One service password counts once: boss and amy both answer through desk's
/// ingest, whose one password could report them both, so under a quorum
/// (and without `trust_surfaces`) amy's approval is not counted; operator
/// op, proven by a Redis user of its own, completes the quorum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_surface_password_counts_once_under_a_quorum() {
    let config = Setup::approval(3600)
        .approvers(&["console:boss", "console:amy", "cli:op"])
        .approval_key("quorum = 2")
        .with(QUORUM_PEOPLE)
        .with("[people.op]\nidentities = [\"cli:op\"]\n\n[operators.op]\npassword_file = \"{dir}/op\"\n")
        .toml();
    let d = Deployment::new(&config);
    let services = approval_services(&d);
    agent_sends(&d, "two passwords", "r1").await;
    let (id, card) = notification(&d, 0).await;
    react(&d, &card, "✅", "boss", "");
    react(&d, &card, "✅", "amy", "");
    let h = history_of_len(&d, &id, 4).await;
    assert_eq!(h[2].get("count"), Some("1/2"), "{h:#?}");
    assert_eq!(h[3].get("by"), Some("console:amy"), "{h:#?}");
    assert!(
        h[3].get("why")
            .unwrap()
            .contains("one service password counts once"),
        "{h:#?}"
    );
    let mut store = d.store().await;
    assert_eq!(
        hash(&mut store, &keys::approval(&id)).await["status"],
        "pending"
    );
    assert!(d.delivered("mail.out").is_empty());
    approve_directly(&d, &id, "cli:op").await;
    assert_eq!(first_sent(&d).await.content, "two passwords");
    for s in services {
        s.stop().await.unwrap();
    }
}

/// The count so far is sealed: a password that writes records (a surface's
/// outbox) adding a person to it does not make one genuine approval meet a
/// quorum of two; the answer is ignored as a record changed outside the
/// broker. Put right, two genuine approvals send it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_count_meets_no_quorum() {
    let (d, services) = quorum_of_two(&["console:boss", "console:amy"]);
    agent_sends(&d, "count me", "r1").await;
    let (id, card) = notification(&d, 0).await;
    let mut store = d.store().await;
    let rec = keys::approval(&id);
    let _: () = redis::AsyncCommands::hset(&mut store.conn, &rec, "approval_people", "person:amy")
        .await
        .unwrap();
    react(&d, &card, "✅", "boss", "");
    let h = history_of_len(&d, &id, 3).await;
    assert!(
        h[2].get("why")
            .is_some_and(|w| w.contains("changed outside the broker")),
        "{h:#?}"
    );
    assert_eq!(hash(&mut store, &rec).await["status"], "pending");
    let _: () = redis::AsyncCommands::hdel(&mut store.conn, &rec, "approval_people")
        .await
        .unwrap();
    react(&d, &card, "✅", "boss", "");
    history_of_len(&d, &id, 4).await;
    assert!(d.delivered("mail.out").is_empty(), "one approval of two");
    react(&d, &card, "✅", "amy", "");
    assert_eq!(first_sent(&d).await.content, "count me");
    for s in services {
        s.stop().await.unwrap();
    }
    assert_eq!(d.delivered("mail.out").len(), 1);
}

/// What a password that writes records (a surface's outbox) could bring back
/// after an edit decides nothing: amy's approval of the first version,
/// restored with its genuine seal beside the edited version, does not count
/// toward the edit (the count is sealed with the version it was made for);
/// and boss, who edited, does not count once the list of editors is
/// shortened (it is sealed with the version). Put right, carl's and amy's
/// approvals of the edit send it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_or_an_editor_list_from_outside_the_broker_decides_nothing() {
    let (d, services) = quorum_of_two(&["console:boss", "console:amy", "console:carl"]);
    agent_sends(&d, "first version", "r1").await;
    let (id, card) = notification(&d, 0).await;
    let mut store = d.store().await;
    let rec = keys::approval(&id);
    react(&d, &card, "✅", "amy", "");
    history_of_len(&d, &id, 3).await;
    let before = hash(&mut store, &rec).await;
    assert_eq!(before["approval_people"], "person:amy", "{before:?}");
    edit_as_boss(&d, &id, "second version").await;
    let card = card_of(&d, &id, 2).await;
    let restore = |fields: &[&str]| {
        let mut conn = store.conn.clone();
        let pairs: Vec<(String, String)> = fields
            .iter()
            .map(|f| (f.to_string(), before.get(*f).cloned().unwrap_or_default()))
            .collect();
        let rec = rec.clone();
        async move {
            let _: () = redis::AsyncCommands::hset_multiple(&mut conn, &rec, &pairs)
                .await
                .unwrap();
        }
    };
    const COUNT: [&str; 4] = [
        "approvals",
        "approval_people",
        "approval_proofs",
        "count_seal",
    ];
    restore(&COUNT).await;
    react(&d, &card, "✅", "carl", "");
    let tampered = |h: &[Entry]| {
        h.iter()
            .filter(|e| {
                e.get("why")
                    .is_some_and(|w| w.contains("changed outside the broker"))
            })
            .count()
    };
    let h = wait_until("carl's answer ignored", SOON, || async {
        let h = history(&d, &id).await;
        (tampered(&h) == 1).then_some(h)
    })
    .await;
    assert_eq!(hash(&mut store, &rec).await["status"], "pending", "{h:#?}");
    // The editor's name taken off the list: boss's approval is not counted.
    let mut conn = store.conn.clone();
    let _: () = redis::AsyncCommands::hdel(&mut conn, &rec, &COUNT)
        .await
        .unwrap();
    let editors = hash(&mut store, &rec).await["editors"].clone();
    assert_eq!(editors, "person:boss");
    let _: () = redis::AsyncCommands::hset(&mut conn, &rec, "editors", "")
        .await
        .unwrap();
    react(&d, &card, "✅", "boss", "");
    wait_until("boss's answer ignored", SOON, || async {
        let h = history(&d, &id).await;
        (tampered(&h) == 2).then_some(())
    })
    .await;
    assert_eq!(hash(&mut store, &rec).await["status"], "pending");
    assert!(d.delivered("mail.out").is_empty(), "nothing sent");
    let _: () = redis::AsyncCommands::hset(&mut conn, &rec, "editors", &editors)
        .await
        .unwrap();
    react(&d, &card, "✅", "carl", "");
    react(&d, &card, "✅", "amy", "");
    assert_eq!(first_sent(&d).await.content, "second version");
    for s in services {
        s.stop().await.unwrap();
    }
    assert_eq!(d.delivered("mail.out").len(), 1);
}

/// A count brought back after an edit chain returned to the same text does
/// not count (the count is sealed with the revision), and neither does a
/// forged list of who approved (it is sealed with the count): in both cases
/// the next answer is ignored as a record changed outside the broker, named
/// by the seal that failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_from_an_earlier_revision_or_with_forged_names_decides_nothing() {
    let (d, services) = quorum_of_two(&["console:boss", "console:amy", "console:carl"]);
    agent_sends(&d, "the text", "r1").await;
    let (id, card) = notification(&d, 0).await;
    let mut store = d.store().await;
    let rec = keys::approval(&id);
    react(&d, &card, "✅", "amy", "");
    history_of_len(&d, &id, 3).await;
    let before = hash(&mut store, &rec).await;
    let mut conn = store.conn.clone();
    let _: () = redis::AsyncCommands::hset(&mut conn, &rec, "approvals", "console:boss")
        .await
        .unwrap();
    react(&d, &card, "✅", "carl", "");
    let why = |n: usize| {
        let d = &d;
        let id = id.clone();
        async move {
            let h = wait_until("an answer ignored", SOON, || async {
                let h = history(d, &id).await;
                let ignored: Vec<String> = h
                    .iter()
                    .filter_map(|e| e.get("why"))
                    .filter(|w| w.contains("changed outside the broker"))
                    .map(str::to_string)
                    .collect();
                (ignored.len() >= n).then_some(ignored)
            })
            .await;
            h[n - 1].clone()
        }
    };
    assert!(why(1).await.contains("its count seal"));
    let _: () = redis::AsyncCommands::hset(&mut conn, &rec, "approvals", &before["approvals"])
        .await
        .unwrap();
    edit_as_boss(&d, &id, "other text").await;
    edit_as_boss(&d, &id, "the text").await;
    let card = card_of(&d, &id, 3).await;
    assert_eq!(
        hash(&mut store, &rec).await["message_sha256"],
        before["message_sha256"]
    );
    let count = [
        "approvals",
        "approval_people",
        "approval_proofs",
        "count_seal",
    ];
    let pairs: Vec<(&str, &str)> = count.iter().map(|f| (*f, before[*f].as_str())).collect();
    let _: () = redis::AsyncCommands::hset_multiple(&mut conn, &rec, &pairs)
        .await
        .unwrap();
    react(&d, &card, "✅", "carl", "");
    assert!(why(2).await.contains("its count seal"));
    assert_eq!(hash(&mut store, &rec).await["status"], "pending");
    assert!(d.delivered("mail.out").is_empty(), "nothing sent");
    for s in services {
        s.stop().await.unwrap();
    }
}

/// The decision step decides only on the state its caller verified against
/// the seals: a quorum lowered, an editor taken off the list or a deadline
/// moved between the check and the step makes it answer `stale` (and
/// `decide` reads the record again), so a writer racing the check gains
/// nothing. Put back, the same step counts the approval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_decision_step_decides_only_on_what_was_verified() {
    let (d, services) = quorum_of_two(&["console:boss", "console:amy"]);
    agent_sends(&d, "race me", "r1").await;
    let (id, _) = notification(&d, 0).await;
    let mut store = d.store().await;
    let rec = keys::approval(&id);
    let record = approval::Approvals::on(&mut store)
        .load(&id)
        .await
        .unwrap()
        .unwrap();
    let count = approval::Count {
        tally: approval::Tally::of(&record),
        quorum: record.quorum.to_string(),
        editors: record.editors.clone(),
        expires_at: record.expires_at.to_string(),
        next_seal: "seal".into(),
    };
    let mut answer = approval::Answer::new(
        &Clock::system(),
        approval::Verdict::Approved,
        "console:boss",
        "",
    );
    answer.seen = Some(&record.message_sha256);
    answer.counts_as = Some("person:boss");
    let mut conn = store.conn.clone();
    for (field, forged) in [
        ("quorum", "1"),
        ("editors", ""),
        ("expires_at", "4102444800"),
    ] {
        let genuine = hash(&mut store, &rec).await.get(field).cloned();
        let _: () = redis::AsyncCommands::hset(&mut conn, &rec, field, forged)
            .await
            .unwrap();
        if field == "editors" {
            // Verified with boss as an editor; the step finds the list emptied.
            let mut c = count.clone();
            c.editors = "person:boss".into();
            let d = approval::Approvals::on(&mut store)
                .decide(&id, &answer, "seal", &c)
                .await
                .unwrap();
            assert_eq!(d.answer, approval::Decided::Stale, "{field}");
        } else {
            let d = approval::Approvals::on(&mut store)
                .decide(&id, &answer, "seal", &count)
                .await
                .unwrap();
            assert_eq!(d.answer, approval::Decided::Stale, "{field}");
        }
        match genuine {
            Some(v) => redis::AsyncCommands::hset::<_, _, _, ()>(&mut conn, &rec, field, v)
                .await
                .unwrap(),
            None => redis::AsyncCommands::hdel::<_, _, ()>(&mut conn, &rec, field)
                .await
                .unwrap(),
        }
    }
    assert_eq!(hash(&mut store, &rec).await["status"], "pending");
    let d2 = approval::Approvals::on(&mut store)
        .decide(&id, &answer, "seal", &count)
        .await
        .unwrap();
    assert_eq!(d2.answer, approval::Decided::Counted { again: false });
    for s in services {
        s.stop().await.unwrap();
    }
}

/// Quorum 2: one approval sends nothing, the same approver twice counts once,
/// a second approver sends once; one rejection rejects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_needs_distinct_approvers_and_one_rejection_rejects() {
    let (d, services) = quorum_of_two(&["console:boss", "console:amy"]);
    agent_sends(&d, "two keys", "r1").await;
    let (id, card) = notification(&d, 0).await;
    assert!(
        d.delivered("desk.out")[0]
            .content
            .contains("2 different approvers must approve"),
        "the card says a quorum is needed"
    );
    react(&d, &card, "✅", "boss", "");
    react(&d, &card, "✅", "boss", "");
    let h = history_of_len(&d, &id, 4).await;
    assert_eq!(
        events(&h),
        ["parked", "notified", "answered", "ignored"],
        "{h:#?}"
    );
    assert_eq!(h[2].get("count"), Some("1/2"));
    assert_eq!(h[3].get("why"), Some("already counted for this approver"));
    let mut store = d.store().await;
    let record = hash(&mut store, &keys::approval(&id)).await;
    assert_eq!(record["status"], "pending");
    assert_eq!(record["approvals"], "console:boss");
    assert!(
        d.delivered("mail.out").is_empty(),
        "one approval sends nothing"
    );
    let out = d.cowboy(&["approvals", "show", &id]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1 of 2 approvals (console:boss)"),
        "{out:?}"
    );

    react(&d, &card, "✅", "amy", "");
    wait_until("the message is sent", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    record_gone(&d, &id).await;
    let h = history_of_len(&d, &id, 7).await;
    assert_eq!(h[5].get("by"), Some("console:boss, console:amy"), "{h:#?}");

    agent_sends(&d, "one says no", "r2").await;
    let (second, card) = notification(&d, 1).await;
    react(&d, &card, "✅", "boss", "");
    history_of_len(&d, &second, 3).await;
    react(&d, &card, "❌", "amy", "no");
    let notice = wait_until("a rejection notice", SOON, || async {
        inbox_notices(&d, "ann:mail:inbox").await.into_iter().next()
    })
    .await;
    assert_eq!(notice["status"], "rejected");
    assert_eq!(notice["approver"], "console:amy");
    for s in services {
        s.stop().await.unwrap();
    }
    assert_eq!(
        d.delivered("mail.out").len(),
        1,
        "sent once, and only the first"
    );
}

/// Review on standard input: approve, reject with a reason, skip; the end of
/// the input and an unknown answer decide nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_decides_only_what_the_operator_answers() {
    let d = Deployment::new(&approval_config(3600));
    let services = [d.spawn("outbox", "mail"), d.spawn("outbox", "desk")];
    let mut ids = Vec::new();
    for (i, text) in ["first", "second", "third", "fourth"].iter().enumerate() {
        agent_sends(&d, text, &format!("r{i}")).await;
        ids.push(notification(&d, i).await.0);
    }
    let out = d.cowboy_with_input(
        &["approvals", "review", "--as", "op"],
        "s\nmaybe\na\nr\nnot this one\n",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        text.contains("| first") && text.contains("| fourth"),
        "each shown in full:\n{text}"
    );
    assert!(text.contains("answer a, r, e, s or q"), "{text}");
    assert!(text.contains("end of input"), "{text}");
    let sent = wait_until("the approved one is sent", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    assert_eq!(
        sent.content, "second",
        "skip, then an unknown answer asks again, then approve"
    );
    let notice = wait_until("the rejection notice", SOON, || async {
        inbox_notices(&d, "ann:mail:inbox").await.into_iter().next()
    })
    .await;
    assert_eq!(notice["status"], "rejected");
    assert_eq!(notice["reason"], "not this one");
    let mut store = d.store().await;
    for id in [&ids[0], &ids[3]] {
        assert_eq!(
            hash(&mut store, &keys::approval(id)).await["status"],
            "pending",
            "skipped and unanswered stay pending"
        );
    }
    // Input that ends while a reason is asked for decides nothing either.
    let out = d.cowboy_with_input(&["approvals", "review", "--as", "op"], "r\n");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        hash(&mut store, &keys::approval(&ids[0])).await["status"],
        "pending"
    );
    for s in services {
        s.stop().await.unwrap();
    }
    assert_eq!(d.delivered("mail.out").len(), 1);
}

/// A delivery whose reply was lost is listed until reconciled: `delivered`
/// closes it and sends nothing; `not-delivered` asks again, and the message is
/// sent once after the new approval. Nothing is retried blindly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncertain_deliveries_wait_for_an_operator() {
    let config = Setup::approval(3600).mail("lose_replies = 2").toml();
    let d = Deployment::new(&config);
    let services = [
        d.spawn("outbox", "mail"),
        d.spawn("outbox", "desk"),
        d.spawn("ingest", "desk"),
    ];
    let list = || {
        let out = d.cowboy(&["deliveries", "list"]);
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let uncertain_notices = || async {
        inbox_notices(&d, "ann:mail:inbox")
            .await
            .into_iter()
            .filter(|n| n["status"] == "uncertain")
            .count()
    };

    let first_entry = agent_sends(&d, "did it arrive?", "r1").await;
    let (first, card) = notification(&d, 0).await;
    react(&d, &card, "✅", "boss", "");
    wait_until("an uncertain notice", SOON, || async {
        (uncertain_notices().await == 1).then_some(())
    })
    .await;
    let listed = list();
    let delivery = format!("ann:mail:outbox/{first_entry}");
    assert!(
        listed.contains(&delivery) && listed.contains(&first),
        "{listed}"
    );
    let out = d.cowboy(&[
        "deliveries",
        "reconcile",
        &delivery,
        "--outcome",
        "delivered",
        "--evidence",
        "",
        "--as",
        "op",
    ]);
    assert!(!out.status.success(), "evidence is required");
    let out = d.cowboy(&[
        "deliveries",
        "reconcile",
        &delivery,
        "--outcome",
        "delivered",
        "--evidence",
        "bob confirmed by phone",
        "--as",
        "op",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert!(!list().contains(&delivery), "closed");
    let out = d.cowboy(&[
        "deliveries",
        "reconcile",
        &delivery,
        "--outcome",
        "delivered",
        "--evidence",
        "again",
        "--as",
        "op",
    ]);
    assert!(!out.status.success(), "reconciled once");
    let h = history(&d, &first).await;
    let last = h.last().unwrap();
    assert_eq!(last.event, "reconciled", "{h:#?}");
    assert_eq!(last.get("outcome"), Some("delivered"));
    assert_eq!(last.get("evidence"), Some("bob confirmed by phone"));
    assert_eq!(last.get("by"), Some("cli:op"));
    assert!(events(&h).contains(&"uncertain"));

    // The second is edited by an approver before it is approved: reconciled
    // as not delivered, it is asked again in the approvers' version.
    let second_entry = agent_sends(&d, "try me again", "r2").await;
    let (second, _) = notification(&d, 1).await;
    edit_as_boss(&d, &second, "try me again, corrected").await;
    let card = card_of(&d, &second, 2).await;
    history_of_len(&d, &second, 4).await; // parked, notified, edited, notified: answerable
    react(&d, &card, "✅", "boss", "");
    wait_until("a second uncertain notice", SOON, || async {
        (uncertain_notices().await == 2).then_some(())
    })
    .await;
    let delivery = format!("ann:mail:outbox/{second_entry}");
    let out = d.cowboy(&[
        "deliveries",
        "reconcile",
        &second_entry,
        "--outcome",
        "not-delivered",
        "--evidence",
        "bounced",
        "--as",
        "op",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert!(!list().contains(&delivery));
    assert!(
        d.delivered("mail.out").is_empty(),
        "reconciling sends nothing by itself"
    );
    let (again, card) = notification(&d, 3).await;
    let shown = d.delivered("desk.out")[3].content.clone();
    assert!(
        shown.contains("| try me again, corrected"),
        "asked again in the approvers' version: {shown}"
    );
    assert!(
        shown.contains(&format!("re-send of approval {second}")),
        "the card says what it re-sends: {shown}"
    );
    // The CLI reads the re-send as the message it is (the broker's marks aside).
    let show = d.cowboy(&["approvals", "show", &again]);
    let show = String::from_utf8_lossy(&show.stdout);
    assert!(
        show.contains("| try me again, corrected") && show.contains("matches the approval"),
        "{show}"
    );
    // An agent copying the broker's re-send fields onto its own entry is refused.
    let put_back = harness::stream(&mut d.store().await, &keys::agent_outbox("ann", "mail"))
        .await
        .into_iter()
        .last()
        .unwrap();
    let mut store = d.store().await;
    store
        .xadd(
            &keys::agent_outbox("ann", "mail"),
            &[
                ("channel_id", b"bob@example.org".as_slice()),
                ("content", b"not a re-send".as_slice()),
                ("resend_of", put_back["resend_of"].as_bytes()),
                ("resend_seal", put_back["resend_seal"].as_bytes()),
            ],
        )
        .await
        .unwrap();
    let dead = wait_until("the forged re-send is dead-lettered", SOON, || async {
        let dead = harness::stream(&mut d.store().await, &keys::dead("mail")).await;
        dead.into_iter()
            .find(|e| e.get("field:content").map(String::as_str) == Some("not a re-send"))
    })
    .await;
    assert!(
        dead.get("reason")
            .is_some_and(|r| r.contains("do not verify")),
        "{dead:?}"
    );
    let h = history(&d, &second).await;
    assert_eq!(
        h.last().unwrap().get("next_approval"),
        Some(again.as_str()),
        "the trail leads to the approval it is asked as now: {h:#?}"
    );
    let record = hash(&mut d.store().await, &keys::approval(&again)).await;
    assert_eq!(record["status"], "pending", "asked afresh");
    react(&d, &card, "✅", "boss", "");
    let sent = wait_until("the message is sent", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    assert_eq!(sent.content, "try me again, corrected");
    record_gone(&d, &again).await;
    for s in services {
        s.stop().await.unwrap();
    }
    assert_eq!(d.delivered("mail.out").len(), 1, "sent once");
}

/// `cowboy approvals approve` decides on the record it has just read: an
/// edit landing between that read and the decision makes the answer late,
/// whether or not it names the digest it saw, and nothing is sent until the
/// edited version is approved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_on_a_read_made_before_an_edit_is_late() {
    let d = Deployment::new(&approval_config(3600));
    let services = [d.spawn("outbox", "desk"), d.spawn("outbox", "mail")];
    agent_sends(&d, "helo wrold", "r1").await;
    let (id, _) = notification(&d, 0).await;
    let mut store = d.store().await;
    let before = approval::Approvals::on(&mut store)
        .load(&id)
        .await
        .unwrap()
        .unwrap();
    let out = d.cowboy(&[
        "approvals",
        "edit",
        &id,
        "--content",
        "hello world",
        "--as",
        "op",
    ]);
    assert!(out.status.success(), "{out:?}");
    for seen in [Some(before.message_sha256.as_str()), None] {
        let mut answer = approval::Answer::new(
            &Clock::system(),
            approval::Verdict::Approved,
            "console:boss",
            "",
        );
        answer.seen = seen;
        let outcome = approval::decide_on(&mut store, &d.config, &id, Some(before.clone()), answer)
            .await
            .unwrap();
        assert_eq!(
            outcome,
            approval::Outcome::Late(approval::Late::Superseded),
            "seen {seen:?}"
        );
    }
    let record = hash(&mut store, &keys::approval(&id)).await;
    assert_eq!(record["status"], "pending", "{record:?}");
    assert!(!record.contains_key("approver"), "{record:?}");
    assert!(d.delivered("mail.out").is_empty(), "nothing sent");
    approve_directly(&d, &id, "console:boss").await;
    let sent = first_sent(&d).await;
    assert_eq!(sent.content, "hello world");
    for s in services {
        s.stop().await.unwrap();
    }
}

/// Approved, then edited: nothing goes out until the edited version is
/// approved; an answer to the old card is late; what is sent is the edit, the
/// agent's version is kept beside it, and the agent hears both digests. An edit
/// to a destination outside `destinations`, or by someone not an approver, is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_is_a_new_question_and_is_what_is_sent() {
    let config = approval_config(3600).replacen(
        r#"destinations = ["*"]"#,
        r#"destinations = ["bob@example.org", "team@example.org"]"#,
        1,
    );
    let d = Deployment::new(&config);
    let desk = [d.spawn("outbox", "desk"), d.spawn("ingest", "desk")];
    let mail = d.spawn("outbox", "mail");
    agent_sends(&d, "helo wrold", "r1").await;
    let (id, old_card) = notification(&d, 0).await;
    let mut store = d.store().await;
    let original = hash(&mut store, &keys::approval(&id)).await["message_sha256"].clone();
    mail.stop().await.unwrap();
    // Approved while mail's outbox is down (a surface's answer would wait
    // for it in mail's request stream; the administrator decides directly).
    approve_directly(&d, &id, "console:boss").await;
    wait_until("the approval", SOON, || {
        let mut store = store.clone();
        let id = id.clone();
        async move {
            (hash(&mut store, &keys::approval(&id)).await["status"] == "approved").then_some(())
        }
    })
    .await;

    let refused = d.cowboy(&[
        "approvals",
        "edit",
        &id,
        "--channel",
        "eve@evil.example",
        "--as",
        "op",
    ]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("destinations"),
        "{refused:?}"
    );
    let stranger = d.cowboy(&["approvals", "edit", &id, "--content", "x", "--as", "eve"]);
    assert!(!stranger.status.success(), "only approvers edit");
    let out = d.cowboy(&[
        "approvals",
        "edit",
        &id,
        "--content",
        "hello world",
        "--channel",
        "team@example.org",
        "--as",
        "op",
    ]);
    assert!(out.status.success(), "{out:?}");

    let record = hash(&mut store, &keys::approval(&id)).await;
    assert_eq!(record["status"], "pending", "the approval is revoked");
    assert!(!record.contains_key("approver"));
    assert_eq!(record["original_sha256"], original);
    assert_eq!(record["original_preview"], "helo wrold");
    assert_eq!(record["original_channel_id"], "bob@example.org");
    assert_eq!(record["content_preview"], "hello world");
    let edited = record["message_sha256"].clone();
    assert_ne!(edited, original);

    // The old card's answer comes too late, even one already on its way.
    let answer = approval::Answer::new(
        &broker::Clock::system(),
        approval::Verdict::Approved,
        "console:boss",
        "",
    );
    let late = approval::resolve_approval(&mut store, &d.config, "desk", &old_card, answer)
        .await
        .unwrap();
    assert_eq!(late, approval::Outcome::Unknown, "the old card is disarmed");
    let raced = approval::decide(
        &mut store,
        &d.config,
        &id,
        approval::Answer {
            card: Some(&old_card),
            ..answer
        },
    )
    .await
    .unwrap();
    assert_eq!(raced, approval::Outcome::Late(approval::Late::Superseded));

    let shown = d.cowboy(&["approvals", "show", &id]);
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.contains("| hello world")
            && !shown.contains("| helo wrold")
            && shown.contains("matches the approval"),
        "show presents the version that will be sent:\n{shown}"
    );
    let (again, new_card) = notification(&d, 1).await;
    assert_eq!(again, id);
    let card = &d.delivered("desk.out")[1];
    assert!(
        card.content.contains("| hello world") && card.content.contains("Edited:    by cli:op"),
        "{}",
        card.content
    );
    assert!(card.content.contains(&edited));

    // Restarted, the requester sends nothing on the revoked approval.
    let mail = d.spawn("outbox", "mail");
    agent_sends(&d, "a later one", "r2").await;
    notification(&d, 2).await;
    assert!(
        d.delivered("mail.out").is_empty(),
        "not sent until approved again"
    );
    react(&d, &new_card, "✅", "boss", "");
    let sent = wait_until("the edited message is sent", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    assert_eq!(
        (sent.channel_id.as_str(), sent.content.as_str()),
        ("team@example.org", "hello world")
    );
    let notice = wait_until("the edited notice", SOON, || async {
        inbox_notices(&d, "ann:mail:inbox")
            .await
            .into_iter()
            .find(|n| n["status"] == "edited")
    })
    .await;
    assert_eq!(notice["original_sha256"], original);
    assert_eq!(notice["sent_sha256"], edited);
    record_gone(&d, &id).await;
    let h = history(&d, &id).await;
    let edit = h
        .iter()
        .find(|e| e.event == "edited")
        .expect("an edited event");
    assert_eq!(edit.get("by"), Some("cli:op"));
    assert_eq!(edit.get("old_digest"), Some(original.as_str()));
    assert_eq!(edit.get("digest"), Some(edited.as_str()));
    let sent = h
        .iter()
        .find(|e| e.event == "delivered")
        .expect("delivered");
    assert_eq!(sent.get("digest"), Some(edited.as_str()));
    assert!(
        h.iter()
            .any(|e| e.event == "ignored" && e.get("why").is_some_and(|w| w.contains("edited"))),
        "the raced answer is in the trail: {h:#?}"
    );
    mail.stop().await.unwrap();
    for s in desk {
        s.stop().await.unwrap();
    }
    assert_eq!(d.delivered("mail.out").len(), 1);
}

/// An edit that lands while the old card is still being sent: that card never
/// becomes answerable, so an approval of it cannot send the edited version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_card_still_being_sent_when_an_edit_lands_is_never_answerable() {
    let config = Setup::approval(3600).desk("latency_ms = 1500").toml();
    let d = Deployment::new(&config);
    let services = [
        d.spawn("outbox", "mail"),
        d.spawn("outbox", "desk"),
        d.spawn("ingest", "desk"),
    ];
    agent_sends(&d, "PAY EVE 1000 USD", "r1").await;
    let store = d.store().await;
    let id = wait_until("the card to be claimed and on its way", SOON, || {
        let mut store = store.clone();
        let config = d.config.clone();
        async move {
            let ids = approval::pending_ids(&mut store, &config).await.ok()?;
            let id = ids.first()?.clone();
            let r = hash(&mut store, &keys::approval(&id)).await;
            (r.contains_key("notify_entry") && !r.contains_key("notify_external_id")).then_some(id)
        }
    })
    .await;
    let out = d.cowboy(&[
        "approvals",
        "edit",
        &id,
        "--content",
        "Hi Bob, lunch at noon?",
        "--as",
        "op",
    ]);
    assert!(out.status.success(), "{out:?}");
    let (_, old_card) = notification_written(&d, 0).await;
    let (_, new_card) = notification_written(&d, 1).await;
    assert!(d.delivered("desk.out")[0].content.contains("PAY EVE"));
    let mut store = d.store().await;
    let map = hash(&mut store, &keys::approval_map("desk")).await;
    assert!(
        !map.contains_key(&old_card),
        "the old card is not answerable: {map:?}"
    );
    react(&d, &old_card, "✅", "boss", "");
    react(&d, &new_card, "❌", "boss", "no lunch");
    let notice = wait_until("the rejection", SOON, || async {
        inbox_notices(&d, "ann:mail:inbox").await.into_iter().next()
    })
    .await;
    assert_eq!(
        notice["status"], "rejected",
        "the old card's approval counted for nothing"
    );
    for s in services {
        s.stop().await.unwrap();
    }
    assert!(d.delivered("mail.out").is_empty());
}

/// On a bridge that asks nobody, `not-delivered` puts the entry back for
/// delivery: it is sent once, by the outbox, not by the reconciliation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconciled_delivery_without_approval_goes_back_to_delivery() {
    let config = format!(
        "{}\n[bridges.plain]\ntype = \"console\"\noutput = \"{{dir}}/plain.out\"\ninput = \"{{dir}}/plain.in\"\ndestinations = [\"*\"]\nlose_replies = 1\n",
        approval_config(3600)
    );
    let d = Deployment::new(&config);
    let outbox = d.spawn("outbox", "plain");
    let mut store = d.store().await;
    let entry = store
        .xadd(
            &keys::agent_outbox("ann", "plain"),
            &[("channel_id", b"room" as &[u8]), ("content", b"lost once")],
        )
        .await
        .unwrap();
    wait_until("the uncertain notice", SOON, || async {
        inbox_notices(&d, "ann:plain:inbox")
            .await
            .into_iter()
            .find(|n| n["status"] == "uncertain")
    })
    .await;
    assert!(d.delivered("plain.out").is_empty());
    let out = d.cowboy(&[
        "deliveries",
        "reconcile",
        &entry,
        "--outcome",
        "not-delivered",
        "--evidence",
        "nothing in the room",
        "--as",
        "op",
    ]);
    assert!(out.status.success(), "{out:?}");
    let sent = wait_until("the delivery", SOON, || async {
        d.delivered("plain.out").first().cloned()
    })
    .await;
    assert_eq!(sent.content, "lost once");
    let trail = audit::query(
        &mut store,
        &d.config,
        &Filter {
            bridge: Some("plain".into()),
            ..Filter::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(events(&trail), ["uncertain", "reconciled"], "{trail:#?}");
    outbox.stop().await.unwrap();
    assert_eq!(d.delivered("plain.out").len(), 1, "sent once");
}
