//! Answers shaped like the common mail clients' (one file per client style in
//! `tests/corpus/email/`), each sent as a reply through the real Postfix into
//! the real Dovecot and read by the real ingest.

use std::collections::HashMap;
use std::path::PathBuf;

use broker::keys;
use harness::mail::MailStack;
use harness::{hash, wait_until};

use crate::email::{deployment, reply_in_thread, wait_mails, APPROVAL, MAIL};
use harness::inbox;

struct Case {
    name: String,
    client: String,
    expect: String,
    template: String,
}

fn corpus() -> Vec<Case> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus/email");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "eml"))
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|p| {
            let template = std::fs::read_to_string(&p).unwrap();
            let header = |h: &str| {
                template
                    .lines()
                    .find_map(|l| l.strip_prefix(&format!("{h}: ")))
                    .unwrap_or_else(|| panic!("{} has no {h}", p.display()))
                    .to_string()
            };
            Case {
                name: p.file_stem().unwrap().to_string_lossy().into_owned(),
                client: header("X-Corpus-Client"),
                expect: header("X-Corpus-Expect"),
                template,
            }
        })
        .collect()
}

/// Every approve style approves once, every reject style rejects with exactly
/// the reason written, quoted-only, signature-only, ambiguous and conditional
/// answers decide nothing and get a threaded "not understood" reply (whose
/// answer then decides), a vacation reply decides nothing and is not
/// answered, and nothing is delivered twice. Prints client style × outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_of_every_client_style_are_read_as_written() {
    let cases = corpus();
    let stack = MailStack::start();
    let d = deployment(&stack, APPROVAL, "");
    let _outbox = d.process("cowboy-email-outbox", "mail");
    let _ingest = d.process("cowboy-email-ingest", "mail");
    let mut store = d.store().await;
    for (i, c) in cases.iter().enumerate() {
        let content = format!("corpus item {i:02} end");
        store
            .xadd(
                "ann:mail:outbox",
                &[
                    ("channel_id", b"bob@bridge.test" as &[u8]),
                    ("content", content.as_bytes()),
                    ("request_id", c.name.as_bytes()),
                ],
            )
            .await
            .unwrap();
    }
    let approvals = wait_mails(&stack, "approver", cases.len()).await;
    let mut replies: Vec<String> = Vec::new();
    let mut approval_ids = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let marker = format!("corpus item {i:02} end");
        let mail = approvals
            .iter()
            .find(|m| m.body.contains(&marker))
            .unwrap_or_else(|| panic!("no approval email for {}", c.name));
        let id = format!(
            "corpus-{i:02}-{}@bridge.test",
            uuid::Uuid::new_v4().simple()
        );
        let raw = c
            .template
            .replace("{FROM}", "approver@bridge.test")
            .replace("{SUBJECT}", &mail.subject)
            .replace("{ID}", &id)
            .replace("{APPROVAL_ID}", mail.message_id.trim_matches(['<', '>']))
            .replace('\n', "\r\n");
        stack.send_raw(
            "approver@bridge.test",
            "bridge@bridge.test",
            &raw,
            Some("approver"),
        );
        replies.push(id);
        approval_ids.push(mail.message_id.trim_matches(['<', '>']).to_string());
    }
    let approves = cases.iter().filter(|c| c.expect == "approve").count();
    let rejects = cases
        .iter()
        .filter(|c| c.expect.starts_with("reject"))
        .count();
    let nothing = cases.iter().filter(|c| c.expect == "nothing").count();
    let sent = wait_mails(&stack, "bob", approves).await;
    let notices = wait_until("a notice for every rejection", MAIL, || async {
        let n: Vec<HashMap<String, String>> = inbox(&d, "ann:mail:inbox")
            .await
            .into_iter()
            .filter(|n| n["status"] == "rejected")
            .collect();
        (n.len() >= rejects).then_some(n)
    })
    .await;
    let mails = wait_mails(&stack, "approver", cases.len() + nothing).await;
    let answered = |reply: &str| {
        mails
            .iter()
            .find(|m| m.in_reply_to.trim_matches(['<', '>']) == reply)
    };

    let mut table = format!("\n{:<76}{:<58}got\n", "client style", "expected");
    let mut wrong = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let marker = format!("corpus item {i:02} end");
        let delivered = sent.iter().filter(|m| m.body.trim() == marker).count();
        let notice = notices
            .iter()
            .find(|n| n.get("request_id") == Some(&c.name));
        let not_understood = answered(&replies[i]);
        let got = match (delivered, notice, not_understood) {
            (1, None, None) => "approve".to_string(),
            (0, Some(n), None) => format!("reject: {}", n["reason"]),
            (0, None, Some(_)) => "nothing".to_string(),
            (0, None, None) => "ignored".to_string(),
            other => format!(
                "{} delivered, notice {:?}, reply {}",
                other.0,
                other.1.map(|n| n["reason"].clone()),
                other.2.is_some()
            ),
        };
        table.push_str(&format!(
            "{:<76}{:<58}{}\n",
            format!("{} ({})", c.client, c.name),
            c.expect,
            got
        ));
        if got != c.expect {
            wrong.push(c.name.clone());
        }
    }
    println!("{table}");
    assert!(
        wrong.is_empty(),
        "read differently than written: {wrong:?}{table}"
    );

    // What decided nothing is still pending; its "not understood" reply is
    // threaded under the approval email and explains why.
    let ambiguous = cases
        .iter()
        .position(|c| c.name.contains("ambiguous"))
        .unwrap();
    let explain = answered(&replies[ambiguous]).unwrap();
    assert!(
        explain.body.contains("both approve and reject"),
        "{}",
        explain.body
    );
    assert!(explain
        .references
        .iter()
        .any(|r| r.contains(&approval_ids[ambiguous])));
    let vacation = cases.iter().position(|c| c.expect == "ignored").unwrap();
    let ids = broker::approval::pending_ids(&mut store, &d.config)
        .await
        .unwrap();
    let pending: Vec<String> = {
        let mut p = Vec::new();
        for id in ids {
            let r = hash(&mut store, &keys::approval(&id)).await;
            if r.get("status").map(String::as_str) == Some("pending") {
                p.push(r["request_id"].clone());
            }
        }
        p
    };
    assert!(
        pending.contains(&cases[vacation].name),
        "the vacation reply decided nothing"
    );

    // The answer to the "not understood" mail decides.
    stack.send_raw(
        "approver@bridge.test",
        "bridge@bridge.test",
        &reply_in_thread(
            explain,
            "Approve\n\nOn Mon, Cowboy wrote:\n> not understood",
        ),
        Some("approver"),
    );
    let sent = wait_mails(&stack, "bob", approves + 1).await;
    let marker = format!("corpus item {ambiguous:02} end");
    assert_eq!(sent.iter().filter(|m| m.body.trim() == marker).count(), 1);
    assert_eq!(sent.len(), approves + 1, "nothing delivered twice");
}
