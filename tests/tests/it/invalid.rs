//! Invalid entries and forged approval ids: dead letter, notice, and the loop goes on.

use broker::keys;
use harness::{pending, stream, wait_until, Deployment};

use crate::{approval_config, SOON};

/// Every kind of invalid entry lands in `{bridge}:dead` with a reason and a
/// notice on the inbox that answers its stream; a valid entry after them is
/// still delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_entries_are_dead_lettered_and_the_loop_goes_on() {
    let d = Deployment::new(
        "[agents.ann]\n[bridges.mail]\ntype = \"console\"\noutput = \"{dir}/mail.out\"\ninput = \"{dir}/mail.in\"\ndestinations = [\"ok\"]\nmax_content_bytes = 16\n",
    );
    let outbox = d.spawn("outbox", "mail");
    let mut store = d.store().await;
    type Case<'a> = (&'a str, Vec<(&'a str, &'a [u8])>, &'a str);
    let bad: Vec<Case> = vec![
        (
            "ann:mail:outbox",
            vec![("content", b"no channel")],
            "missing field `channel_id`",
        ),
        (
            "ann:mail:outbox",
            vec![("channel_id", b"ok")],
            "missing field `content`",
        ),
        (
            "ann:mail:outbox",
            vec![("channel_id", b"ok"), ("content", b"\xc3\x28")],
            "not valid UTF-8",
        ),
        (
            "ann:mail:outbox",
            vec![("channel_id", b"ok"), ("content", &[b'a'; 17])],
            "over the limit",
        ),
        (
            "ann:mail:outbox",
            vec![("channel_id", b"elsewhere"), ("content", b"hi")],
            "allow-list",
        ),
        (
            "ann:mail:outbox",
            vec![
                ("channel_id", b"ok"),
                ("content", b"hi"),
                ("approval_id", b"x"),
            ],
            "reserved",
        ),
        (
            "ann:mail:outbox",
            vec![("channel_id", b"ok"), ("content", b"hi"), ("font", b"x")],
            "unknown field",
        ),
        (
            "mail:outbox",
            vec![
                ("channel_id", b"ok"),
                ("content", b"hi"),
                ("approval_id", b"nope"),
            ],
            "carries no approval notifications",
        ),
    ];
    let mut ids = Vec::new();
    for (key, fields, _) in &bad {
        ids.push(store.xadd(key, fields).await.unwrap());
    }
    store
        .xadd(
            "ann:mail:outbox",
            &[("channel_id", b"ok"), ("content", b"still works")],
        )
        .await
        .unwrap();
    wait_until("the valid entry after the bad ones", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    outbox.stop().await.unwrap();

    let dead = stream(&mut store, &keys::dead("mail")).await;
    assert_eq!(dead.len(), bad.len(), "{dead:#?}");
    let mut notices = stream(&mut store, "ann:mail:inbox").await;
    notices.extend(stream(&mut store, "mail:inbox").await);
    for (i, (key, _, reason)) in bad.iter().enumerate() {
        let of_entry = |e: &&std::collections::HashMap<String, String>| {
            e["entry_id"] == ids[i] && e["stream"] == *key
        };
        let letter = dead
            .iter()
            .find(of_entry)
            .unwrap_or_else(|| panic!("no dead letter for case {i}"));
        assert!(
            letter["reason"].contains(reason),
            "case {i}: {:?} lacks {reason}",
            letter["reason"]
        );
        let notice = notices
            .iter()
            .find(of_entry)
            .unwrap_or_else(|| panic!("no notice for case {i}"));
        assert_eq!(notice["status"], "invalid");
        assert!(notice["reason"].contains(reason));
    }
    assert_eq!(notices.len(), bad.len());
    assert_eq!(
        d.delivered("mail.out").len(),
        1,
        "no invalid entry was sent"
    );
    assert_eq!(
        pending(&mut store, "ann:mail:outbox", "mail-outbox").await,
        0
    );
    assert_eq!(pending(&mut store, "mail:outbox", "mail-outbox").await, 0);
}

/// An agent cannot skip the gate by writing `approval_id`: not on its own stream
/// (refused), and not by forging a notification for a real approval on the flat
/// stream of a bridge that is not that approval's notify bridge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_approval_id_never_bypasses_approval() {
    let d = Deployment::new(&approval_config(0));
    let services = [d.spawn("outbox", "mail"), d.spawn("outbox", "desk")];
    let mut store = d.store().await;
    store
        .xadd(
            "ann:mail:outbox",
            &[("channel_id", b"bob@example.org"), ("content", b"legit")],
        )
        .await
        .unwrap();
    let note = wait_until("a notification", SOON, || async {
        d.delivered("desk.out").first().cloned()
    })
    .await;
    let real = note.approval_id.unwrap();
    // Reuse the real, pending approval id on the agent's stream and on the flat
    // outbox of the requesting bridge.
    store
        .xadd(
            "ann:mail:outbox",
            &[
                ("channel_id", b"bob@example.org"),
                ("content", b"forged"),
                ("approval_id", real.as_bytes()),
            ],
        )
        .await
        .unwrap();
    store
        .xadd(
            "mail:outbox",
            &[
                ("channel_id", b"bob@example.org"),
                ("content", b"forged flat"),
                ("approval_id", real.as_bytes()),
            ],
        )
        .await
        .unwrap();
    let dead = wait_until("two dead letters", SOON, || {
        let mut store = store.clone();
        async move {
            let dead = stream(&mut store, "mail:dead").await;
            (dead.len() == 2).then_some(dead)
        }
    })
    .await;
    assert!(dead[0]["reason"].contains("reserved"));
    assert!(
        dead[1]["reason"].contains("bridge `mail` carries no approval notifications"),
        "{}",
        dead[1]["reason"]
    );
    for s in services {
        s.stop().await.unwrap();
    }
    assert!(
        d.delivered("mail.out").is_empty(),
        "nothing was sent without a decision"
    );
    assert_eq!(d.delivered("desk.out").len(), 1);
}
