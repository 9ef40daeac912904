//! Streams do not grow forever: handled history is trimmed, and nothing a group
//! still needs.

use broker::keys;
use harness::{stream, wait_until, Deployment};

use crate::SOON;

async fn ids(d: &Deployment, key: &str) -> Vec<String> {
    let mut s = d.store().await;
    s.range(key, "-", "+", 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect()
}

/// Entries older than `retention_seconds` (their ids are old timestamps) are cut
/// from the outbox stream once handled, from the inbox once the agent's group has
/// read them, and old dead letters go; a parked entry, the agent's unacked and
/// unread inbox entries, and everything after them stay, and the parked entry is
/// still delivered when approved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handled_history_is_trimmed_and_nothing_still_needed() {
    let d = Deployment::new(
        r#"
[agents.ann]

[bridges.mail]
type = "console"
output = "{dir}/mail.out"
input = "{dir}/mail.in"
destinations = ["*"]
retention_seconds = 60
dead_letter_retention_seconds = 60
approval = { required = true, notify = "desk", notify_channel = "ops", timeout = 3600, approvers = ["cli:op"] }

[bridges.desk]
type = "console"
output = "{dir}/desk.out"
input = "{dir}/desk.in"
destinations = ["ops"]
"#,
    );
    let mut store = d.store().await;
    let outbox = keys::agent_outbox("ann", "mail");
    let inbox = keys::agent_inbox("ann", "mail");
    let dead = keys::dead("mail");
    let at = |id: &str, fields: &'static [(&'static str, &'static [u8])]| {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(&outbox).arg(id);
        for (k, v) in fields {
            cmd.arg(*k).arg(*v);
        }
        cmd
    };
    // Old: refused (no destination), parked, refused.
    for (id, fields) in [
        ("1000-1", &[("content", b"no destination" as &[u8])][..]),
        (
            "1000-2",
            &[("channel_id", b"bob" as &[u8]), ("content", b"parked")][..],
        ),
        (
            "1000-3",
            &[("content", b"no destination either" as &[u8])][..],
        ),
    ] {
        let _: String = at(id, fields).query_async(&mut store.conn).await.unwrap();
    }
    // An old dead letter, and an inbox the agent has read in part: 1000-1 acked,
    // 1000-2 read and not acked, 1000-3 and 1000-4 unread.
    let _: String = redis::cmd("XADD")
        .arg(&dead)
        .arg("1000-1")
        .arg("reason")
        .arg("old")
        .query_async(&mut store.conn)
        .await
        .unwrap();
    for i in 1..=4 {
        let _: String = redis::cmd("XADD")
            .arg(&inbox)
            .arg(format!("1000-{i}"))
            .arg("kind")
            .arg("message")
            .query_async(&mut store.conn)
            .await
            .unwrap();
    }
    store
        .ensure_group(&inbox, &keys::agent_group("ann"))
        .await
        .unwrap();
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(keys::agent_group("ann"))
        .arg("reader")
        .arg("COUNT")
        .arg(2)
        .arg("STREAMS")
        .arg(&inbox)
        .arg(">")
        .query_async(&mut store.conn)
        .await
        .unwrap();
    store
        .ack(&inbox, &keys::agent_group("ann"), &["1000-1"])
        .await
        .unwrap();

    let _desk = d.spawn("outbox", "desk");
    let first = d.spawn("outbox", "mail");
    wait_until("the parked entry notified", SOON, || async {
        d.delivered("desk.out").into_iter().next()
    })
    .await;
    // Dead letters need no group: the old one went at start-up.
    wait_until(
        "two refusals dead-lettered, the old dead letter gone",
        SOON,
        || async {
            let mut s = d.store().await;
            (stream(&mut s, &dead).await.len() == 2).then_some(())
        },
    )
    .await;
    // Trimming runs at start-up (and every five minutes): a restart runs it now
    // that the old entries are handled.
    first.stop().await.unwrap();
    let _second = d.spawn("outbox", "mail");
    wait_until("the handled head of the outbox trimmed", SOON, || async {
        let ids = ids(&d, &outbox).await;
        (ids.first().map(String::as_str) == Some("1000-2")).then_some(ids)
    })
    .await;
    let kept = ids(&d, &outbox).await;
    assert_eq!(
        kept,
        ["1000-2", "1000-3"],
        "cut only below the parked entry"
    );
    let inbox_ids = ids(&d, &inbox).await;
    assert_eq!(
        &inbox_ids[..3],
        ["1000-2", "1000-3", "1000-4"],
        "the inbox is cut below what the agent has not acked: {inbox_ids:?}"
    );
    assert!(
        inbox_ids.len() == 5,
        "the notices written since are kept: {inbox_ids:?}"
    );
    let dead_ids = ids(&d, &dead).await;
    assert_eq!(
        dead_ids.len(),
        2,
        "the old dead letter is gone: {dead_ids:?}"
    );
    assert!(!dead_ids.contains(&"1000-1".to_string()));

    let id = d.delivered("desk.out")[0].approval_id.clone().unwrap();
    let out = d.cowboy(&["approvals", "approve", &id, "--as", "op"]);
    assert!(out.status.success(), "{out:?}");
    let sent = wait_until("the parked entry delivered", SOON, || async {
        d.delivered("mail.out").into_iter().next()
    })
    .await;
    assert_eq!(sent.content, "parked");
}
