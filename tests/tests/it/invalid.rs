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

/// A small deterministic generator (xorshift), so a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn bytes(&mut self, max: u64) -> Vec<u8> {
        let n = self.below(max + 1);
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Poison input: a couple of thousand random entries on every stream the
/// outbox reads (random bytes in field names and values, known names with
/// random values, thousands of fields, megabyte values, every field missing in
/// turn, broker fields on the flat stream). Each is either delivered or
/// dead-lettered with a reason; nothing crashes; a valid entry written
/// afterwards is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_malformed_entries_are_all_accounted_for() {
    let d = Deployment::new(
        "[agents.ann]\n[bridges.mail]\ntype = \"console\"\noutput = \"{dir}/mail.out\"\ninput = \"{dir}/mail.in\"\ndestinations = [\"ok\", \"*@example.org\"]\nmax_content_bytes = 1024\n",
    );
    let outbox = d.spawn("outbox", "mail");
    let mut store = d.store().await;
    let known = [
        "channel_id",
        "content",
        "subject",
        "reply_to",
        "request_id",
        "approval_id",
        "approval_outcome",
        "approval_content",
    ];
    let mut rng = Rng(0x5eed_cafe_f00d_1234);
    let mut valid = 0usize;
    let total = 1500;
    for i in 0..total {
        let stream = if i % 3 == 0 {
            "mail:outbox"
        } else {
            "ann:mail:outbox"
        };
        let mut fields: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        match i % 10 {
            // Every field of a valid entry, one missing in turn.
            0 => {
                let all = [("channel_id", "ok"), ("content", "hi"), ("subject", "s")];
                for (k, (name, value)) in all.iter().enumerate() {
                    if k != (i / 10) % 3 {
                        fields.push((name.as_bytes().to_vec(), value.as_bytes().to_vec()));
                    }
                }
            }
            // Thousands of fields.
            1 if i % 100 == 1 => {
                for k in 0..3000 {
                    fields.push((format!("f{k}").into_bytes(), rng.bytes(4)));
                }
            }
            // A megabyte value.
            2 if i % 100 == 2 => {
                fields.push((b"channel_id".to_vec(), b"ok".to_vec()));
                fields.push((b"content".to_vec(), vec![b'x'; 1 << 20]));
            }
            _ => {
                for _ in 0..=rng.below(6) {
                    let name = if rng.below(3) == 0 {
                        rng.bytes(12)
                    } else {
                        known[rng.below(known.len() as u64) as usize]
                            .as_bytes()
                            .to_vec()
                    };
                    let value = match rng.below(4) {
                        0 => rng.bytes(64),
                        1 => b"ok".to_vec(),
                        2 => format!("u{}@example.org", rng.below(9)).into_bytes(),
                        _ => rng.bytes(3),
                    };
                    fields.push((name, value));
                }
            }
        }
        if fields.is_empty() {
            fields.push((b"x".to_vec(), b"y".to_vec()));
        }
        let entry = broker::store::Entry {
            id: "0-1".into(),
            fields: fields
                .iter()
                .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), v.clone()))
                .collect(),
        };
        let broker_fields =
            entry.get("approval_id").is_some() || entry.get("approval_outcome").is_some();
        let lossless = fields.iter().all(|(k, _)| std::str::from_utf8(k).is_ok());
        if lossless
            && !(stream == "mail:outbox" && broker_fields)
            && broker::entry::Message::from_entry(&entry, d.config.bridge("mail").unwrap()).is_ok()
        {
            valid += 1;
        }
        let mut cmd = redis::cmd("XADD");
        cmd.arg(stream).arg("*");
        for (k, v) in &fields {
            cmd.arg(k.as_slice()).arg(v.as_slice());
        }
        let _: String = cmd.query_async(&mut store.conn).await.unwrap();
    }
    store
        .xadd(
            "ann:mail:outbox",
            &[("channel_id", b"ok"), ("content", b"still works")],
        )
        .await
        .unwrap();
    wait_until(
        "the valid entry after the poison",
        std::time::Duration::from_secs(60),
        || async {
            d.delivered("mail.out")
                .iter()
                .any(|l| l.content == "still works")
                .then_some(())
        },
    )
    .await;
    outbox.stop().await.expect("the outbox survived");
    let dead = stream(&mut store, &keys::dead("mail")).await;
    let delivered = d.delivered("mail.out").len() - 1;
    assert!(
        valid > 0 && dead.len() > total / 2,
        "{valid} valid, {} dead",
        dead.len()
    );
    assert_eq!(delivered, valid, "valid entries delivered");
    assert_eq!(dead.len() + delivered, total, "every entry accounted for");
    assert!(
        dead.iter().all(|l| !l["reason"].is_empty()),
        "each with a reason"
    );
    for key in ["ann:mail:outbox", "mail:outbox"] {
        assert_eq!(
            pending(&mut store, key, "mail-outbox").await,
            0,
            "{key} all acked"
        );
    }
}
