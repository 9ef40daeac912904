//! Consent integrity, tried as an attacker would: forged notifications and
//! outcomes, fields the approver does not see, a frame the agent imitates, and
//! parked entries that vanish. Each test also checks that the genuine flow still
//! works after the attack.

use std::collections::HashMap;

use broker::{approval, keys, Clock};
use harness::setup::Setup;
use harness::TestStore;
use harness::{hash, stream, wait_until, write_record, Deployment, Running};
use serde_json::json;

use crate::approval::{
    agent_sends, approval_services, approve_directly, first_sent, inbox_notices, notification,
    react,
};
use crate::{approval_config, SOON};

async fn dead(store: &mut TestStore, bridge: &str, n: usize) -> Vec<HashMap<String, String>> {
    let key = keys::dead(bridge);
    wait_until(&format!("{n} dead letters on {key}"), SOON, || {
        let mut store = store.clone();
        let key = key.clone();
        async move {
            let d = stream(&mut store, &key).await;
            (d.len() >= n).then_some(d)
        }
    })
    .await
}

/// Agent `agent` asks bridge `mail` to send `text` to x@example.org.
async fn mail_from(store: &TestStore, agent: &str, text: String) -> String {
    let fields = [
        ("channel_id", b"x@example.org".as_slice()),
        ("content", text.as_bytes()),
    ];
    let mut store = store.clone();
    store
        .xadd(&keys::agent_outbox(agent, "mail"), &fields)
        .await
        .unwrap()
}

async fn gone(store: &TestStore, id: &str) {
    wait_until("the record is deleted", SOON, || {
        let mut store = store.clone();
        let key = keys::approval(id);
        async move { hash(&mut store, &key).await.is_empty().then_some(()) }
    })
    .await;
}

fn fields(map: &[(&str, String)]) -> Vec<(String, Vec<u8>)> {
    map.iter()
        .map(|(k, v)| (k.to_string(), v.clone().into_bytes()))
        .collect()
}

async fn xadd(store: &mut TestStore, key: &str, f: &[(String, Vec<u8>)]) -> String {
    let f: Vec<(&str, &[u8])> = f.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect();
    store.xadd(key, &f).await.unwrap()
}

/// Anyone who can write the notify bridge's flat outbox tries to get a card of
/// their own in front of the approver for a real pending approval: a random id,
/// the real id with other content and destination, an exact copy of the genuine
/// notification, the genuine fields plus one, the genuine fields with a frame
/// of its own, the genuine bytes under other field names (same digest), the
/// genuine fields with other values in `approval_frame`, the genuine fields
/// with a content of their own (beside them when the genuine notification
/// has none, the message fitting in the record's preview; in place of its
/// copy when it has one). Each is dead-lettered, nothing is shown, the map
/// holds only the genuine card, and approving that card sends the real
/// message once. For both layouts of a genuine notification.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_notifications_are_refused_and_show_nothing() {
    forgeries_are_refused("wire 50k EUR to the usual account").await;
}

/// The same for a message longer than the record's preview: its
/// notification carries its own copy of the content.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_notifications_of_a_long_message_are_refused_and_show_nothing() {
    forgeries_are_refused(&format!(
        "wire 50k EUR to the usual account {}",
        "x".repeat(200)
    ))
    .await;
}

async fn forgeries_are_refused(content: &str) {
    let d = Deployment::new(
        &Setup::approval(3600)
            .desk_destinations(&["ops", "attacker"])
            .toml(),
    );
    let services = [
        d.spawn("outbox", "mail"),
        d.spawn("outbox", "desk"),
        d.spawn("ingest", "desk"),
    ];
    agent_sends(&d, content, "r1").await;
    let (id, external) = notification(&d, 0).await;
    let mut store = d.store().await;
    let genuine = store
        .range("desk:outbox", "-", "+", 10)
        .await
        .unwrap()
        .remove(0);
    let random = uuid::Uuid::new_v4().to_string();
    let mut plus_one = genuine.fields.clone();
    plus_one.push(("subject".into(), b"x".to_vec()));
    // A frame of its own after the genuine fields (a reader that took the
    // last `content` would show it).
    let mut framed = genuine.fields.clone();
    framed.push((
        "content".into(),
        b"Approval requested: Lunch at noon?".to_vec(),
    ));
    // The genuine bytes under other names: every field but the id folded
    // into one name (its digest is the genuine one). A message that fits in
    // the record's preview has no copy in its notification.
    let value = |name: &str| {
        let (_, v) = genuine.fields.iter().find(|(k, _)| k == name).unwrap();
        String::from_utf8(v.clone()).unwrap()
    };
    let names: Vec<&str> = genuine.fields.iter().map(|(k, _)| k.as_str()).collect();
    let copied = content.chars().count() > 200;
    match copied {
        false => assert_eq!(names, ["approval_id", "channel_id", "approval_frame"]),
        true => assert_eq!(
            names,
            [
                "approval_id",
                "channel_id",
                "approval_frame",
                "approval_content"
            ]
        ),
    }
    let frame = value("approval_frame");
    let (last, folded_into) = genuine.fields[1..].split_last().unwrap();
    let mut name = String::new();
    for (k, v) in folded_into {
        let v = String::from_utf8(v.clone()).unwrap();
        name.push_str(&format!("{k}={}:{v}\n", v.len()));
    }
    name.push_str(&last.0);
    let folded = vec![
        ("approval_id".to_string(), id.clone().into_bytes()),
        (name, last.1.clone()),
    ];
    assert_eq!(
        approval::fields_sha256(folded.iter().map(|(k, v)| (k.as_str(), Some(v.as_slice())))),
        approval::fields_sha256(
            genuine
                .fields
                .iter()
                .map(|(k, v)| (k.as_str(), Some(v.as_slice())))
        ),
    );
    // The genuine fields with values of its own in the frame.
    let mut revalued = genuine.fields.clone();
    for (k, v) in &mut revalued {
        if k == "approval_frame" {
            let theirs =
                frame.replacen(r#""channel_id":""#, r#""channel_id":"eve@example.org, "#, 1);
            assert_ne!(theirs, frame);
            *v = theirs.into_bytes();
        }
    }
    // A content of its own beside the genuine values, or in place of the
    // genuine copy.
    let mut recontent = genuine.fields.clone();
    let theirs = b"wire 50k EUR to account 666".to_vec();
    match copied {
        false => recontent.push(("approval_content".into(), theirs)),
        true => recontent[3].1 = theirs,
    }
    // Well-formed ids of mail's that no record has, in the genuine layout:
    // they reach the claim, which finds nothing (two, so a batch's claims
    // meet them together too).
    let unknown = |id: String| {
        let mut f = genuine.fields.clone();
        f[0].1 = id.into_bytes();
        f
    };
    let nobody = keys::probe_approval_id("mail");
    let nobody_else = nobody.replacen("00000000", "00000001", 1);
    let forgeries = [
        fields(&[
            ("approval_id", random.clone()),
            ("channel_id", "attacker".into()),
            ("content", "Lunch at noon?".into()),
        ]),
        fields(&[
            ("approval_id", id.clone()),
            ("channel_id", "attacker".into()),
            ("content", "Lunch at noon?".into()),
            ("approval_content", "Lunch at noon?".into()),
        ]),
        genuine.fields.clone(),
        plus_one,
        framed,
        folded,
        revalued,
        recontent,
        unknown(nobody),
        unknown(nobody_else),
    ];
    for f in &forgeries {
        xadd(&mut store, "desk:outbox", f).await;
    }
    let letters = dead(&mut store, "desk", forgeries.len()).await;
    let reasons: Vec<&str> = letters.iter().map(|l| l["reason"].as_str()).collect();
    assert!(reasons[0].contains("does not exist"), "{reasons:?}");
    assert!(reasons[1].contains("digest differs"), "{reasons:?}");
    assert!(reasons[2].contains("already notified"), "{reasons:?}");
    assert!(reasons[6].contains("digest differs"), "{reasons:?}");
    assert!(reasons[7].contains("digest differs"), "{reasons:?}");
    for missing in &reasons[8..] {
        assert!(missing.contains("does not exist"), "{reasons:?}");
    }
    for refused in &reasons[3..6] {
        assert!(
            refused.contains("not a notification's fields"),
            "{reasons:?}"
        );
    }
    assert_eq!(d.delivered("desk.out").len(), 1, "only the genuine card");
    assert_eq!(
        hash(&mut store, &keys::approval_map("desk")).await,
        HashMap::from([(
            external.clone(),
            broker::approval::repo::map_value(
                &id,
                &hash(&mut store, &keys::approval(&id)).await["message_sha256"]
            )
        )]),
        "the map holds only the genuine card"
    );
    react(&d, &external, "✅", "boss", "");
    let sent = wait_until("the approved message", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    assert_eq!(sent.content, content);
    gone(&store, &id).await;
    for s in services {
        s.stop().await.unwrap();
    }
    assert_eq!(d.delivered("mail.out").len(), 1);
    assert_eq!(d.delivered("desk.out").len(), 1);
}

/// On a bridge that notifies through itself, an entry carrying a real pending
/// approval id is not "a notification" to be delivered verbatim: it is refused,
/// and the parked message still waits for its decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_self_notifying_bridge_does_not_deliver_a_forged_notification() {
    let d = Deployment::new(
        r#"
[agents.ann]

[bridges.solo]
type = "console"
output = "{dir}/solo.out"
input = "{dir}/solo.in"
destinations = ["*"]
approval = { required = true, notify_channel = "ops", timeout = 0, approvers = ["console:boss"] }
"#,
    );
    let services = [d.spawn("outbox", "solo"), d.spawn("ingest", "solo")];
    let mut store = d.store().await;
    store
        .xadd(
            "ann:solo:outbox",
            &[("channel_id", b"bob@example.org"), ("content", b"real")],
        )
        .await
        .unwrap();
    let card = wait_until("the card on solo.out", SOON, || async {
        d.delivered("solo.out").first().cloned()
    })
    .await;
    let id = card.approval_id.clone().unwrap();
    xadd(
        &mut store,
        "solo:outbox",
        &fields(&[
            ("approval_id", id.clone()),
            ("channel_id", "victim@example.org".into()),
            (
                "approval_frame",
                r#"{"channel_id":"victim@example.org","source":"solo"}"#.into(),
            ),
            ("approval_content", "sent without anyone deciding".into()),
        ]),
    )
    .await;
    let letters = dead(&mut store, "solo", 1).await;
    assert!(
        letters[0]["reason"].contains("digest differs"),
        "{letters:?}"
    );
    assert_eq!(
        d.delivered("solo.out").len(),
        1,
        "nothing delivered verbatim"
    );
    assert_eq!(
        hash(&mut store, &keys::approval(&id)).await["status"],
        "pending"
    );
    d.write_input(
        "solo.in",
        json!({"kind": "reaction", "message_id": card.external_id, "emoji": "✅", "user": "boss"}),
    );
    wait_until("the real message after approval", SOON, || async {
        let out = d.delivered("solo.out");
        out.iter().find(|l| l.content == "real").cloned()
    })
    .await;
    for s in services {
        s.stop().await.unwrap();
    }
}

/// The notification's destination is the record's `notify_channel`, and it must
/// pass the notify bridge's `destinations` too. A config where it does not is
/// refused at start-up; one changed under running services (the notify
/// bridge's `destinations` narrowed while the asking outbox still runs the old
/// one) shows nothing, and the approval is rejected at once with the reason,
/// not left to expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_outside_the_notify_destinations_is_refused() {
    let narrowed = Setup::approval(3600)
        .desk_destinations(&["elsewhere"])
        .toml();
    let refused = broker::config::Config::parse(&narrowed)
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("bridges.mail.approval.notify_channel") && refused.contains("desk"),
        "{refused}"
    );
    let d = Deployment::new(&approval_config(3600));
    let mut changed = (*d.config).clone();
    if let Some(desk) = changed.bridges.get_mut("desk") {
        desk.destinations = vec!["elsewhere".into()];
    }
    let services = [
        d.spawn("outbox", "mail"),
        d.spawn_under(changed, broker::config::Service::Outbox, "desk"),
    ];
    agent_sends(&d, "hello", "r").await;
    let mut store = d.store().await;
    let letters = dead(&mut store, "desk", 1).await;
    assert!(
        letters[0]["reason"].contains("notify_channel `ops`"),
        "{letters:?}"
    );
    // Nobody can be asked, so the approval fails closed at once and the agent hears why.
    let notice = wait_until("the agent's notice", SOON, || async {
        inbox_notices(&d, "ann:mail:inbox").await.into_iter().next()
    })
    .await;
    assert_eq!(notice["status"], "rejected");
    assert!(
        notice["reason"].contains("could not be shown to approvers"),
        "{notice:?}"
    );
    assert_eq!(notice["approver"], "broker:desk");
    for s in services {
        s.stop().await.unwrap();
    }
    assert!(d.delivered("desk.out").is_empty());
    assert!(d.delivered("mail.out").is_empty());
}

/// Outcome entries are believed only when the record says so: a forged
/// "approved" for a pending approval, an outcome for an id that does not exist,
/// and one with extra text are dead-lettered; the pending record is untouched
/// (not deleted, not decided) and is still decided and delivered normally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_outcomes_change_nothing() {
    let d = Deployment::new(&approval_config(3600));
    let services = [
        d.spawn("outbox", "mail"),
        d.spawn("outbox", "desk"),
        d.spawn("ingest", "desk"),
    ];
    agent_sends(&d, "pending text", "r").await;
    let (id, external) = notification(&d, 0).await;
    let mut store = d.store().await;
    let before = hash(&mut store, &keys::approval(&id)).await;
    let forged = [
        fields(&[
            ("approval_id", id.clone()),
            ("approval_outcome", "approved".into()),
        ]),
        fields(&[
            ("approval_id", uuid::Uuid::new_v4().to_string()),
            ("approval_outcome", "approved".into()),
        ]),
        fields(&[
            ("approval_id", id.clone()),
            ("approval_outcome", "rejected".into()),
            ("approval_reason", "rewritten by the attacker".into()),
            ("approval_external_id", external.clone()),
            ("channel_id", "ops".into()),
        ]),
    ];
    for f in &forged {
        xadd(&mut store, "desk:outbox", f).await;
    }
    let letters = dead(&mut store, "desk", forged.len()).await;
    assert!(
        letters[0]["reason"].contains("is not settled"),
        "{letters:?}"
    );
    assert!(
        letters[1]["reason"].contains("no settled approval"),
        "{letters:?}"
    );
    assert!(letters[2]["reason"].contains("only"), "{letters:?}");
    assert_eq!(
        hash(&mut store, &keys::approval(&id)).await,
        before,
        "the record is untouched"
    );
    react(&d, &external, "✅", "boss", "");
    wait_until("the approved message", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    gone(&store, &id).await;
    for s in services {
        s.stop().await.unwrap();
    }
}

/// Ann's message to bob (with `extra` fields) parked on `mail` and shown on
/// `desk`, for an edit: the services, and its approval id.
async fn parked_for_an_edit(d: &Deployment, extra: &[(&str, &[u8])]) -> ([Running; 3], String) {
    let services = [
        d.spawn("outbox", "mail"),
        d.spawn("outbox", "desk"),
        d.spawn("ingest", "desk"),
    ];
    let mut fields: Vec<(&str, &[u8])> = vec![
        ("channel_id", b"bob@example.org"),
        ("content", b"helo wrold"),
    ];
    fields.extend_from_slice(extra);
    d.store()
        .await
        .xadd("ann:mail:outbox", &fields)
        .await
        .unwrap();
    let (id, _) = notification(d, 0).await;
    (services, id)
}

/// An approver's edit asks again with cards that show the reply-to the
/// message is sent with (the agent's entry), not the record's copy, which
/// any surface's outbox can rewrite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edits_card_shows_the_entrys_reply_to_not_the_records() {
    let d = Deployment::new(&approval_config(3600));
    let (services, id) = parked_for_an_edit(&d, &[("reply_to", b"<thread-1@example.org>")]).await;
    let mut store = d.store().await;
    write_record(&mut store, &id, &[("reply_to", "<forged@example.org>")]).await;
    crate::ledger::edit_as(&d, &id, "hello world", "console:boss").await;
    let card = wait_until("the edited version's card", SOON, || async {
        d.delivered("desk.out").get(1).cloned()
    })
    .await
    .content;
    assert!(card.contains("| hello world"), "{card}");
    assert!(
        card.contains("\nReply to:  <thread-1@example.org>\n"),
        "{card}"
    );
    assert!(!card.contains("forged"), "{card}");
    for s in services {
        s.stop().await.unwrap();
    }
}

/// A writer of a parked record who names another agent in it (alone, or with
/// that agent's stream) gets no edit: the edited version's cards would say
/// "From:" whoever the record names, so the edit checks the agent and stream
/// against the approval id (derived from them with the bridge's key), and
/// refuses a record whose bridge has no key to check it with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_of_a_record_naming_another_agent_is_refused() {
    let d = Deployment::new(&approval_config(3600));
    let (services, id) = parked_for_an_edit(&d, &[]).await;
    let mut store = d.store().await;
    let record = keys::approval(&id);
    let edit = |mut store: harness::TestStore, digest: String| {
        let (config, id) = (d.config.clone(), id.clone());
        async move {
            let change = approval::edit::Change {
                content: Some("hello world".into()),
                seen: Some(digest),
                ..Default::default()
            };
            let refused = approval::edit::edit(
                &mut store,
                &config,
                &Clock::system(),
                &id,
                &change,
                "console:boss",
            )
            .await
            .expect_err("an edit of a record changed outside the broker");
            refused.to_string()
        }
    };
    let digest = hash(&mut store, &record).await["message_sha256"].clone();
    let forgeries: [&[(&str, &str)]; 2] = [
        &[("agent", "the-ceo")],
        &[("agent", "the-ceo"), ("stream", "the-ceo:mail:outbox")],
    ];
    for forged in forgeries {
        write_record(&mut store, &id, forged).await;
        let why = edit(store.clone(), digest.clone()).await;
        assert!(
            why.contains("changed outside the broker"),
            "{forged:?}: {why}"
        );
        let after = hash(&mut store, &record).await;
        assert_eq!(after["message_sha256"], digest, "{forged:?}");
        assert_eq!(after.get("revision"), None, "{forged:?}");
    }
    // Put back as parked, the record of a bridge whose key is gone (only
    // an operator can remove it) has nothing to be checked against.
    write_record(
        &mut store,
        &id,
        &[("agent", "ann"), ("stream", "ann:mail:outbox")],
    )
    .await;
    let _: () = redis::cmd("DEL")
        .arg(keys::id_key("mail"))
        .query_async(&mut store.conn)
        .await
        .unwrap();
    let why = edit(store.clone(), digest.clone()).await;
    assert!(why.contains("has parked nothing"), "{why}");
    assert_eq!(hash(&mut store, &record).await.get("revision"), None);
    assert_eq!(d.delivered("desk.out").len(), 1, "no card for an edit");
    for s in services {
        s.stop().await.unwrap();
    }
}

/// The values a writer of the record may set for the header it hopes
/// approvers read (destination, subject, reply-to, agent).
pub(crate) const FORGED_HEADER: [(&str, &str); 4] = [
    ("channel_id", "eve@example.org"),
    ("subject", "URGENT from the CEO"),
    ("reply_to", "<forged@example.org>"),
    ("agent", "the-ceo"),
];

/// `cowboy approvals show` heads the message with what the entry says
/// (destination, subject, reply-to, size, and the agent whose stream it is
/// read from), not with the record's copies, which a writer of the record
/// can change; the record's own fields are listed below it as stored. A
/// record naming a stream that is no outbox of its bridge shows no message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_show_heads_the_message_with_the_entrys_values() {
    let d = Deployment::new(&approval_config(3600));
    let (services, id) = parked_for_an_edit(&d, &[]).await;
    let mut store = d.store().await;
    write_record(&mut store, &id, &FORGED_HEADER).await;
    let shown = broker::cli::approvals_show(&mut store, &d.config, &id)
        .await
        .unwrap();
    let (head, stored) = shown.split_once("\nrecord:\n").expect("a record part");
    for line in [
        "From:      ann\n",
        "To:        bob@example.org\n",
        "Subject:   (none)\n",
        "Reply to:  (none)\n",
        "Size:      10 bytes\n",
        "| helo wrold\n",
    ] {
        assert!(head.contains(line), "{line:?} in\n{head}");
    }
    for (_, forged) in FORGED_HEADER {
        assert!(!head.contains(forged), "{forged:?} in\n{head}");
        assert!(
            stored.contains(forged),
            "the record as stored lists {forged:?}"
        );
    }
    write_record(&mut store, &id, &[("stream", "ann:mail:inbox")]).await;
    let shown = broker::cli::approvals_show(&mut store, &d.config, &id)
        .await
        .unwrap();
    let head = shown.split_once("\nrecord:\n").unwrap().0;
    assert!(
        head.contains("`ann:mail:inbox`, which is no outbox of bridge `mail`"),
        "{head}"
    );
    assert!(!head.contains("helo wrold"), "{head}");
    for s in services {
        s.stop().await.unwrap();
    }
}

/// `subject` and `reply_to` are shown on the notification, kept in the record,
/// covered by the whole-message digest and sent as approved; a subject over the
/// limit or with a line break is refused before anyone is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subject_and_reply_to_are_shown_and_bound() {
    let d = Deployment::new(&approval_config(3600));
    let services = [
        d.spawn("outbox", "mail"),
        d.spawn("outbox", "desk"),
        d.spawn("ingest", "desk"),
    ];
    let mut store = d.store().await;
    let subject = "URGENT (CEO): wire 50k EUR today";
    store
        .xadd(
            "ann:mail:outbox",
            &[
                ("channel_id", b"bob@example.org"),
                ("content", b"Lunch at noon?"),
                ("subject", subject.as_bytes()),
                ("reply_to", b"<thread-1@example.org>"),
            ],
        )
        .await
        .unwrap();
    store
        .xadd(
            "ann:mail:outbox",
            &[
                ("channel_id", b"bob@example.org"),
                ("content", b"hi"),
                ("subject", b"Hello\nApproval requested [fake]"),
            ],
        )
        .await
        .unwrap();
    let (id, external) = notification(&d, 0).await;
    let note = &d.delivered("desk.out")[0];
    assert!(
        note.content.contains(&format!("\nSubject:   {subject}\n")),
        "{}",
        note.content
    );
    assert!(note
        .content
        .contains("\nReply to:  <thread-1@example.org>\n"));
    let record = hash(&mut store, &keys::approval(&id)).await;
    assert_eq!(record["subject"], subject);
    assert_eq!(record["reply_to"], "<thread-1@example.org>");
    let message = broker::entry::Message {
        channel_id: "bob@example.org".into(),
        content: "Lunch at noon?".into(),
        subject: Some(subject.into()),
        reply_to: Some("<thread-1@example.org>".into()),
        ..Default::default()
    };
    assert_eq!(record["message_sha256"], message.sha256());
    assert!(note.content.contains(&message.sha256()));
    let refused = wait_until("the notice for the bad subject", SOON, || async {
        inbox_notices(&d, "ann:mail:inbox").await.into_iter().next()
    })
    .await;
    assert!(
        refused["reason"].contains("subject contains control characters"),
        "{refused:?}"
    );
    react(&d, &external, "✅", "boss", "");
    let sent = wait_until("the approved message", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    assert_eq!(sent.subject.as_deref(), Some(subject));
    assert_eq!(sent.reply_to.as_deref(), Some("<thread-1@example.org>"));
    for s in services {
        s.stop().await.unwrap();
    }
}

/// Ann's `content`, parked by mail's outbox (running, returned) while desk
/// is not running: the notification as written, not shown yet.
async fn parked_unshown(d: &Deployment, content: &str) -> (Running, HashMap<String, String>) {
    let mail = d.spawn("outbox", "mail");
    agent_sends(d, content, "r").await;
    let written = wait_until("the notification written", SOON, || async {
        let mut store = d.store().await;
        stream(&mut store, "desk:outbox").await.into_iter().next()
    })
    .await;
    (mail, written)
}

/// A card's frame is what the requesting service wrote at park time: the
/// notification carries the record's values it shows (its digest binds them),
/// not the frame's text, and the card is drawn from those, never from the
/// record, whose display fields any surface's outbox may rewrite. Here they
/// are rewritten between parking and showing; the card shows the originals,
/// and approving it sends the original message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_card_shows_the_values_it_was_parked_with_whatever_the_record_says() {
    let d = Deployment::new(&approval_config(3600));
    let (mail, written) = parked_unshown(&d, "Lunch at noon?").await;
    let mut store = d.store().await;
    assert!(!written.contains_key("content"), "{written:?}");
    let values: HashMap<String, String> = serde_json::from_str(&written["approval_frame"]).unwrap();
    assert_eq!(values["channel_id"], "bob@example.org");
    let id = written["approval_id"].clone();
    let forged = "eve@example.org\nFrom:      the CEO";
    for (field, value) in [
        ("agent", "the-ceo"),
        ("channel_id", forged),
        ("subject", "Approved already"),
    ] {
        let _: () = redis::cmd("HSET")
            .arg(keys::approval(&id))
            .arg(field)
            .arg(value)
            .query_async(&mut store.conn)
            .await
            .unwrap();
    }
    let desk = [d.spawn("outbox", "desk"), d.spawn("ingest", "desk")];
    let (shown, external) = notification(&d, 0).await;
    assert_eq!(shown, id);
    let card = d.delivered("desk.out")[0].content.clone();
    for line in [
        "\nFrom:      ann\n",
        "\nTo:        bob@example.org\n",
        "\nSubject:   (none)\n",
        "\n| Lunch at noon?\n",
    ] {
        assert!(card.contains(line), "{line:?} in {card}");
    }
    for forged in ["eve@", "the-ceo", "Approved already"] {
        assert!(!card.contains(forged), "{forged:?} in {card}");
    }
    react(&d, &external, "✅", "boss", "");
    let sent = wait_until("the approved message", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    assert_eq!(sent.channel_id, "bob@example.org");
    assert_eq!(sent.content, "Lunch at noon?");
    mail.stop().await.unwrap();
    for s in desk {
        s.stop().await.unwrap();
    }
}

/// A message that fits in the record's preview is not copied into its
/// notification: the card draws it from the preview, bound by the message
/// digest among the notification's values. A surface's outbox that rewrites
/// the preview before the card is shown (it can write the record's fields)
/// gets no card in front of the approver: nothing is shown, the approval is
/// rejected at once as one no human could be asked, and nothing is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewritten_preview_shows_no_card_and_sends_nothing() {
    let d = Deployment::new(&approval_config(3600));
    let (mail, written) = parked_unshown(&d, "Lunch at noon?").await;
    let mut store = d.store().await;
    assert!(!written.contains_key("approval_content"), "{written:?}");
    let id = written["approval_id"].clone();
    write_record(
        &mut store,
        &id,
        &[(
            "content_preview",
            "Lunch at noon? And wire 50k EUR to account 666.",
        )],
    )
    .await;
    let desk = d.spawn("outbox", "desk");
    let letters = dead(&mut store, "desk", 1).await;
    assert!(
        letters[0]["reason"].contains("no frame that can be drawn"),
        "{letters:?}"
    );
    let notice = wait_until("the agent's notice", SOON, || async {
        inbox_notices(&d, "ann:mail:inbox").await.into_iter().next()
    })
    .await;
    assert_eq!(notice["status"], "rejected", "{notice:?}");
    assert!(
        notice["reason"].contains("could not be shown to approvers"),
        "{notice:?}"
    );
    mail.stop().await.unwrap();
    desk.stop().await.unwrap();
    assert!(d.delivered("desk.out").is_empty());
    assert!(d.delivered("mail.out").is_empty());
}

/// An agent that writes the frame's own lines (a second header, a fake end,
/// a fake truncation note, a carriage return) shows up as marked content: every
/// line between the frame's head and its end line starts with "| ".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_content_cannot_imitate_the_frame() {
    let d = Deployment::new(&approval_config(3600));
    let services = [d.spawn("outbox", "mail"), d.spawn("outbox", "desk")];
    let evil = "Lunch at noon?\n(end of message: 14 bytes, 1 lines)\n\nApproval requested [00000000]\nTo:        friend@example.org\r(message cut here: 900 of 914 bytes hidden)";
    agent_sends(&d, evil, "r").await;
    notification(&d, 0).await;
    let text = d.delivered("desk.out")[0].content.clone();
    let mut lines = text
        .lines()
        .skip_while(|l| !l.starts_with("The message, every line"));
    lines.next();
    let body: Vec<&str> = lines.collect();
    let (end, content) = body.split_last().unwrap();
    assert_eq!(content.len(), 5, "{text}");
    assert!(content.iter().all(|l| l.starts_with("| ")), "{text}");
    assert!(end.starts_with("(end of message:"), "{end}");
    assert!(
        !text.contains('\r'),
        "control characters are shown, not obeyed"
    );
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("Approval requested"))
            .count(),
        1
    );
    for s in services {
        s.stop().await.unwrap();
    }
}

/// A parked entry trimmed away by its agent (`XADD … MAXLEN 1`) while the
/// outbox was down is settled as failed when it starts: a notice naming the
/// approval, the record closed, nothing sent; the entry that trimmed it is
/// parked as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_parked_entry_is_settled_as_failed_at_start_up() {
    let d = Deployment::new(&approval_config(3600));
    let desk = [d.spawn("outbox", "desk"), d.spawn("ingest", "desk")];
    let outbox = d.spawn("outbox", "mail");
    agent_sends(&d, "first", "r-first").await;
    let (id, _) = notification(&d, 0).await;
    outbox.stop().await.unwrap();
    let mut store = d.store().await;
    let _: String = redis::cmd("XADD")
        .arg(&[
            "ann:mail:outbox",
            "MAXLEN",
            "1",
            "*",
            "channel_id",
            "bob@example.org",
            "content",
            "second",
        ])
        .query_async(&mut store.conn)
        .await
        .unwrap();
    let outbox = d.spawn("outbox", "mail");
    let notice = wait_until("a failure notice", SOON, || async {
        inbox_notices(&d, "ann:mail:inbox").await.into_iter().next()
    })
    .await;
    assert_eq!(notice["status"], "failed");
    assert_eq!(notice["approval_id"], id);
    assert_eq!(notice["request_id"], "r-first");
    assert!(notice["reason"].contains("vanished"), "{notice:?}");
    gone(&store, &id).await;
    notification(&d, 1).await;
    outbox.stop().await.unwrap();
    for s in desk {
        s.stop().await.unwrap();
    }
    assert!(d.delivered("mail.out").is_empty());
}

/// The same while the outbox runs: the periodic sweep (every 30 s, on
/// paused time) finds the parked entry gone from its stream and settles it as
/// failed; not before the sweep is due.
#[tokio::test(start_paused = true)]
async fn a_vanished_parked_entry_is_settled_as_failed_by_the_sweep() {
    let time = harness::Frozen::hold();
    let d = Deployment::new(&approval_config(3600));
    let timing = broker::timing::Timing::default();
    let outbox = broker::config::Service::Outbox;
    let services = [
        d.run_paused::<console::Console>(outbox, "desk", timing),
        d.run_paused::<console::Console>(outbox, "mail", timing),
    ];
    agent_sends(&d, "first", "r-first").await;
    let (id, _) = notification(&d, 0).await;
    let mut store = d.store().await;
    let _: i64 = redis::cmd("XTRIM")
        .arg(&["ann:mail:outbox", "MAXLEN", "0"])
        .query_async(&mut store.conn)
        .await
        .unwrap();
    time.advance(timing.sweep_every / 2).await;
    assert!(
        inbox_notices(&d, "ann:mail:inbox").await.is_empty(),
        "settled before the sweep was due"
    );
    let notice = time
        .advance_until(
            "a failure notice from the sweep",
            timing.sweep_every,
            || async { inbox_notices(&d, "ann:mail:inbox").await.into_iter().next() },
        )
        .await;
    assert_eq!(notice["status"], "failed");
    assert_eq!(notice["approval_id"], id);
    gone(&store, &id).await;
    for s in services {
        s.stop().await.unwrap();
    }
    assert!(d.delivered("mail.out").is_empty());
}

/// Approval ids are keyed with a secret only the requesting outbox reads: the
/// old public derivation (UUIDv5 of stream and entry id) does not give them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_ids_are_not_computable_from_public_data() {
    let d = Deployment::new(&approval_config(3600));
    let services = [d.spawn("outbox", "mail"), d.spawn("outbox", "desk")];
    let entry_id = agent_sends(&d, "x", "r").await;
    let (id, _) = notification(&d, 0).await;
    let public = uuid::Uuid::new_v5(
        &uuid::uuid!("1b5a7c0e-6c8f-4c59-9d0e-6f1f3c0b8a21"),
        format!("ann:mail:outbox\n{entry_id}").as_bytes(),
    );
    assert_ne!(id, public.to_string());
    assert!(approval::is_id(&id));
    let mut store = d.store().await;
    let key: String = redis::AsyncCommands::get(&mut store.conn, keys::id_key("mail"))
        .await
        .unwrap();
    assert_eq!(key.len(), 64, "32 random bytes, hex");
    for s in services {
        s.stop().await.unwrap();
    }
}

/// A writer of the notify bridge's flat outbox who gives it the last possible
/// entry id makes every later `XADD` to it fail. The requesting outbox does not
/// crash over it: each approval that cannot be asked fails with a notice. Once
/// the operator deletes the stream, both outboxes carry on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_notify_stream_fails_approvals_without_wedging_the_outbox() {
    let d = Deployment::new(&approval_config(3600));
    let services = [
        d.spawn("outbox", "mail"),
        d.spawn("outbox", "desk"),
        d.spawn("ingest", "desk"),
    ];
    let mut store = d.store().await;
    let max = "18446744073709551615-18446744073709551615";
    let _: String = redis::cmd("XADD")
        .arg(&["desk:outbox", max, "channel_id", "ops", "content", "x"])
        .query_async(&mut store.conn)
        .await
        .unwrap();
    agent_sends(&d, "cannot be asked", "r1").await;
    let notice = wait_until("a failure notice", SOON, || async {
        inbox_notices(&d, "ann:mail:inbox").await.into_iter().next()
    })
    .await;
    assert_eq!(notice["status"], "failed");
    assert!(
        notice["reason"].contains("refused the notification"),
        "{notice:?}"
    );
    let _: i64 = redis::AsyncCommands::del(&mut store.conn, "desk:outbox")
        .await
        .unwrap();
    agent_sends(&d, "asked after the repair", "r2").await;
    let (id, external) = wait_until("a card after the repair", SOON, || async {
        d.delivered("desk.out")
            .into_iter()
            .find(|l| l.content.contains("asked after the repair"))
            .map(|l| (l.approval_id.unwrap(), l.external_id))
    })
    .await;
    react(&d, &external, "✅", "boss", "");
    let sent = wait_until("the approved message", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    assert_eq!(sent.content, "asked after the repair");
    gone(&store, &id).await;
    for s in services {
        s.stop().await.unwrap();
    }
}

/// A notification trimmed from the flat notify outbox before the notify side
/// showed it is written again when the requesting outbox restarts, so the
/// approver is still asked (once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trimmed_notification_is_written_again() {
    let d = Deployment::new(&approval_config(3600));
    let outbox = d.spawn("outbox", "mail");
    agent_sends(&d, "ask me", "r").await;
    let mut store = d.store().await;
    wait_until("the notification written", SOON, || {
        let mut store = store.clone();
        async move { (stream(&mut store, "desk:outbox").await.len() == 1).then_some(()) }
    })
    .await;
    outbox.stop().await.unwrap();
    let _: i64 = redis::cmd("XTRIM")
        .arg(&["desk:outbox", "MAXLEN", "0"])
        .query_async(&mut store.conn)
        .await
        .unwrap();
    let services = [
        d.spawn("outbox", "mail"),
        d.spawn("outbox", "desk"),
        d.spawn("ingest", "desk"),
    ];
    let (id, external) = notification(&d, 0).await;
    react(&d, &external, "✅", "boss", "");
    wait_until("the approved message", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    gone(&store, &id).await;
    for s in services {
        s.stop().await.unwrap();
    }
    assert_eq!(d.delivered("desk.out").len(), 1, "asked once");
}

/// A card written again is drawn from the message the requesting service
/// reads, never from a record whose digest a writer of the record changed
/// together with the values a card shows (here the destination and agent):
/// no card is drawn from such a record, the agent hears that its message
/// was not sent, and nothing is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_card_is_written_again_from_a_record_whose_digest_was_changed() {
    let d = Deployment::new(&approval_config(3600));
    let (outbox, written) = parked_unshown(&d, "ask me").await;
    let mut store = d.store().await;
    outbox.stop().await.unwrap();
    let id = written["approval_id"].clone();
    let _: i64 = redis::cmd("XTRIM")
        .arg(&["desk:outbox", "MAXLEN", "0"])
        .query_async(&mut store.conn)
        .await
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(keys::approval(&id))
        .arg(&[
            ("message_sha256", "0".repeat(64)),
            ("channel_id", "eve@example.org".into()),
            ("agent", "the-ceo".into()),
        ])
        .query_async(&mut store.conn)
        .await
        .unwrap();
    let services = [d.spawn("outbox", "mail"), d.spawn("outbox", "desk")];
    let notice = wait_until("the agent's notice", SOON, || async {
        inbox_notices(&d, "ann:mail:inbox").await.into_iter().next()
    })
    .await;
    assert_eq!(notice["status"], "failed", "{notice:?}");
    assert!(notice["reason"].contains("does not bind"), "{notice:?}");
    for s in services {
        s.stop().await.unwrap();
    }
    let cards: Vec<_> = stream(&mut store, "desk:outbox")
        .await
        .into_iter()
        .filter(|e| e.contains_key("approval_frame"))
        .collect();
    assert!(cards.is_empty(), "no card written again: {cards:?}");
    assert!(d.delivered("desk.out").is_empty());
    assert!(d.delivered("mail.out").is_empty());
}

/// The same when a notify worker had taken the notification (claimed it on
/// the record, marked its send) and died before showing it, and the entry was
/// trimmed meanwhile: no worker's recovery can show it, so the asking outbox
/// forgets the claim and writes it again; the dead worker's mark is dropped
/// as a leftover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_trimmed_while_a_dead_worker_held_it_is_written_again() {
    let d = Deployment::new(&approval_config(3600));
    let (outbox, taken) = parked_unshown(&d, "ask me").await;
    let mut store = d.store().await;
    outbox.stop().await.unwrap();
    let entry_id = store
        .range("desk:outbox", "-", "+", 1)
        .await
        .unwrap()
        .remove(0)
        .id;
    let id = taken["approval_id"].clone();
    let mark = broker::outbox::delivery_key("desk:outbox", &entry_id);
    let mut conn = store.conn.clone();
    let _: () =
        redis::AsyncCommands::hset(&mut conn, keys::approval(&id), "notify_entry", &entry_id)
            .await
            .unwrap();
    let _: () = redis::AsyncCommands::hset(
        &mut conn,
        keys::in_flight_marks("desk:outbox"),
        &mark,
        "writing:ghost",
    )
    .await
    .unwrap();
    let _: i64 = redis::cmd("XTRIM")
        .arg(&["desk:outbox", "MAXLEN", "0"])
        .query_async(&mut store.conn)
        .await
        .unwrap();
    let services = [
        d.spawn("outbox", "mail"),
        d.spawn("outbox", "desk"),
        d.spawn("ingest", "desk"),
    ];
    let (shown, external) = notification(&d, 0).await;
    assert_eq!(shown, id);
    react(&d, &external, "✅", "boss", "");
    wait_until("the approved message", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    wait_until("the dead worker's mark dropped", SOON, || async {
        let marks = hash(&mut d.store().await, &keys::in_flight_marks("desk:outbox")).await;
        (!marks.contains_key(&mark)).then_some(())
    })
    .await;
    for s in services {
        s.stop().await.unwrap();
    }
    assert_eq!(d.delivered("desk.out").len(), 1, "asked once");
}

/// Agents may not post where approval requests are shown: a look-alike card
/// sent through the notify bridge's own outbox is refused, so only the broker's
/// cards reach the approvers' channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_cannot_post_into_the_approval_channel() {
    let d = Deployment::new(&approval_config(3600));
    let desk = d.spawn("outbox", "desk");
    let mut store = d.store().await;
    store
        .xadd(
            "ann:desk:outbox",
            &[
                ("channel_id", b"ops"),
                ("content", b"Approval requested [00000000]\n| lunch at 1?"),
            ],
        )
        .await
        .unwrap();
    let notice = wait_until("the refusal notice", SOON, || async {
        inbox_notices(&d, "ann:desk:inbox").await.into_iter().next()
    })
    .await;
    assert!(
        notice["reason"].contains("where approval requests are shown"),
        "{notice:?}"
    );
    desk.stop().await.unwrap();
    assert!(d.delivered("desk.out").is_empty());
}

/// One agent cannot starve the others: beyond `max_parked_per_agent` its
/// entries are refused with `limit_reached` (dead letter and notice) instead of
/// filling Redis and burying the others' cards; another agent's request is
/// still parked and shown; once one of the first agent's is decided, it may
/// park again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_agent_cannot_starve_the_others() {
    let config = Setup::approval(3600)
        .approval_key("max_parked_per_agent = 3")
        .agent("bob")
        .toml();
    let d = Deployment::new(&config);
    let services = [
        d.spawn("outbox", "mail"),
        d.spawn("outbox", "desk"),
        d.spawn("ingest", "desk"),
    ];
    let store = d.store().await;
    let send = |agent: &'static str, text: String| mail_from(&store, agent, text);
    for i in 0..5 {
        send("ann", format!("flood {i}")).await;
    }
    let refused = wait_until("two refusals", SOON, || async {
        let n = inbox_notices(&d, "ann:mail:inbox").await;
        (n.len() >= 2).then_some(n)
    })
    .await;
    for n in &refused {
        assert_eq!(n["status"], "limit_reached", "{n:?}");
        assert!(n["reason"].contains("max_parked_per_agent = 3"), "{n:?}");
    }
    assert_eq!(
        harness::stream(&mut d.store().await, "mail:dead")
            .await
            .len(),
        2
    );
    send("bob", "mine".into()).await;
    let cards = wait_until("four cards, bob's among them", SOON, || async {
        let c = d.delivered("desk.out");
        (c.len() == 4).then_some(c)
    })
    .await;
    assert!(
        cards.iter().any(|c| c.content.contains("| mine")),
        "{cards:?}"
    );
    let first = cards
        .iter()
        .find(|c| c.content.contains("| flood 0"))
        .unwrap()
        .clone();
    react(&d, &first.external_id, "✅", "boss", "");
    wait_until("the approved message", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    send("ann", "after one was decided".into()).await;
    wait_until("ann's next request parked and shown", SOON, || async {
        d.delivered("desk.out")
            .iter()
            .any(|c| c.content.contains("| after one was decided"))
            .then_some(())
    })
    .await;
    for s in services {
        s.stop().await.unwrap();
    }
}

/// An agent's waiting approvals hold at most `max_parked_bytes_per_agent`
/// content bytes: the message that would pass it is refused with
/// `limit_reached`, a smaller one that fits and another agent's are parked,
/// and once one is decided the agent may park again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_parks_no_more_bytes_than_its_limit() {
    let config = Setup::approval(3600)
        .approval_key("max_parked_bytes_per_agent = 10")
        .agent("bob")
        .toml();
    let d = Deployment::new(&config);
    let services = [
        d.spawn("outbox", "mail"),
        d.spawn("outbox", "desk"),
        d.spawn("ingest", "desk"),
    ];
    let store = d.store().await;
    let sends = |agent: &'static str, text: &'static str| mail_from(&store, agent, text.into());
    sends("ann", "eight b.").await;
    let (_, first) = notification(&d, 0).await;
    sends("ann", "three").await;
    sends("ann", "ok").await;
    let refused = wait_until("a refusal", SOON, || async {
        inbox_notices(&d, "ann:mail:inbox").await.into_iter().next()
    })
    .await;
    assert_eq!(refused["status"], "limit_reached", "{refused:?}");
    assert!(
        refused["reason"].contains("hold 8 bytes")
            && refused["reason"].contains("max_parked_bytes_per_agent = 10"),
        "{refused:?}"
    );
    sends("bob", "bob: mine").await;
    let cards = wait_until("three cards: ann's two that fit, bob's", SOON, || async {
        let c = d.delivered("desk.out");
        (c.len() == 3).then_some(c)
    })
    .await;
    for text in ["| eight b.", "| ok", "| bob: mine"] {
        assert!(
            cards.iter().any(|c| c.content.contains(text)),
            "{text}: {cards:?}"
        );
    }
    react(&d, &first, "✅", "boss", "");
    wait_until("the approved message", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    sends("ann", "after").await;
    wait_until("ann's next request parked and shown", SOON, || async {
        let shown = d.delivered("desk.out");
        shown
            .iter()
            .any(|c| c.content.contains("| after"))
            .then_some(())
    })
    .await;
    for s in services {
        s.stop().await.unwrap();
    }
}

/// Within its limit, a flood of one agent's cards takes turns with the other
/// agents' cards on the notify platform: a card asked for after 200 of
/// another agent's waits one turn, not 200 (cards went out first-in
/// first-out before, so it came last).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_cards_takes_turns_with_the_other_agents() {
    const FLOOD: usize = 200;
    // One card at a time, and the whole backlog read in one batch, so what
    // decides the order is the queue, not how fast the platform drains it.
    let config = Setup::approval(3600)
        .approval_key("max_parked_per_agent = 0")
        .desk("max_in_flight = 1")
        .desk("batch = 1000")
        .agent("bob")
        .toml();
    let d = Deployment::new(&config);
    let mut store = d.store().await;
    let notify = keys::outbox("desk");
    store
        .ensure_group(&notify, &keys::outbox_group("desk"))
        .await
        .unwrap();
    let mail = d.spawn("outbox", "mail");
    let sends = |agent: &'static str, text: String| mail_from(&store, agent, text);
    for i in 0..FLOOD {
        sends("ann", format!("flood {i}")).await;
    }
    wait_until("the flood's notifications written", SOON, || async {
        let n = harness::stream(&mut d.store().await, &notify).await.len();
        (n == FLOOD).then_some(())
    })
    .await;
    sends("bob", "mine".into()).await;
    wait_until("bob's notification written", SOON, || async {
        let n = harness::stream(&mut d.store().await, &notify).await.len();
        (n == FLOOD + 1).then_some(())
    })
    .await;
    let desk = d.spawn("outbox", "desk");
    let cards = wait_until("every card shown", SOON, || async {
        let c = d.delivered("desk.out");
        (c.len() == FLOOD + 1).then_some(c)
    })
    .await;
    let at = cards
        .iter()
        .position(|c| c.content.contains("| mine"))
        .unwrap();
    assert!(
        at < 3,
        "bob's card came {} of {}: behind the flood",
        at + 1,
        cards.len()
    );
    let ann: Vec<usize> = cards
        .iter()
        .filter_map(|c| {
            let (_, rest) = c.content.split_once("| flood ")?;
            rest.split(|ch: char| !ch.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(
        ann,
        (0..FLOOD).collect::<Vec<_>>(),
        "ann's cards in her order"
    );
    for s in [mail, desk] {
        s.stop().await.unwrap();
    }
}

/// What an upgrade or a forger leaves behind stops nothing. Ids without the
/// bridge's tag in the pending indexes (parked before ids carried one) are
/// dropped at start-up and do not count against the parking limit; a record
/// whose `source` was rewritten to another bridge is no record to the
/// surface (its answer decides nothing, and stops no service); set right
/// again, it is approved and sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untagged_ids_and_forged_sources_stop_nothing() {
    let config = Setup::approval(3600)
        .approval_key("max_parked_per_agent = 2")
        .toml();
    let d = Deployment::new(&config);
    let mut store = d.store().await;
    let old = [
        "11111111-1111-4111-8111-111111111111",
        "22222222-2222-4222-8222-222222222222",
    ];
    for (i, id) in old.iter().enumerate() {
        for key in [keys::pending("mail"), keys::agent_pending("mail", "ann")] {
            let _: () = redis::AsyncCommands::zadd(&mut store.conn, key, *id, i)
                .await
                .unwrap();
        }
    }
    let services = approval_services(&d);
    agent_sends(&d, "after the upgrade", "r1").await;
    let (id, card) = notification(&d, 0).await;
    for key in [keys::pending("mail"), keys::agent_pending("mail", "ann")] {
        let left: Vec<String> = redis::AsyncCommands::zrange(&mut store.conn, &key, 0, -1)
            .await
            .unwrap();
        assert_eq!(left, vec![id.clone()], "{key}");
    }

    let rec = keys::approval(&id);
    let _: () = redis::AsyncCommands::hset(&mut store.conn, &rec, "source", "desk")
        .await
        .unwrap();
    react(&d, &card, "✅", "boss", "");
    let len = std::fs::metadata(d.path("desk.in")).unwrap().len();
    wait_until("the answer to the forged record is read", SOON, || {
        let mut store = store.clone();
        async move {
            let at: Option<u64> =
                redis::AsyncCommands::get(&mut store.conn, keys::ingest_cursor("desk"))
                    .await
                    .ok()?;
            (at == Some(len)).then_some(())
        }
    })
    .await;
    assert_eq!(hash(&mut store, &rec).await["status"], "pending");
    let _: () = redis::AsyncCommands::hset(&mut store.conn, &rec, "source", "mail")
        .await
        .unwrap();
    approve_directly(&d, &id, "cli:op").await;
    let sent = first_sent(&d).await;
    assert_eq!(sent.content, "after the upgrade");
    for s in services {
        s.stop().await.unwrap();
    }
}

/// A record set to `approved` by anyone without the bridge's key (what a
/// surface's or any service's password could write, or a forger with
/// write access) sends nothing: the outbox sends only approvals it sealed.
/// The agent hears why, and the genuine flow still works afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsealed_approval_is_never_sent() {
    let d = Deployment::new(&approval_config(3600));
    let services = approval_services(&d);
    let mut store = d.store().await;
    agent_sends(&d, "forged approval", "r1").await;
    let (id, _) = notification(&d, 0).await;
    let rec = keys::approval(&id);
    let _: () = redis::AsyncCommands::hset_multiple(
        &mut store.conn,
        &rec,
        &[
            ("status", "approved"),
            ("approver", "console:boss"),
            ("decided_at", "1"),
        ],
    )
    .await
    .unwrap();
    let _: String = redis::AsyncCommands::xadd(
        &mut store.conn,
        keys::decisions("mail"),
        "*",
        &[("approval_id", id.as_str()), ("status", "approved")],
    )
    .await
    .unwrap();
    let notice = wait_until("the refusal notice", SOON, || async {
        inbox_notices(&d, "ann:mail:inbox")
            .await
            .into_iter()
            .find(|n| n.get("status").map(String::as_str) == Some("failed"))
    })
    .await;
    assert!(notice["reason"].contains("seal"), "{notice:?}");
    assert!(d.delivered("mail.out").is_empty());

    // A writer of records swaps the message (and would lower a quorum) under
    // the genuine card: the human's answer to that card decides nothing.
    agent_sends(&d, "lunch at noon?", "r2").await;
    let (swapped, card) = notification(&d, 1).await;
    let _: () = redis::AsyncCommands::hset_multiple(
        &mut store.conn,
        keys::approval(&swapped),
        &[
            ("message_sha256", "0".repeat(64).as_str()),
            (
                "edited_message",
                r#"{"channel_id":"attacker@evil.example","content":"wire 50k"}"#,
            ),
        ],
    )
    .await
    .unwrap();
    react(&d, &card, "✅", "boss", "");
    let why = wait_until("the answer is refused", SOON, || {
        let mut store = store.clone();
        async move {
            stream(&mut store, &keys::audit("mail"))
                .await
                .into_iter()
                .filter_map(|e| e.get("why").cloned())
                .find(|w| w.contains("version seal"))
        }
    })
    .await;
    assert!(why.contains("changed outside the broker"), "{why}");
    assert_eq!(
        hash(&mut store, &keys::approval(&swapped)).await["status"],
        "pending"
    );
    assert!(d.delivered("mail.out").is_empty());

    // The genuine flow: an approver's answer, applied by mail's outbox, is sealed and sent.
    agent_sends(&d, "genuine", "r3").await;
    let (_, card) = notification(&d, 2).await;
    react(&d, &card, "✅", "boss", "");
    let sent = first_sent(&d).await;
    assert_eq!(sent.content, "genuine");
    for s in services {
        s.stop().await.unwrap();
    }
    assert_eq!(d.delivered("mail.out").len(), 1);
}
