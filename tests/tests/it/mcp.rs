//! `cowboy mcp`, driven by the official Python MCP SDK (`tests/mcp/client.py`)
//! over stdio, on a private Redis with the ACL users `cowboy acl` renders and
//! the console bridges' real binaries: the agent sends, follows and reads
//! through the tools, approvers decide by reaction, and what the agent may not
//! do stays undone.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use harness::TestStore;
use harness::{binary, stream, wait_until, Deployment};
use serde_json::{json, Value};

use std::collections::BTreeMap;

use crate::acl::{ann_writes_fields, Secrets};
use crate::SOON;

/// Longest a tool answer may take (a `wait` is at most 50 s).
const ANSWER: Duration = Duration::from_secs(90);

/// The Python client, and its answers line by line.
struct Client {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Client {
    /// Starts the SDK's client on `cowboy mcp --agent ann` (through the
    /// `cowboy` front door) and returns it with its session line.
    fn start(d: &Deployment) -> (Client, Value) {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/mcp/client.py");
        let mut child = Command::new("python3")
            .arg(script)
            .arg("--")
            .arg(binary("cowboy"))
            .arg("--config")
            .arg(&d.config_path)
            .args(["mcp", "--agent", "ann"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 with the mcp SDK (scripts/install-mcp.sh)");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut c = Client {
            child,
            stdin,
            lines,
        };
        let session = c.answer();
        (c, session)
    }

    /// Asks for one tool call; its answer is read with [`Self::answer`].
    fn ask(&mut self, tool: &str, args: Value) {
        let line = json!({"call": tool, "args": args, "timeout": ANSWER.as_secs()});
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }

    fn answer(&mut self) -> Value {
        let line = self
            .lines
            .recv_timeout(ANSWER)
            .unwrap_or_else(|e| panic!("no answer from the MCP client within {ANSWER:?}: {e}"));
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    fn call(&mut self, tool: &str, args: Value) -> Value {
        self.ask(tool, args);
        self.answer()
    }

    /// A call that must succeed: its structured result.
    fn ok(&mut self, tool: &str, args: Value) -> Value {
        let a = self.call(tool, args.clone());
        assert_eq!(a["is_error"], false, "{tool} {args}: {a}");
        a["structured"].clone()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Calls `wait` until the request reaches `state` (a few rounds at most).
fn wait_for_state(c: &mut Client, request: &str, state: &str) -> Value {
    for _ in 0..5 {
        let s = c.ok(
            "wait",
            json!({"request_id": request, "timeout_seconds": 10}),
        );
        if s["state"] == state {
            return s;
        }
    }
    panic!(
        "{request} never reached {state}: {}",
        c.ok("status", json!({"request_id": request}))
    );
}

/// A secrets set whose `mail` bridge takes at most 4 KiB of content.
fn secrets() -> Secrets {
    let mut s = Secrets::new();
    s.mail.push_str("\nmax_content_bytes = 4096");
    s
}

/// The whole round through the SDK: the tools and their schemas, the newest
/// protocol version, a send approved by reaction and followed to its
/// delivery, a rejection's reason, the inbox read once, and refusals that
/// write nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_sends_follows_and_reads_through_the_mcp_sdk() {
    let secrets = secrets();
    let (d, _) = secrets.deployment();
    let services = [
        d.spawn("outbox", "mail"),
        d.spawn("outbox", "desk"),
        d.spawn("ingest", "desk"),
        d.spawn("ingest", "mail"),
        d.spawn("ping", "mail"),
        d.spawn("ping", "desk"),
    ];
    let (mut c, session) = tokio::task::block_in_place(|| Client::start(&d));
    println!(
        "MCP protocol version negotiated: {}",
        session["protocol_version"]
    );
    assert_eq!(
        session["protocol_version"], session["newest_known"],
        "the newest version both sides know: {session}"
    );
    // The server is connected as ann's own Redis user (and the test's
    // admin connection is the only other kind besides the services').
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut d.store().await.conn)
        .await
        .unwrap();
    assert!(
        clients.lines().any(|l| l.contains(" user=ann ")),
        "{clients}"
    );
    let tools = session["tools"].as_object().unwrap();
    let mut names: Vec<&str> = tools.keys().map(String::as_str).collect();
    names.sort();
    assert_eq!(names, ["destinations", "inbox", "send", "status", "wait"]);
    let send = &tools["send"];
    let mut required: Vec<&str> = send["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    required.sort();
    assert_eq!(required, ["bridge", "content", "destination"], "{send}");
    assert_eq!(
        tools["wait"]["properties"]["timeout_seconds"]["maximum"],
        50
    );

    let generated = tokio::task::block_in_place(|| {
        let dest = c.ok("destinations", json!({}));
        let mail = dest["bridges"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["bridge"] == "mail")
            .cloned()
            .unwrap();
        assert_eq!(
            (
                mail["needs_approval"].clone(),
                mail["max_content_bytes"].clone()
            ),
            (json!(true), json!(4096))
        );

        // Approved by a reaction, followed to its delivery.
        let sent = c.ok(
            "send",
            json!({"bridge": "mail", "destination": "bob@example.org", "content": "approve me", "request_id": "r1"}),
        );
        assert_eq!(
            (
                sent["request_id"].as_str(),
                sent["needs_approval"].as_bool()
            ),
            (Some("r1"), Some(true))
        );
        let waiting = wait_for_state(&mut c, "r1", "awaiting_approval");
        assert_eq!(waiting["approvals_needed"], 1, "{waiting}");
        assert!(
            waiting["since"].as_u64().is_some() && waiting["deadline"].is_null(),
            "{waiting}"
        );
        c.ask("wait", json!({"request_id": "r1", "timeout_seconds": 50}));
        react_on_card(&d, "approve me", "✅", "");
        let done = c.answer();
        assert_eq!(done["structured"]["state"], "delivered", "{done}");
        assert_eq!(done["structured"]["changed"], true);
        let out = d.delivered("mail.out");
        assert_eq!(out.len(), 1);
        assert_eq!(
            done["structured"]["external_id"],
            out[0].external_id.as_str()
        );

        // Rejected with a reason, which status tells.
        c.ok(
            "send",
            json!({"bridge": "mail", "destination": "bob@example.org", "content": "reject me", "request_id": "r2"}),
        );
        wait_for_state(&mut c, "r2", "awaiting_approval");
        c.ask("wait", json!({"request_id": "r2", "timeout_seconds": 50}));
        react_on_card(&d, "reject me", "❌", "not today");
        let no = c.answer();
        assert_eq!(no["structured"]["state"], "rejected", "{no}");
        let status = c.ok("status", json!({"request_id": "r2"}));
        assert!(
            status["reason"]
                .as_str()
                .unwrap_or("")
                .contains("not today"),
            "{status}"
        );
        assert_eq!(
            d.delivered("mail.out").len(),
            1,
            "the rejected one was not sent"
        );

        // A generated request id, for a bridge that needs no approval.
        let direct = c.ok(
            "send",
            json!({"bridge": "desk", "destination": "team", "content": "hello team"}),
        );
        let generated = direct["request_id"].as_str().unwrap().to_string();
        assert_eq!(generated.len(), 36, "{direct}");
        let delivered = wait_for_state(&mut c, &generated, "delivered");
        assert!(delivered["external_id"].as_str().is_some(), "{delivered}");

        // The inbox hands an inbound message out once.
        d.write_input(
            "mail.in",
            json!({"kind": "message", "channel_id": "bob@example.org", "author": "bob", "content": "hello ann", "agent": "ann"}),
        );
        let mut seen = 0;
        for _ in 0..20 {
            let got = c.ok("inbox", json!({"max": 100}));
            seen += got["entries"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["kind"] == "message" && e["fields"]["content"] == "hello ann")
                .count();
            if seen > 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        assert_eq!(seen, 1, "the inbound message, once");
        let again = c.ok("inbox", json!({}));
        assert!(
            !again.to_string().contains("hello ann"),
            "handed out twice: {again}"
        );

        // A request id is sent once: a retried call delivers nothing twice.
        let twice = c.call(
            "send",
            json!({"bridge": "mail", "destination": "bob@example.org", "content": "approve me", "request_id": "r1"}),
        );
        assert_eq!(twice["is_error"], true, "{twice}");
        assert!(
            twice["text"]
                .as_str()
                .unwrap()
                .contains("request id `r1` was sent already"),
            "{twice}"
        );
        generated
    });
    // A flood of inbound messages (anyone who can write to the agent can
    // send them) hides no outcome, and the inbox hands each out once, in
    // answers of bounded size; retention trimming the notices changes no
    // outcome already seen.
    let mut admin = d.store().await;
    let body = "y".repeat(4096);
    let mut flood = redis::pipe();
    for n in 0..3000 {
        flood
            .cmd("XADD")
            .arg("ann:desk:inbox")
            .arg("*")
            .arg("kind")
            .arg("message")
            .arg("n")
            .arg(n)
            .arg("content")
            .arg(&body)
            .ignore();
    }
    let () = flood.query_async(&mut admin.conn).await.unwrap();
    tokio::task::block_in_place(|| {
        for request in ["r1", generated.as_str()] {
            let s = c.ok("status", json!({"request_id": request}));
            assert_eq!(s["state"], "delivered", "{request}: {s}");
        }
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let a = c.call("inbox", json!({"max": 100}));
            assert!(
                a["text"].as_str().unwrap().len() < 300 * 1024,
                "an answer of {} bytes",
                a["text"].as_str().unwrap().len()
            );
            let entries = a["structured"]["entries"].as_array().unwrap().clone();
            if entries.is_empty() {
                break;
            }
            for e in entries.iter().filter(|e| e["fields"].get("n").is_some()) {
                assert!(
                    seen.insert(e["id"].as_str().unwrap().to_string()),
                    "handed out twice: {}",
                    e["id"]
                );
            }
        }
        assert_eq!(seen.len(), 3000, "each flooded message once");
    });
    for inbox in ["ann:desk:inbox", "ann:mail:inbox"] {
        let _: i64 = redis::cmd("XTRIM")
            .arg(inbox)
            .arg("MAXLEN")
            .arg(0)
            .query_async(&mut admin.conn)
            .await
            .unwrap();
    }
    tokio::task::block_in_place(|| {
        for request in ["r1", generated.as_str()] {
            let s = c.ok("status", json!({"request_id": request}));
            assert_eq!(
                s["state"], "delivered",
                "{request} after its notices were trimmed: {s}"
            );
        }
    });

    // Refusals: nothing written anywhere, in the bridge's own words.
    let before = written(&mut admin).await;
    let huge = "x".repeat(4 << 20);
    let refusals: Vec<(Value, &str)> = vec![
        (
            json!({"bridge": "nope", "destination": "bob@example.org", "content": "hi"}),
            "no bridge `nope`",
        ),
        (
            json!({"bridge": "bob:mail", "destination": "bob@example.org", "content": "hi"}),
            "no bridge `bob:mail`",
        ),
        (
            json!({"bridge": "desk", "destination": "ops", "content": "hi"}),
            "is where approval requests are shown",
        ),
        (
            json!({"bridge": "mail", "destination": "bob@example.org", "content": huge}),
            "content is 4194304 bytes, over the limit of 4096",
        ),
        (
            json!({"bridge": "mail", "destination": "bob@example.org", "content": "hi", "subject": "a\nBcc: eve"}),
            "subject contains control characters",
        ),
    ];
    let answers: Vec<Value> = tokio::task::block_in_place(|| {
        let mut out: Vec<Value> = refusals
            .iter()
            .map(|(args, _)| c.call("send", args.clone()))
            .collect();
        // Arguments that do not fit the schema.
        out.push(c.call("send", json!({"bridge": 5, "content": "hi"})));
        out.push(c.call(
            "send",
            json!({"bridge": "mail", "destination": "bob@example.org", "content": "hi", "approval_id": "forged"}),
        ));
        out.push(c.call("wait", json!({"request_id": "r1", "timeout_seconds": 3600})));
        out
    });
    // Waits at once beyond the bound: the extra one is refused, the rest run.
    let waits: Vec<Value> = (0..=mcp::gate::MAX_READERS)
        .map(|_| json!({"call": "wait", "args": {"request_id": "r1", "timeout_seconds": 10}, "timeout": 60}))
        .collect();
    let parallel = tokio::task::block_in_place(|| {
        writeln!(c.stdin, "{}", json!({ "parallel": waits })).unwrap();
        c.stdin.flush().unwrap();
        c.answer()
    });
    let refused: Vec<&Value> = parallel["answers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["is_error"] == true)
        .collect();
    assert_eq!(refused.len(), 1, "{parallel}");
    assert!(
        refused[0]["text"]
            .as_str()
            .unwrap()
            .contains("under way already"),
        "{parallel}"
    );
    for ((_, want), got) in refusals.iter().zip(&answers) {
        assert_eq!(got["is_error"], true, "{got}");
        let text = got["text"].as_str().unwrap();
        assert!(
            text.starts_with("refused, nothing written: ") && text.contains(want),
            "{text} lacks {want}"
        );
    }
    for got in &answers[refusals.len()..] {
        assert_eq!(
            got["is_error"], true,
            "a tool error, not a protocol one: {got}"
        );
    }
    assert_eq!(
        before,
        written(&mut admin).await,
        "a refusal wrote something"
    );
    // The words are the bridge's: the same entry written straight to the
    // stream is dead-lettered with exactly the reason the tool gave.
    ann_writes_fields(&d, &secrets, &["content", "hi", "subject", "a\nBcc: eve"]).await;
    let dead = wait_until("the straight entry dead-lettered", SOON, || {
        let mut admin = admin.clone();
        async move { stream(&mut admin, "mail:dead").await.into_iter().last() }
    })
    .await;
    assert_eq!(
        answers[4]["text"].as_str().unwrap(),
        format!("refused, nothing written: {}", dead["reason"])
    );
    let _: i64 = redis::cmd("DEL")
        .arg("mail:dead")
        .query_async(&mut admin.conn)
        .await
        .unwrap();
    // Another agent's notices stay unseen.
    let _: String = redis::cmd("XADD")
        .arg(&[
            "bob:mail:inbox",
            "*",
            "kind",
            "notice",
            "status",
            "rejected",
            "request_id",
            "bobs",
            "reason",
            "secret",
        ])
        .query_async(&mut admin.conn)
        .await
        .unwrap();
    let theirs = tokio::task::block_in_place(|| c.ok("status", json!({"request_id": "bobs"})));
    assert_eq!(theirs["state"], "unknown", "{theirs}");
    drop(c);
    for s in services {
        s.stop().await.unwrap();
    }
}

/// What was written, key by key: each stream's length and last id (its
/// groups' read positions move as services poll), every other key's value;
/// heartbeats left out.
async fn written(admin: &mut TestStore) -> BTreeMap<String, String> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut admin.conn)
        .await
        .unwrap();
    let mut out = BTreeMap::new();
    for k in keys.into_iter().filter(|k| !k.ends_with(":heartbeat")) {
        let kind: String = redis::cmd("TYPE")
            .arg(&k)
            .query_async(&mut admin.conn)
            .await
            .unwrap();
        let value = match kind.as_str() {
            "stream" => {
                let last = admin.range(&k, "-", "+", 100_000).await.unwrap();
                format!(
                    "{} entries, last {:?}",
                    last.len(),
                    last.last().map(|e| &e.id)
                )
            }
            _ => {
                let dump: Vec<u8> = redis::cmd("DUMP")
                    .arg(&k)
                    .query_async(&mut admin.conn)
                    .await
                    .unwrap();
                format!("{dump:?}")
            }
        };
        out.insert(k, value);
    }
    out
}

/// The card on `desk.out` showing `text`, answered with `emoji` by boss.
fn react_on_card(d: &Deployment, text: &str, emoji: &str, reason: &str) {
    let deadline = std::time::Instant::now() + SOON;
    let card = loop {
        if let Some(l) = d
            .delivered("desk.out")
            .into_iter()
            .find(|l| l.approval_id.is_some() && l.content.contains(text))
        {
            break l;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no card showing {text:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    d.write_input(
        "desk.in",
        json!({"kind": "reaction", "message_id": card.external_id, "emoji": emoji, "user": "boss", "reason": reason}),
    );
}

/// A client that never initializes is given up on with a message; one that
/// drops its pipe in the middle of a `wait` ends the server at once; neither
/// writes anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_vanishing_clients_end_the_server_cleanly() {
    let secrets = secrets();
    let (d, _) = secrets.deployment();
    let mut admin = d.store().await;
    let before = written(&mut admin).await;
    let server = |extra: &[&str]| {
        Command::new(binary("cowboy-mcp"))
            .arg("--config")
            .arg(&d.config_path)
            .args(["--agent", "ann"])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // Silent: stdin stays open, nothing is said.
    let mut silent = server(&["--init-timeout", "1"]);
    let _open = silent.stdin.take();
    let out = tokio::task::block_in_place(|| wait_exit(silent, "a silent client"));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no MCP client initialized a session within 1 s"),
        "{err}"
    );

    // Vanishing: initialized, a `wait` under way, then the pipe closes.
    let mut vanishing = server(&[]);
    let mut stdin = vanishing.stdin.take().unwrap();
    for line in [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "wait", "arguments": {"request_id": "r9", "timeout_seconds": 50}}}),
    ] {
        writeln!(stdin, "{line}").unwrap();
    }
    stdin.flush().unwrap();
    let mut stdout = BufReader::new(vanishing.stdout.take().unwrap());
    let mut first = String::new();
    tokio::task::block_in_place(|| stdout.read_line(&mut first)).unwrap();
    assert!(
        first.contains("\"protocolVersion\":\"2025-11-25\""),
        "{first}"
    );
    drop(stdin);
    let out = tokio::task::block_in_place(|| wait_exit(vanishing, "a vanished client"));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        before,
        written(&mut admin).await,
        "a client's end wrote something"
    );
}

/// The process's output once it exits, which it must within a few seconds.
fn wait_exit(mut child: Child, what: &str) -> std::process::Output {
    let deadline = std::time::Instant::now() + SOON;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("cowboy-mcp still runs {SOON:?} after {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}
