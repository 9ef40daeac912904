//! The email bridge against a real mail stack (Postfix + Dovecot, private
//! instances) and the real binaries.

use std::collections::HashMap;
use std::time::Duration;

use broker::outbox::delivery_key;
use broker::{approval, keys};
use harness::mail::MailStack;
use harness::TestStore;
use harness::{inbox, stream, wait_until, Deployment, Process};
use mail_parser::MessageParser;

/// Mail arrives within a second or so (Dovecot delays IDLE notifications by 500 ms).
pub(crate) const MAIL: Duration = Duration::from_secs(20);

#[derive(Debug)]
pub(crate) struct Mail {
    pub(crate) from: String,
    pub(crate) to: String,
    pub(crate) subject: String,
    pub(crate) message_id: String,
    pub(crate) in_reply_to: String,
    pub(crate) references: Vec<String>,
    pub(crate) body: String,
}

pub(crate) fn parse(raw: &[u8]) -> Mail {
    let m = MessageParser::default()
        .parse(raw)
        .expect("a parseable mail");
    let list = |h: &mail_parser::HeaderValue| {
        h.as_text_list()
            .map(|l| l.iter().map(|s| s.to_string()).collect())
            .unwrap_or_default()
    };
    Mail {
        from: m
            .from()
            .and_then(|a| a.first())
            .and_then(|a| a.address())
            .unwrap_or("")
            .to_string(),
        to: m
            .to()
            .and_then(|a| a.first())
            .and_then(|a| a.address())
            .unwrap_or("")
            .to_string(),
        subject: m.subject().unwrap_or("").to_string(),
        message_id: m.message_id().unwrap_or("").to_string(),
        in_reply_to: m.in_reply_to().as_text().unwrap_or("").to_string(),
        references: list(m.references()),
        body: m.body_text(0).map(|b| b.into_owned()).unwrap_or_default(),
    }
}

pub(crate) async fn wait_mails(stack: &MailStack, user: &str, n: usize) -> Vec<Mail> {
    wait_until(&format!("{n} mail(s) for {user}"), MAIL, || async {
        let m = stack.mails(user);
        (m.len() >= n).then(|| m.iter().map(|r| parse(r)).collect())
    })
    .await
}

pub(crate) fn deployment(stack: &MailStack, bridge_extra: &str, rest: &str) -> Deployment {
    Deployment::new(&format!(
        r#"
[agents.ann]

[bridges.mail]
type = "email"
destinations = ["*@bridge.test", "*@elsewhere.test"]
ping = {{ command = ["sh", "-c", "echo \"$COWBOY_FIELD_SUBJECT\" >> {{dir}}/pinged"], debounce_ms = 100 }}
{settings}{bridge_extra}
{rest}"#,
        settings = stack.bridge_settings(),
    ))
}

pub(crate) const APPROVAL: &str = "approval = { required = true, notify = \"mail\", notify_channel = \"approver@bridge.test\", timeout = 0, approvers = [\"email:approver@bridge.test\"] }\nrequire_authentication = true\nauthserv_id = \"mx.bridge.test\"\n";

fn reply(from: &str, to_id: &str, body: &str) -> String {
    format!(
        "From: {from}\r\nTo: bridge@bridge.test\r\nSubject: Re: Approval needed\r\nMessage-ID: <{}@bridge.test>\r\nIn-Reply-To: <{to_id}>\r\nReferences: <{to_id}>\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{body}\r\n",
        uuid::Uuid::new_v4().simple()
    )
}

/// The approver's reply to `mail` (a "not understood" answer), threaded under
/// everything it references, with `body`.
pub(crate) fn reply_in_thread(mail: &Mail, body: &str) -> String {
    let refs: Vec<String> = mail
        .references
        .iter()
        .chain(std::iter::once(&mail.message_id))
        .map(|r| format!("<{}>", r.trim_matches(['<', '>'])))
        .collect();
    format!(
        "From: approver@bridge.test\r\nTo: bridge@bridge.test\r\nSubject: Re: {}\r\nMessage-ID: <{}@bridge.test>\r\nIn-Reply-To: <{}>\r\nReferences: {}\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{}\r\n",
        mail.subject,
        uuid::Uuid::new_v4().simple(),
        mail.message_id.trim_matches(['<', '>']),
        refs.join(" "),
        body.replace('\n', "\r\n")
    )
}

fn base64_encode(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// An agent entry arrives with the right headers, threading, and non-ASCII
/// subject and body intact; its Message-ID is derived from the entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivers_with_headers_threading_and_unicode() {
    let stack = MailStack::start();
    let d = deployment(&stack, "", "");
    let outbox = d.process("cowboy-email-outbox", "mail");
    let mut store = d.store().await;
    let body = "Grüße, Bob — the report is ready ✓\nSecond line.";
    let id = store
        .xadd(
            "ann:mail:outbox",
            &[
                ("channel_id", b"bob@bridge.test"),
                ("content", body.as_bytes()),
                ("subject", "Überblick ✓".as_bytes()),
                ("reply_to", b"<orig.123@elsewhere.test>"),
            ],
        )
        .await
        .unwrap();
    let mails = wait_mails(&stack, "bob", 1).await;
    let m = &mails[0];
    assert_eq!(
        (m.from.as_str(), m.to.as_str()),
        ("bridge@bridge.test", "bob@bridge.test")
    );
    assert_eq!(m.subject, "Überblick ✓");
    assert_eq!(m.body.trim_end(), body);
    assert_eq!(m.in_reply_to, "orig.123@elsewhere.test");
    assert_eq!(m.references, ["orig.123@elsewhere.test"]);
    assert_eq!(
        m.message_id,
        email::verdict::entry_message_id(&delivery_key("ann:mail:outbox", &id), "bridge.test")
    );
    assert_eq!(outbox.stop(), Some(0));
    assert_eq!(
        harness::pending(&mut store, "ann:mail:outbox", "mail-outbox").await,
        0
    );
}

/// SMTP cannot deduplicate, so a send that may repeat an accepted one is never
/// made: it is reported uncertain with the Message-ID of the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_is_uncertain_and_never_sent_twice() {
    use broker::bridge::{Outgoing, SendError, Sender};
    let stack = MailStack::start();
    let d = deployment(&stack, "", "");
    let sender =
        email::send::EmailSender::new(email::settings(&d.config, "mail").unwrap(), "mail").unwrap();
    let message = broker::entry::Message {
        channel_id: "bob@bridge.test".into(),
        content: "once".into(),
        ..Default::default()
    };
    let out = |retry| Outgoing {
        message: &message,
        delivery_key: "mail:outbox/7-0",
        retry,
        approval: None,
    };
    let id = sender.send(out(false)).await.unwrap().external_id;
    // SMTP cannot deduplicate: a retry is reported uncertain, naming the Message-ID.
    match sender.send(out(true)).await {
        Err(SendError::Uncertain(why)) => assert!(why.contains(&id), "{why}"),
        other => panic!("a retry must be uncertain, got {other:?}"),
    }
    let mails = wait_mails(&stack, "bob", 1).await;
    assert_eq!(mails[0].message_id, id);
    assert_eq!(stack.mails("bob").len(), 1, "sent once");
}

/// A recipient the server refuses with 5xx is dead-lettered with the server's
/// reply, and the agent gets a notice; an address that does not parse never
/// reaches the server; the loop goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_recipient_is_dead_lettered() {
    let stack = MailStack::start();
    let d = deployment(&stack, "", "");
    let outbox = d.process("cowboy-email-outbox", "mail");
    let mut store = d.store().await;
    store
        .xadd(
            "ann:mail:outbox",
            &[("channel_id", b"carol@elsewhere.test"), ("content", b"hi")],
        )
        .await
        .unwrap();
    store
        .xadd(
            "ann:mail:outbox",
            &[("channel_id", b"bad@@bridge.test"), ("content", b"hi")],
        )
        .await
        .unwrap();
    store
        .xadd(
            "ann:mail:outbox",
            &[
                ("channel_id", b"bob@bridge.test"),
                ("content", b"still works"),
            ],
        )
        .await
        .unwrap();
    wait_mails(&stack, "bob", 1).await;
    let notices = wait_until("two notices", MAIL, || async {
        let n = inbox(&d, "ann:mail:inbox").await;
        (n.len() == 2).then_some(n)
    })
    .await;
    // Deliveries to different destinations run side by side: any order. The
    // server's refusal is a failed delivery; an address that does not parse is
    // refused before anything is sent (it is parsed with the sender's rules).
    assert!(
        notices
            .iter()
            .any(|n| n["status"] == "failed" && n["reason"].contains("554")),
        "{notices:?}"
    );
    assert!(
        notices.iter().any(|n| n["status"] == "invalid"
            && n["reason"].contains("bad@@bridge.test")
            && n["reason"].contains("not an email address")),
        "{notices:?}"
    );
    assert_eq!(stream(&mut store, "mail:dead").await.len(), 2);
    outbox.stop();
}

/// Inbound mail becomes an inbox entry, and the ping command runs for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbound_mail_reaches_the_inbox_and_pings() {
    let stack = MailStack::start();
    let d = deployment(&stack, "", "");
    let _ingest = d.process("cowboy-email-ingest", "mail");
    let _ping = d.process("cowboy-email-ping", "mail");
    stack.send_raw(
        "bob@bridge.test",
        "bridge@bridge.test",
        "From: Bob <bob@bridge.test>\r\nTo: bridge@bridge.test\r\nSubject: =?utf-8?q?Gr=C3=BC=C3=9Fe?=\r\nMessage-ID: <in.1@bridge.test>\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\nHallo =E2=9C=93\r\n",
        None,
    );
    let entry = wait_until("an inbox entry", MAIL, || async {
        inbox(&d, "mail:inbox").await.into_iter().next()
    })
    .await;
    assert_eq!(entry["kind"], "message");
    assert_eq!(entry["from"], "bob@bridge.test");
    assert_eq!(entry["subject"], "Grüße");
    assert_eq!(entry["message_id"], "in.1@bridge.test");
    assert_eq!(entry["content"].trim_end(), "Hallo ✓");
    wait_until("the handled mail flagged \\Seen", MAIL, || async {
        let dir = stack.dir.path().join("mail/bridge.test/bridge/Maildir/cur");
        std::fs::read_dir(dir)
            .ok()?
            .flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(",S"))
            .then_some(())
    })
    .await;
    wait_until("the ping command ran", MAIL, || async {
        std::fs::read_to_string(d.path("pinged"))
            .ok()
            .filter(|s| s.contains("Grüße"))
    })
    .await;
    let mut store = d.store().await;
    let beat = harness::hash(&mut store, &keys::heartbeat("mail")).await;
    wait_until("the platform check in the heartbeat", MAIL, || {
        let mut store = store.clone();
        async move {
            (harness::hash(&mut store, &keys::heartbeat("mail"))
                .await
                .get("platform")
                .map(String::as_str)
                == Some("ok"))
            .then_some(())
        }
    })
    .await;
    assert!(beat.contains_key("ingest"));
}

/// The approval email carries the full content and sha256; APPROVE from the
/// approver delivers once; REJECT gives the agent the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_by_email_reply() {
    let stack = MailStack::start();
    let d = deployment(&stack, APPROVAL, "");
    let _outbox = d.process("cowboy-email-outbox", "mail");
    let _ingest = d.process("cowboy-email-ingest", "mail");
    let mut store = d.store().await;
    let content = format!("Dear Bob,\n{}\nBye", "all the details ".repeat(40));
    store
        .xadd(
            "ann:mail:outbox",
            &[
                ("channel_id", b"bob@bridge.test"),
                ("content", content.as_bytes()),
                ("subject", b"Report"),
            ],
        )
        .await
        .unwrap();
    let notes = wait_mails(&stack, "approver", 1).await;
    let note = &notes[0];
    let marked: String = content.lines().map(|l| format!("| {l}\n")).collect();
    assert!(
        note.body.contains(&marked),
        "the complete content is shown, every line marked:\n{}",
        note.body
    );
    let message = broker::entry::Message {
        channel_id: "bob@bridge.test".into(),
        content: content.clone(),
        subject: Some("Report".into()),
        ..Default::default()
    };
    assert!(
        note.body.contains(&message.sha256()),
        "the whole-message digest"
    );
    assert!(
        note.body.contains("Subject:   Report"),
        "the subject is shown"
    );
    assert!(note.body.contains("APPROVE") && note.body.contains("REJECT"));
    assert!(note.message_id.starts_with("cowboy-approval."));
    stack.send_raw(
        "approver@bridge.test",
        "bridge@bridge.test",
        &reply(
            "approver@bridge.test",
            &note.message_id,
            "APPROVE\r\n\r\n> quoted notification",
        ),
        Some("approver"),
    );
    let sent = wait_mails(&stack, "bob", 1).await;
    assert_eq!(sent[0].body.trim_end(), content);

    store
        .xadd(
            "ann:mail:outbox",
            &[
                ("channel_id", b"bob@bridge.test"),
                ("content", b"second"),
                ("request_id", b"r2"),
            ],
        )
        .await
        .unwrap();
    let notes = wait_mails(&stack, "approver", 2).await;
    stack.send_raw(
        "approver@bridge.test",
        "bridge@bridge.test",
        &reply(
            "approver@bridge.test",
            &notes[1].message_id,
            "REJECT wrong person",
        ),
        Some("approver"),
    );
    let notice = wait_until("a rejection notice", MAIL, || async {
        inbox(&d, "ann:mail:inbox").await.into_iter().next()
    })
    .await;
    assert_eq!(
        (notice["status"].as_str(), notice["reason"].as_str()),
        ("rejected", "wrong person")
    );
    assert_eq!(notice["approver"], "email:approver@bridge.test");
    assert_eq!(notice["request_id"], "r2");
    assert_eq!(
        stack.mails("bob").len(),
        1,
        "delivered once, the rejected one never"
    );

    // An HTML-only reply, base64-encoded, approves too.
    store
        .xadd(
            "ann:mail:outbox",
            &[("channel_id", b"bob@bridge.test"), ("content", b"third")],
        )
        .await
        .unwrap();
    let notes = wait_mails(&stack, "approver", 3).await;
    let html = "<html><body><p>Approve</p><blockquote>REJECT</blockquote></body></html>";
    let raw = reply("approver@bridge.test", &notes[2].message_id, "").replace(
        "Content-Type: text/plain; charset=utf-8\r\n\r\n\r\n",
        &format!(
            "MIME-Version: 1.0\r\nContent-Type: text/html; charset=utf-8\r\nContent-Transfer-Encoding: base64\r\n\r\n{}\r\n",
            base64_encode(html.as_bytes())
        ),
    );
    stack.send_raw(
        "approver@bridge.test",
        "bridge@bridge.test",
        &raw,
        Some("approver"),
    );
    let sent = wait_mails(&stack, "bob", 2).await;
    assert_eq!(sent[1].body.trim_end(), "third");
    assert!(
        inbox(&d, "mail:inbox").await.is_empty(),
        "answers never reach the agent as mail"
    );
}

/// Answers that must decide nothing: a stranger's reply, a garbled verdict (which
/// gets a "not understood" answer), a forged reply with the right In-Reply-To from
/// a server that did not authenticate it, and a reply quoting the token in its body only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_that_decide_nothing() {
    let stack = MailStack::start();
    let d = deployment(&stack, APPROVAL, "");
    let _outbox = d.process("cowboy-email-outbox", "mail");
    let _ingest = d.process("cowboy-email-ingest", "mail");
    let mut store = d.store().await;
    store
        .xadd(
            "ann:mail:outbox",
            &[("channel_id", b"bob@bridge.test"), ("content", b"gated")],
        )
        .await
        .unwrap();
    let note = wait_mails(&stack, "approver", 1).await.remove(0);
    let id = note.message_id.clone();
    // A stranger, authenticated as themselves.
    stack.send_raw(
        "stranger@bridge.test",
        "bridge@bridge.test",
        &reply("stranger@bridge.test", &id, "APPROVE"),
        Some("stranger"),
    );
    // A forgery: the approver's address, the right In-Reply-To, no authentication.
    stack.send_raw(
        "approver@bridge.test",
        "bridge@bridge.test",
        &reply("approver@bridge.test", &id, "APPROVE"),
        None,
    );
    // Only the token quoted in a body, replying to something else.
    stack.send_raw("approver@bridge.test", "bridge@bridge.test", &format!("From: approver@bridge.test\r\nTo: bridge@bridge.test\r\nSubject: fwd\r\nIn-Reply-To: <other@bridge.test>\r\n\r\nAPPROVE\r\n> Message-ID: <{id}>\r\n"), Some("approver"));
    // The approver, garbled.
    stack.send_raw(
        "approver@bridge.test",
        "bridge@bridge.test",
        &reply("approver@bridge.test", &id, "sure, why not"),
        Some("approver"),
    );
    let answers = wait_mails(&stack, "approver", 2).await;
    assert!(
        answers[1].body.contains("not understood"),
        "{}",
        answers[1].body
    );
    assert!(!answers[1].in_reply_to.is_empty(), "the answer is threaded");
    // Everything above was handled (the ingest goes in order, and the garbled one was last).
    let mut record = HashMap::new();
    for id in approval::list_ids(&mut store).await.unwrap() {
        record = harness::hash(&mut store, &keys::approval(&id)).await;
    }
    assert_eq!(record["status"], "pending");
    assert!(!record.contains_key("approver"));
    assert!(stack.mails("bob").is_empty(), "nothing was sent");
    let inbound = inbox(&d, "mail:inbox").await;
    assert_eq!(
        inbound.len(),
        1,
        "only the forwarded mail reaches the agent: {inbound:?}"
    );
    assert_eq!(inbound[0]["subject"], "fwd");
}

/// A reply to an approval that has expired decides nothing and is not passed on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_to_an_expired_approval_is_ignored() {
    let stack = MailStack::start();
    let d = deployment(&stack, &APPROVAL.replace("timeout = 0", "timeout = 3"), "");
    let _outbox = d.process("cowboy-email-outbox", "mail");
    let _ingest = d.process("cowboy-email-ingest", "mail");
    let mut store = d.store().await;
    store
        .xadd(
            "ann:mail:outbox",
            &[("channel_id", b"bob@bridge.test"), ("content", b"too late")],
        )
        .await
        .unwrap();
    let note = wait_mails(&stack, "approver", 1).await.remove(0);
    let notice = wait_until("the expiry notice", MAIL, || async {
        inbox(&d, "ann:mail:inbox").await.into_iter().next()
    })
    .await;
    assert_eq!(notice["status"], "expired");
    stack.send_raw(
        "approver@bridge.test",
        "bridge@bridge.test",
        &reply("approver@bridge.test", &note.message_id, "APPROVE"),
        Some("approver"),
    );
    // A plain mail after it: once that is in the inbox, the late answer was handled.
    stack.send_raw(
        "bob@bridge.test",
        "bridge@bridge.test",
        "From: bob@bridge.test\r\nTo: bridge@bridge.test\r\nSubject: after\r\n\r\nx\r\n",
        None,
    );
    let entries = wait_until("the marker mail", MAIL, || async {
        let e = inbox(&d, "mail:inbox").await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0]["subject"], "after");
    assert!(stack.mails("bob").is_empty());
    assert!(approval::list_ids(&mut store).await.unwrap().is_empty());
}

/// The ingest survives a Dovecot restart, and its own restart resumes by UID
/// without handling any mail twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_resumes_after_restarts() {
    let stack = MailStack::start();
    let d = deployment(&stack, "", "");
    let send = |n: u32| {
        stack.send_raw("bob@bridge.test", "bridge@bridge.test", &format!("From: bob@bridge.test\r\nTo: bridge@bridge.test\r\nSubject: m{n}\r\n\r\nbody {n}\r\n"), None)
    };
    let count = |n: usize| {
        let d = &d;
        async move {
            wait_until(&format!("{n} inbox entries"), MAIL, || async {
                let e = inbox(d, "mail:inbox").await;
                (e.len() >= n).then_some(e)
            })
            .await
        }
    };
    let ingest = d.process("cowboy-email-ingest", "mail");
    send(1);
    count(1).await;
    stack.restart_dovecot();
    send(2);
    count(2).await;
    assert_eq!(ingest.stop(), Some(0));
    send(3);
    let _ingest: Process = d.process("cowboy-email-ingest", "mail");
    let entries = count(3).await;
    // Give a wrongly re-reading ingest the chance to show itself: a fourth mail
    // is handled after anything it would re-read.
    send(4);
    let entries4 = count(4).await;
    let subjects: Vec<&str> = entries4.iter().map(|e| e["subject"].as_str()).collect();
    assert_eq!(subjects, ["m1", "m2", "m3", "m4"], "each mail exactly once");
    assert_eq!(entries.len(), 3);
}

/// A day's outage: 5,000 mails of 16 KiB (80 MB in all) arrive while the
/// ingest is down. When it comes back each is read once, in the order they
/// arrived, and its memory stays flat: the ingest fetches one mail at a
/// time, so its peak resident size stays under 64 MiB, below the backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_of_5000_mails_is_read_once_each_with_flat_memory() {
    const BACKLOG: u64 = 5_000;
    let stack = MailStack::start();
    let d = deployment(&stack, "", "");
    let ingest = d.process("cowboy-email-ingest", "mail");
    stack.send_raw(
        "bob@bridge.test",
        "bridge@bridge.test",
        "From: bob@bridge.test\r\nTo: bridge@bridge.test\r\nSubject: before\r\n\r\nx\r\n",
        None,
    );
    wait_until("the first mail read", MAIL, || async {
        (inbox(&d, "mail:inbox").await.len() == 1).then_some(())
    })
    .await;
    assert_eq!(ingest.stop(), Some(0));
    let filler = "0123456789abcdef".repeat(1024);
    for n in 0..BACKLOG {
        let raw = format!(
            "From: bob@bridge.test\r\nTo: bridge@bridge.test\r\nSubject: m{n}\r\nMessage-ID: <m{n}@bridge.test>\r\n\r\n{filler}\r\n"
        );
        stack.deliver_directly("bridge", n, raw.as_bytes());
    }
    let ingest = d.process("cowboy-email-ingest", "mail");
    let entries = wait_until("the backlog read", Duration::from_secs(240), || async {
        let e = inbox(&d, "mail:inbox").await;
        (e.len() as u64 > BACKLOG).then_some(e)
    })
    .await;
    let peak_kib: u64 = std::fs::read_to_string(format!("/proc/{}/status", ingest.0.id()))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    let subjects: Vec<&str> = entries.iter().map(|e| e["subject"].as_str()).collect();
    let expected: Vec<String> = std::iter::once("before".to_string())
        .chain((0..BACKLOG).map(|n| format!("m{n}")))
        .collect();
    assert_eq!(subjects.len(), expected.len(), "each once");
    assert!(
        subjects.iter().zip(&expected).all(|(a, b)| a == b),
        "in order"
    );
    println!("backlog of {BACKLOG}: peak RSS {peak_kib} KiB");
    assert!(peak_kib < 64 * 1024, "peak RSS {peak_kib} KiB");
    assert_eq!(ingest.stop(), Some(0));
}

/// With `imap.move_to`, handled mail is moved to that folder (created if missing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handled_mail_can_be_moved() {
    let stack = MailStack::start();
    let settings = stack
        .bridge_settings()
        .replace("password_file =", "move_to = \"Handled\", password_file =");
    let d = Deployment::new(&format!(
        "[bridges.mail]\ntype = \"email\"\ndestinations = [\"*@bridge.test\"]\n{settings}"
    ));
    let _ingest = d.process("cowboy-email-ingest", "mail");
    stack.send_raw(
        "bob@bridge.test",
        "bridge@bridge.test",
        "From: bob@bridge.test\r\nTo: bridge@bridge.test\r\nSubject: move me\r\n\r\nx\r\n",
        None,
    );
    wait_until("an inbox entry", MAIL, || async {
        inbox(&d, "mail:inbox").await.into_iter().next()
    })
    .await;
    let folder = stack
        .dir
        .path()
        .join("mail/bridge.test/bridge/Maildir/.Handled");
    // A move is a copy and then an expunge, so the copy can be seen in Handled
    // a moment before the original leaves INBOX: wait for both.
    wait_until(
        "the mail in Handled and nothing left in INBOX",
        MAIL,
        || async {
            let count = |sub: &str| {
                std::fs::read_dir(folder.join(sub))
                    .map(|d| d.count())
                    .unwrap_or(0)
            };
            (count("new") + count("cur") == 1 && stack.mails("bridge").is_empty()).then_some(())
        },
    )
    .await;
}

/// A console bridge `desk` whose approvals go out by email to the approver
/// (`approval` keys besides the standard ones), with its outbox and mail's
/// services running.
fn desk_asking_by_email(stack: &MailStack, approval: &str) -> (Deployment, [Process; 3]) {
    let d = deployment(
        stack,
        "",
        &format!("[bridges.desk]\ntype = \"console\"\noutput = \"{{dir}}/desk.out\"\ninput = \"{{dir}}/desk.in\"\ndestinations = [\"*\"]\napproval = {{ required = true, notify = \"mail\", notify_channel = \"approver@bridge.test\", approvers = [\"email:approver@bridge.test\"], {approval} }}\n"),
    );
    let services = [
        d.process("cowboy-email-outbox", "mail"),
        d.process("cowboy-email-ingest", "mail"),
        d.process("cowboy-console-outbox", "desk"),
    ];
    (d, services)
}

/// Ann writes `content` to desk (to `ops`); returns the store.
async fn desk_gets(d: &Deployment, content: &str) -> TestStore {
    let mut store = d.store().await;
    store
        .xadd(
            "ann:desk:outbox",
            &[
                ("channel_id", b"ops".as_slice()),
                ("content", content.as_bytes()),
            ],
        )
        .await
        .unwrap();
    store
}

/// Approval across bridges: a console bridge whose approvals go out by email is
/// decided by an email reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_bridge_is_approved_by_email() {
    let stack = MailStack::start();
    let (d, _services) = desk_asking_by_email(&stack, "timeout = 0");
    desk_gets(&d, "via console").await;
    let note = wait_mails(&stack, "approver", 1).await.remove(0);
    assert!(note.body.contains("via console"));
    stack.send_raw(
        "approver@bridge.test",
        "bridge@bridge.test",
        &reply("approver@bridge.test", &note.message_id, "yes"),
        Some("approver"),
    );
    let sent = wait_until("console delivery", MAIL, || async {
        d.delivered("desk.out").first().cloned()
    })
    .await;
    assert_eq!(sent.content, "via console");
}

/// `approval.remind_after` on an email surface: once the approval has
/// waited that long, one reminder mail threaded under the approval email;
/// a reply to the reminder decides; no second reminder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_approval_is_reminded_by_mail_and_the_reminder_answers() {
    let stack = MailStack::start();
    let (d, _services) = desk_asking_by_email(&stack, "timeout = 600, remind_after = 1");
    let mut store = desk_gets(&d, "remind me").await;
    let mails = wait_mails(&stack, "approver", 2).await;
    let (note, reminder) = (&mails[0], &mails[1]);
    assert!(note.body.contains("remind me"));
    assert!(
        reminder.subject.starts_with("Reminder: approval needed")
            && reminder.body.contains("still waits")
            && !reminder.body.contains("remind me"),
        "{reminder:?}"
    );
    assert_eq!(
        reminder.in_reply_to, note.message_id,
        "threaded under the approval email"
    );
    stack.send_raw(
        "approver@bridge.test",
        "bridge@bridge.test",
        &reply_in_thread(reminder, "yes"),
        Some("approver"),
    );
    let sent = wait_until("console delivery", MAIL, || async {
        d.delivered("desk.out").first().cloned()
    })
    .await;
    assert_eq!(sent.content, "remind me");
    assert_eq!(stack.mails("approver").len(), 2, "reminded once");
    let trail = stream(&mut store, &keys::audit("desk")).await;
    assert_eq!(
        trail.iter().filter(|e| e["event"] == "reminded").count(),
        1,
        "{trail:?}"
    );
}

/// Mail written by machines never decides and is never answered: an
/// out-of-office "Ok" from the approver (`Auto-Submitted: auto-replied`) changes
/// nothing and gets no "not understood" mail, and a forged
/// `Authentication-Results` whose quoted value holds `; dkim=pass` does not pass.
/// The approval email says it is automatic (`Auto-Submitted: auto-generated`),
/// and so does the "not understood" answer (`auto-replied`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn automatic_and_forged_answers_decide_nothing() {
    let stack = MailStack::start();
    let d = deployment(&stack, APPROVAL, "");
    let _outbox = d.process("cowboy-email-outbox", "mail");
    let _ingest = d.process("cowboy-email-ingest", "mail");
    let mut store = d.store().await;
    store
        .xadd(
            "ann:mail:outbox",
            &[("channel_id", b"bob@bridge.test"), ("content", b"gated")],
        )
        .await
        .unwrap();
    let note = wait_mails(&stack, "approver", 1).await.remove(0);
    let id = note.message_id.clone();
    let raw_note = String::from_utf8_lossy(&stack.mails("approver")[0]).into_owned();
    assert!(
        raw_note.contains("Auto-Submitted: auto-generated"),
        "{raw_note}"
    );
    assert!(raw_note.contains("X-Auto-Response-Suppress: All"));
    let vacation = reply(
        "approver@bridge.test",
        &id,
        "Ok, I am out of the office until Monday.",
    )
    .replacen("\r\n", "\r\nAuto-Submitted: auto-replied\r\n", 1);
    stack.send_raw(
        "approver@bridge.test",
        "bridge@bridge.test",
        &vacation,
        Some("approver"),
    );
    let forged = reply("approver@bridge.test", &id, "APPROVE").replacen(
        "\r\n",
        "\r\nAuthentication-Results: mx.bridge.test; spf=fail smtp.mailfrom=\"x; dkim=pass header.d=bridge.test \"@evil.test\r\n",
        1,
    );
    stack.send_raw("approver@bridge.test", "bridge@bridge.test", &forged, None);
    // A garbled answer last: its "not understood" mail shows the ingest got this far.
    stack.send_raw(
        "approver@bridge.test",
        "bridge@bridge.test",
        &reply("approver@bridge.test", &id, "hmm, let me think"),
        Some("approver"),
    );
    let answers = wait_mails(&stack, "approver", 2).await;
    assert!(
        answers[1].body.contains("not understood"),
        "{}",
        answers[1].body
    );
    let raw_answer = String::from_utf8_lossy(&stack.mails("approver")[1]).into_owned();
    assert!(
        raw_answer.contains("Auto-Submitted: auto-replied"),
        "{raw_answer}"
    );
    let ids = approval::list_ids(&mut store).await.unwrap();
    let record = harness::hash(&mut store, &keys::approval(&ids[0])).await;
    assert_eq!(
        record["status"], "pending",
        "neither the robot nor the forgery decided"
    );
    let filter = broker::audit::Filter {
        approval: Some(ids[0].clone()),
        ..Default::default()
    };
    let trail = broker::audit::query(&mut store, &d.config, &filter)
        .await
        .unwrap();
    assert!(
        trail.iter().any(|e| e.event == "ignored"
            && e.get("why")
                .is_some_and(|w| w.starts_with("not authenticated"))),
        "the forgery is in the trail as ignored: {trail:#?}"
    );
    stack.send_raw(
        "approver@bridge.test",
        "bridge@bridge.test",
        &reply("approver@bridge.test", &id, "APPROVE"),
        Some("approver"),
    );
    wait_mails(&stack, "bob", 1).await;
    assert_eq!(
        stack.mails("approver").len(),
        2,
        "the vacation reply was never answered"
    );
}

/// A delivery whose attempt had begun when the outbox died (its in-flight mark
/// is there, the entry still pending) may have been accepted: after the restart
/// it is reported `uncertain` with its Message-ID and not sent again. An entry
/// that was read but never attempted is sent normally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_cut_off_mid_attempt_is_uncertain_not_resent() {
    let stack = MailStack::start();
    let d = deployment(&stack, "", "");
    let mut store = d.store().await;
    store
        .ensure_group("ann:mail:outbox", &keys::outbox_group("mail"))
        .await
        .unwrap();
    let started = store
        .xadd(
            "ann:mail:outbox",
            &[
                ("channel_id", b"bob@bridge.test"),
                ("content", b"maybe sent"),
            ],
        )
        .await
        .unwrap();
    let untried = store
        .xadd(
            "ann:mail:outbox",
            &[
                ("channel_id", b"bob@bridge.test"),
                ("content", b"never tried"),
            ],
        )
        .await
        .unwrap();
    // What the dead outbox left: both entries read (pending), one attempt begun.
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg(&[
            "GROUP",
            &keys::outbox_group("mail"),
            &keys::outbox_consumer("mail", keys::DEFAULT_WORKER),
            "STREAMS",
            "ann:mail:outbox",
            ">",
        ])
        .query_async(&mut store.conn)
        .await
        .unwrap();
    let dkey = delivery_key("ann:mail:outbox", &started);
    // Marked the way an earlier version did (one hash per bridge, a time):
    // moved beside its stream at start, and still found.
    let _: i64 =
        redis::AsyncCommands::hset(&mut store.conn, keys::legacy_in_flight("mail"), &dkey, 1)
            .await
            .unwrap();
    let _outbox = d.process("cowboy-email-outbox", "mail");
    let notice = wait_until("the uncertain notice", MAIL, || async {
        inbox(&d, "ann:mail:inbox").await.into_iter().next()
    })
    .await;
    assert_eq!(notice["status"], "uncertain");
    assert_eq!(notice["entry_id"], started);
    let message_id = email::verdict::entry_message_id(&dkey, "bridge.test");
    assert!(notice["reason"].contains(&message_id), "{notice:?}");
    let mails = wait_mails(&stack, "bob", 1).await;
    assert_eq!(mails[0].body.trim(), "never tried");
    wait_until("the entries acked", MAIL, || {
        let mut store = store.clone();
        async move {
            (harness::pending(&mut store, "ann:mail:outbox", "mail-outbox").await == 0)
                .then_some(())
        }
    })
    .await;
    assert_eq!(
        stack.mails("bob").len(),
        1,
        "the uncertain one was not sent"
    );
    // A mark goes in the round trip after its entry's ack: waited for.
    for key in [
        keys::legacy_in_flight("mail"),
        keys::in_flight_marks("ann:mail:outbox"),
    ] {
        wait_until(&format!("{key} emptied"), MAIL, || {
            let (mut store, key) = (store.clone(), key.clone());
            async move {
                harness::hash(&mut store, &key)
                    .await
                    .is_empty()
                    .then_some(())
            }
        })
        .await;
    }
    let _ = untried;
}

/// A DKIM signing key for `domain` (selector `sel`) and its DNS record.
fn dkim_key(domain: &str) -> (Vec<u8>, (String, String)) {
    use mail_auth::common::crypto::Ed25519Key;
    let der = Ed25519Key::generate_pkcs8().unwrap();
    let public = Ed25519Key::from_pkcs8_der(&der).unwrap().public_key();
    let txt = format!("v=DKIM1; k=ed25519; p={}", base64_encode(&public));
    (der, (format!("sel._domainkey.{domain}"), txt))
}

/// `raw` with a DKIM-Signature by `domain` in front.
fn dkim_sign(der: &[u8], domain: &str, raw: &str) -> String {
    use mail_auth::common::crypto::Ed25519Key;
    use mail_auth::common::headers::HeaderWriter;
    let key = Ed25519Key::from_pkcs8_der(der).unwrap();
    let signature = mail_auth::dkim::DkimSigner::from_key(key)
        .domain(domain)
        .selector("sel")
        .headers([
            "From",
            "To",
            "Subject",
            "Message-ID",
            "In-Reply-To",
            "References",
        ])
        .sign(raw.as_bytes())
        .unwrap();
    format!("{}{raw}", signature.to_header())
}

/// `verify = "dkim"`: the bridge checks answers itself against DNS (a real
/// dnsmasq on loopback serving the keys and a DMARC policy). Unsigned,
/// misaligned (signed by another domain) and tampered answers decide nothing;
/// a signed rejection rejects with its reason and a signed approval delivers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dkim_verified_answers_alone_decide() {
    let (good, good_txt) = dkim_key("bridge.test");
    let (evil, evil_txt) = dkim_key("evil.test");
    let dns = harness::dns::Dns::start(&[
        (&good_txt.0, &good_txt.1),
        (&evil_txt.0, &evil_txt.1),
        ("_dmarc.bridge.test", "v=DMARC1; p=reject"),
    ]);
    let stack = MailStack::start();
    let settings = format!(
        "approval = {{ required = true, notify = \"mail\", notify_channel = \"approver@bridge.test\", timeout = 0, approvers = [\"email:approver@bridge.test\"] }}\nverify = \"dkim\"\nresolver = \"{}\"\n",
        dns.addr()
    );
    let d = deployment(&stack, &settings, "");
    let _outbox = d.process("cowboy-email-outbox", "mail");
    let _ingest = d.process("cowboy-email-ingest", "mail");
    let mut store = d.store().await;
    let send = |raw: String| {
        stack.send_raw(
            "approver@bridge.test",
            "bridge@bridge.test",
            &raw,
            Some("approver"),
        )
    };
    store
        .xadd(
            "ann:mail:outbox",
            &[("channel_id", b"bob@bridge.test"), ("content", b"first")],
        )
        .await
        .unwrap();
    let first = wait_mails(&stack, "approver", 1).await.remove(0).message_id;
    send(reply("approver@bridge.test", &first, "APPROVE"));
    send(dkim_sign(
        &evil,
        "evil.test",
        &reply("approver@bridge.test", &first, "APPROVE"),
    ));
    send(
        dkim_sign(
            &good,
            "bridge.test",
            &reply("approver@bridge.test", &first, "REJECT x"),
        )
        .replace("REJECT x", "APPROVE"),
    );
    send(dkim_sign(
        &good,
        "bridge.test",
        &reply("approver@bridge.test", &first, "REJECT signed and sealed"),
    ));
    let notice = wait_until("the signed rejection", MAIL, || async {
        inbox(&d, "ann:mail:inbox").await.into_iter().next()
    })
    .await;
    assert_eq!(notice["status"], "rejected", "{notice:?}");
    assert_eq!(notice["reason"], "signed and sealed");
    store
        .xadd(
            "ann:mail:outbox",
            &[("channel_id", b"bob@bridge.test"), ("content", b"second")],
        )
        .await
        .unwrap();
    let second = wait_mails(&stack, "approver", 2).await.remove(1).message_id;
    send(dkim_sign(
        &good,
        "bridge.test",
        &reply("approver@bridge.test", &second, "APPROVE"),
    ));
    let sent = wait_mails(&stack, "bob", 1).await;
    assert_eq!(sent[0].body.trim(), "second");
    assert_eq!(stack.mails("bob").len(), 1, "the first was never sent");
}

/// The "not understood" mail is threaded under the approval email (its
/// `References` name the approval's Message-ID) and quotes what was read, so an
/// approver who answers that mail, as people do, still decides the approval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_to_the_not_understood_mail_decides() {
    let stack = MailStack::start();
    let d = deployment(&stack, APPROVAL, "");
    let _outbox = d.process("cowboy-email-outbox", "mail");
    let _ingest = d.process("cowboy-email-ingest", "mail");
    let mut store = d.store().await;
    store
        .xadd(
            "ann:mail:outbox",
            &[("channel_id", b"bob@bridge.test"), ("content", b"threaded")],
        )
        .await
        .unwrap();
    let approval_id = wait_mails(&stack, "approver", 1).await.remove(0).message_id;
    stack.send_raw(
        "approver@bridge.test",
        "bridge@bridge.test",
        &reply("approver@bridge.test", &approval_id, "hmm, let me think"),
        Some("approver"),
    );
    let answer = wait_mails(&stack, "approver", 2).await.remove(1);
    assert!(
        answer.body.contains("> hmm, let me think"),
        "{}",
        answer.body
    );
    assert!(
        answer.references.iter().any(|r| r.contains(&approval_id)),
        "threaded under the approval email: {:?}",
        answer.references
    );
    stack.send_raw(
        "approver@bridge.test",
        "bridge@bridge.test",
        &reply_in_thread(&answer, "APPROVE"),
        Some("approver"),
    );
    let sent = wait_mails(&stack, "bob", 1).await;
    assert_eq!(sent[0].body.trim(), "threaded");
    assert!(
        inbox(&d, "mail:inbox").await.is_empty(),
        "nothing reached the agent"
    );
}

/// TLS against a private CA, every mode: the services (real binaries) send over
/// SMTP STARTTLS and read over IMAP implicit TLS with `ca_file`; the library's
/// SMTP implicit TLS and IMAP STARTTLS do the same. A wrong CA and a wrong host
/// name are refused naming the host; a server without STARTTLS gets nothing and
/// the refusal is a failure, never `uncertain`; Postfix logged TLS for every
/// session that carried mail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_in_every_mode_with_a_private_ca() {
    use broker::bridge::{Outgoing, SendError, Sender};
    use email::config::{ImapSettings, SmtpSettings, Tls};
    let stack = MailStack::start_tls();
    let t = stack.tls.as_ref().unwrap();
    let password = stack.password_file("bridge");
    let d = Deployment::new(&format!(
        r#"
[agents.ann]

[bridges.mail]
type = "email"
destinations = ["*@bridge.test"]
from = "bridge@bridge.test"
smtp = {{ host = "localhost", port = {smtp}, tls = "starttls", ca_file = "{ca}" }}
imap = {{ host = "localhost", port = {imaps}, tls = "implicit", ca_file = "{ca}", username = "bridge@bridge.test", password_file = "{pw}" }}
"#,
        smtp = stack.smtp_port,
        imaps = t.imaps_port,
        ca = t.ca.display(),
        pw = password.display(),
    ));
    let outbox = d.process("cowboy-email-outbox", "mail");
    let ingest = d.process("cowboy-email-ingest", "mail");
    let mut store = d.store().await;
    store
        .xadd(
            "ann:mail:outbox",
            &[
                ("channel_id", b"bob@bridge.test"),
                ("content", b"over starttls"),
            ],
        )
        .await
        .unwrap();
    let mails = wait_mails(&stack, "bob", 1).await;
    assert_eq!(mails[0].body.trim_end(), "over starttls");
    stack.send_raw(
        "bob@bridge.test",
        "bridge@bridge.test",
        "From: bob@bridge.test\r\nTo: bridge@bridge.test\r\nSubject: hi\r\nMessage-ID: <tls.1@bridge.test>\r\n\r\nread over imaps\r\n",
        None,
    );
    let entry = wait_until("an inbox entry read over implicit TLS", MAIL, || async {
        inbox(&d, "mail:inbox").await.into_iter().next()
    })
    .await;
    assert_eq!(entry["content"].trim_end(), "read over imaps");
    assert_eq!(outbox.stop(), Some(0));
    assert_eq!(ingest.stop(), Some(0));

    // The other two modes, through the library.
    let mut settings = email::settings(&d.config, "mail").unwrap();
    let imap = |port, tls, host: &str, ca: &std::path::Path| ImapSettings {
        host: host.into(),
        port,
        tls,
        ca_file: Some(ca.to_path_buf()),
        ..settings.imap.clone()
    };
    let starttls = imap(stack.imap_port, Tls::Starttls, "localhost", &t.ca);
    let mut session = email::ingest::login(&starttls, "mail")
        .await
        .expect("IMAP STARTTLS with the private CA");
    session.logout().await.unwrap();
    for (settings, host) in [
        (
            imap(t.imaps_port, Tls::Implicit, "localhost", &t.other_ca),
            "localhost",
        ),
        (
            imap(stack.imap_port, Tls::Starttls, "localhost", &t.other_ca),
            "localhost",
        ),
        (
            imap(t.imaps_port, Tls::Implicit, "127.0.0.1", &t.ca),
            "127.0.0.1",
        ),
    ] {
        let err = email::ingest::login(&settings, "mail")
            .await
            .expect_err("a certificate that is not trusted for the host is refused")
            .to_string();
        assert!(err.contains(host) && err.contains("TLS"), "{err}");
    }

    let message = broker::entry::Message {
        channel_id: "bob@bridge.test".into(),
        content: "over implicit tls".into(),
        ..Default::default()
    };
    let send = |smtp: SmtpSettings| {
        let mut s = settings.clone();
        s.smtp = smtp;
        let message = &message;
        async move {
            let sender = email::send::EmailSender::new(s, "mail").unwrap();
            sender
                .send(Outgoing {
                    message,
                    delivery_key: "mail:outbox/1-0",
                    retry: false,
                    approval: None,
                })
                .await
        }
    };
    let smtp = |port, tls, host: &str, ca: &std::path::Path| SmtpSettings {
        host: host.into(),
        port,
        tls,
        ca_file: Some(ca.to_path_buf()),
        ..settings.smtp.clone()
    };
    send(smtp(t.smtps_port, Tls::Implicit, "localhost", &t.ca))
        .await
        .expect("SMTP implicit TLS with the private CA");
    for (smtp, host) in [
        (
            smtp(t.smtps_port, Tls::Implicit, "localhost", &t.other_ca),
            "localhost",
        ),
        (
            smtp(stack.smtp_port, Tls::Starttls, "127.0.0.1", &t.ca),
            "127.0.0.1",
        ),
    ] {
        match send(smtp).await {
            Err(SendError::Transient(why)) => assert!(why.contains(host), "{why}"),
            other => panic!("an untrusted certificate must be refused, got {other:?}"),
        }
    }
    match send(smtp(t.smtp_plain_port, Tls::Starttls, "localhost", &t.ca)).await {
        Err(SendError::Permanent(why)) => {
            assert!(
                why.contains("STARTTLS") && why.contains("localhost"),
                "{why}"
            )
        }
        other => panic!("no STARTTLS is a failure before hand-over, got {other:?}"),
    }
    let mails = wait_mails(&stack, "bob", 2).await;
    assert_eq!(mails[1].body.trim_end(), "over implicit tls");
    assert_eq!(stack.mails("bob").len(), 2, "nothing else reached bob");
    // Every session that carried mail from the bridge was encrypted.
    let log = stack.postfix_log();
    let tls_sessions = log
        .matches("TLS connection established from localhost")
        .count();
    assert!(tls_sessions >= 2, "{log}");
    settings.smtp.tls = Tls::None;
    settings.smtp.host = "mail.example.org".into();
    let err = settings.validate("mail").unwrap_err().to_string();
    assert!(
        err.contains("smtp.tls") && err.contains("allow_plaintext"),
        "{err}"
    );
}

/// Destinations are compared as the mail system will read them: a quoted
/// local part, `%` and `!` routing, and look-alike letters are refused (a glob
/// such as `*@bridge.test` would pass them); the approval address in another
/// case is still the approval address; a display name and an upper-case
/// domain are the plain mailbox, and approvers see both spellings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destinations_are_compared_as_the_mail_system_reads_them() {
    let stack = MailStack::start();
    let d = deployment(&stack, APPROVAL, "");
    let outbox = d.process("cowboy-email-outbox", "mail");
    let mut store = d.store().await;
    let refused = [
        ("\"approver\"@bridge.test", "quoted"),
        ("APPROVER@bridge.test", "where approval requests are shown"),
        ("bob%elsewhere.test@bridge.test", "`%` routing"),
        ("elsewhere.test!bob@bridge.test", "bang path"),
        ("b\u{043e}b@bridge.test", "non-ASCII"),
    ];
    for (to, _) in refused {
        store
            .xadd(
                "ann:mail:outbox",
                &[("channel_id", to.as_bytes()), ("content", b"look-alike")],
            )
            .await
            .unwrap();
    }
    store
        .xadd(
            "ann:mail:outbox",
            &[
                ("channel_id", "Bob <bob@BRIDGE.test>".as_bytes()),
                ("content", b"plain"),
            ],
        )
        .await
        .unwrap();
    let notices = wait_until("five refusals", MAIL, || async {
        let n = inbox(&d, "ann:mail:inbox").await;
        (n.len() >= refused.len()).then_some(n)
    })
    .await;
    for ((to, why), notice) in refused.iter().zip(&notices) {
        assert_eq!(notice["status"], "invalid", "{to}: {notice:?}");
        assert!(notice["reason"].contains(why), "{to}: {notice:?}");
    }
    let asked = wait_mails(&stack, "approver", 1).await;
    assert!(
        asked[0].body.contains("bob@bridge.test"),
        "{}",
        asked[0].body
    );
    assert!(
        asked[0]
            .body
            .contains("wrote the destination as `Bob <bob@BRIDGE.test>`"),
        "{}",
        asked[0].body
    );
    assert_eq!(outbox.stop(), Some(0));
    assert_eq!(stack.mails("approver").len(), 1, "only the approval email");
    assert!(
        stack.mails("bob").is_empty(),
        "nothing approved, nothing sent"
    );
}

/// A server without IDLE: the ingest polls every `poll_seconds` and finds new
/// mail each time, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_idle_the_ingest_polls() {
    let stack = MailStack::start_without_idle();
    let settings = stack.bridge_settings().replace(
        "tls = \"none\", username",
        "tls = \"none\", poll_seconds = 1, username",
    );
    assert!(settings.contains("poll_seconds = 1"), "{settings}");
    let d = Deployment::new(&format!(
        "[agents.ann]\n\n[bridges.mail]\ntype = \"email\"\ndestinations = [\"*@bridge.test\"]\n{settings}"
    ));
    let _ingest = d.process("cowboy-email-ingest", "mail");
    for n in 1..=2 {
        stack.send_raw(
            "bob@bridge.test",
            "bridge@bridge.test",
            &format!("From: bob@bridge.test\r\nTo: bridge@bridge.test\r\nSubject: poll {n}\r\nMessage-ID: <poll.{n}@bridge.test>\r\n\r\npolled {n}\r\n"),
            None,
        );
        wait_until(&format!("mail {n} read by polling"), MAIL, || async {
            let entries = inbox(&d, "mail:inbox").await;
            (entries.len() == n).then_some(entries)
        })
        .await;
    }
    let entries = inbox(&d, "mail:inbox").await;
    assert_eq!(entries[0]["subject"], "poll 1");
    assert_eq!(entries[1]["subject"], "poll 2");
    let log = std::fs::read_to_string(d.path("cowboy-email-ingest-mail.log")).unwrap();
    let opened = log
        .lines()
        .find(|l| l.contains("IMAP session open"))
        .unwrap_or_default();
    assert!(
        opened.trim_end().ends_with("false"),
        "IDLE was not offered: {log}"
    );
}

/// An SMTP server on loopback that cuts connections where it is told: the
/// first connection is closed at `RCPT TO` (before anything is handed over),
/// and a connection whose message contains `cut after` is closed once the
/// message was read whole, unanswered. What it accepted is kept.
struct CuttingSmtp {
    port: u16,
    accepted: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl CuttingSmtp {
    async fn start() -> CuttingSmtp {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = accepted.clone();
        let task = tokio::spawn(async move {
            let mut connections = 0;
            while let Ok((stream, _)) = listener.accept().await {
                connections += 1;
                let first = connections == 1;
                let kept = kept.clone();
                tokio::spawn(async move {
                    let (read, mut write) = stream.into_split();
                    let mut lines = BufReader::new(read).lines();
                    let _ = write.write_all(b"220 cutting ESMTP\r\n").await;
                    while let Ok(Some(line)) = lines.next_line().await {
                        let upper = line.to_ascii_uppercase();
                        let reply: &[u8] = if upper.starts_with("EHLO") {
                            b"250-cutting\r\n250 8BITMIME\r\n"
                        } else if upper.starts_with("RCPT") && first {
                            return; // cut before the hand-over
                        } else if upper.starts_with("DATA") {
                            let _ = write.write_all(b"354 go ahead\r\n").await;
                            let mut body = String::new();
                            while let Ok(Some(l)) = lines.next_line().await {
                                if l == "." {
                                    break;
                                }
                                body.push_str(&l);
                                body.push('\n');
                            }
                            if body.contains("cut after") {
                                return; // read whole, closed unanswered
                            }
                            kept.lock().unwrap().push(body);
                            b"250 queued\r\n"
                        } else if upper.starts_with("QUIT") {
                            let _ = write.write_all(b"221 bye\r\n").await;
                            return;
                        } else {
                            b"250 ok\r\n"
                        };
                        if write.write_all(reply).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        CuttingSmtp {
            port,
            accepted,
            task,
        }
    }
}

impl Drop for CuttingSmtp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A connection lost before the message was handed over (here at `RCPT TO`,
/// as when the server restarts) is retried and delivered once, never reported
/// `uncertain`; one lost after the whole message was written, with no reply,
/// is `uncertain` and not sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_lost_before_the_hand_over_is_retried_not_uncertain() {
    let smtp = CuttingSmtp::start().await;
    let d = Deployment::new(&format!(
        r#"
[agents.ann]

[bridges.mail]
type = "email"
destinations = ["*@bridge.test"]
from = "bridge@bridge.test"
smtp = {{ host = "127.0.0.1", port = {port}, tls = "none" }}
imap = {{ host = "127.0.0.1", port = 9, tls = "none", username = "bridge", password_file = "{{dir}}/imap" }}
"#,
        port = smtp.port
    ));
    std::fs::write(d.path("imap"), "unused\n").unwrap();
    let _outbox = d.process("cowboy-email-outbox", "mail");
    let mut store = d.store().await;
    let first = store
        .xadd(
            "ann:mail:outbox",
            &[("channel_id", b"bob@bridge.test"), ("content", b"first")],
        )
        .await
        .unwrap();
    wait_until(
        "the first delivery on a second connection",
        MAIL,
        || async { (!smtp.accepted.lock().unwrap().is_empty()).then_some(()) },
    )
    .await;
    let cut = store
        .xadd(
            "ann:mail:outbox",
            &[
                ("channel_id", b"bob@bridge.test"),
                ("content", b"cut after the last line"),
            ],
        )
        .await
        .unwrap();
    let notice = wait_until("the uncertain notice", MAIL, || async {
        inbox(&d, "ann:mail:inbox").await.into_iter().next()
    })
    .await;
    assert_eq!(
        (notice["status"].as_str(), notice["entry_id"].as_str()),
        ("uncertain", cut.as_str()),
        "{notice:?}"
    );
    let accepted = smtp.accepted.lock().unwrap().clone();
    assert_eq!(accepted.len(), 1, "{accepted:?}");
    assert!(accepted[0].contains("first"));
    assert_eq!(
        inbox(&d, "ann:mail:inbox").await.len(),
        1,
        "the first entry ({first}) is not reported uncertain"
    );
}
