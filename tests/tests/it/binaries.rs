//! The real binaries: the operator CLI and the console services as processes.

use std::process::{Command, Stdio};

use broker::keys;
use harness::TestStore;
use harness::{binary, wait_until, Deployment};
use serde_json::json;

use crate::{approval_config, SOON};

fn text(o: &std::process::Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The whole loop with every service a separate process: `cowboy send`, park,
/// a ✅ line in the notify bridge's input file, delivery; `cowboy status` sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loop_runs_with_real_processes() {
    let d = Deployment::new(&approval_config(0));
    let mut children = Vec::new();
    for (service, bridge) in [
        ("outbox", "mail"),
        ("outbox", "desk"),
        ("ingest", "desk"),
        ("ping", "desk"),
    ] {
        children.push(
            Command::new(binary(&format!("cowboy-console-{service}")))
                .args(["--bridge", bridge])
                .env("COWBOY_CONFIG", &d.config_path)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
    }
    let out = d.cowboy(&[
        "send",
        "--bridge",
        "mail",
        "--agent",
        "ann",
        "--channel",
        "bob@example.org",
        "--content",
        "from the cli",
    ]);
    assert!(out.status.success(), "{:?}", text(&out));
    let note = wait_until("a notification", SOON, || async {
        d.delivered("desk.out").first().cloned()
    })
    .await;
    let scans = |info: String| -> u64 {
        info.lines()
            .find(|l| l.starts_with("cmdstat_scan:"))
            .and_then(|l| l.split("calls=").nth(1)?.split(',').next()?.parse().ok())
            .unwrap_or(0)
    };
    let mut store = d.store().await;
    let info = |store: &mut TestStore| {
        let mut conn = store.conn.clone();
        async move {
            redis::cmd("INFO")
                .arg("commandstats")
                .query_async::<String>(&mut conn)
                .await
                .unwrap()
        }
    };
    let scans_before = scans(info(&mut store).await);
    let list = d.cowboy(&["approvals", "list"]);
    let (stdout, _) = text(&list);
    let id = note.approval_id.clone().unwrap();
    assert!(stdout.starts_with(&id), "list starts with the id: {stdout}");
    let show = d.cowboy(&["approvals", "show", &id[..8]]);
    assert!(text(&show).0.contains("from the cli"), "{:?}", text(&show));
    // The pending index answers: the keyspace is never scanned.
    assert_eq!(scans(info(&mut store).await), scans_before, "no SCAN");
    d.write_input(
        "desk.in",
        json!({"kind": "reaction", "message_id": note.external_id, "emoji": "✅", "user": "boss"}),
    );
    let sent = wait_until("delivery", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    assert_eq!(sent.content, "from the cli");
    let status = wait_until(
        "status shows all three desk services alive",
        SOON,
        || async {
            let (s, _) = text(&d.cowboy(&["status"]));
            let desk = s.split("bridge mail").next().unwrap_or("").to_string();
            (desk.matches("alive").count() == 3).then_some(s)
        },
    )
    .await;
    assert!(status.contains("ann:mail:outbox"), "{status}");
    for mut c in children {
        // SIGTERM: each service finishes what it holds and exits 0.
        Command::new("kill")
            .arg(c.id().to_string())
            .status()
            .unwrap();
        let code = c.wait().unwrap();
        assert!(code.success(), "graceful exit, got {code}");
    }
}

/// `approvals show|approve|reject` take any unambiguous id prefix; an ambiguous or
/// unknown one is an error with a non-zero exit, and nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_ids_by_prefix() {
    let d = Deployment::new(&approval_config(0));
    let mut store = d.store().await;
    // Two records whose ids share a prefix, written (and indexed) as the outbox would.
    // Ids as the outbox makes them: a UUID ending with the bridge's tag.
    let tag = keys::approval_tag("mail");
    let abc1 = format!("abc11111-1111-4111-8111-1111{tag}");
    let abc2 = format!("abc22222-2222-4222-8222-2222{tag}");
    for id in [&abc1, &abc2] {
        let _: () = redis::AsyncCommands::hset_multiple(
            &mut store.conn,
            keys::approval(id),
            &[
                ("status", "pending"),
                ("source", "mail"),
                ("expires_at", "0"),
                ("channel_id", "x"),
                ("stream", "ann:mail:outbox"),
                ("entry_id", "1-0"),
            ],
        )
        .await
        .unwrap();
        let _: i64 = redis::AsyncCommands::zadd(&mut store.conn, keys::pending("mail"), id, 1)
            .await
            .unwrap();
    }
    let ambiguous = d.cowboy(&["approvals", "approve", "abc", "--as", "op"]);
    assert!(!ambiguous.status.success());
    assert!(
        text(&ambiguous).1.contains("ambiguous"),
        "{:?}",
        text(&ambiguous)
    );
    let unknown = d.cowboy(&["approvals", "show", "zzz"]);
    assert!(!unknown.status.success());
    assert!(text(&unknown).1.contains("no approval matches"));
    let stranger = d.cowboy(&["approvals", "approve", "abc1", "--as", "eve"]);
    assert!(!stranger.status.success(), "cli:eve is not an approver");
    assert_eq!(
        harness::hash(&mut store, &keys::approval(&abc1)).await["status"],
        "pending"
    );
    let show = d.cowboy(&["approvals", "show", "abc1"]);
    assert!(
        text(&show).0.contains(&format!("approval {abc1}")),
        "{:?}",
        text(&show)
    );
    let reject = d.cowboy(&[
        "approvals",
        "reject",
        "abc2",
        "--as",
        "op",
        "--reason",
        "no",
    ]);
    assert!(reject.status.success(), "{:?}", text(&reject));
    let rec = harness::hash(&mut store, &keys::approval(&abc2)).await;
    assert_eq!(
        (
            rec["status"].as_str(),
            rec["approver"].as_str(),
            rec["reason"].as_str()
        ),
        ("rejected", "cli:op", "no")
    );
    let again = d.cowboy(&["approvals", "approve", "abc2", "--as", "op"]);
    assert!(
        !again.status.success(),
        "a decided approval cannot be decided again"
    );
}

/// `cowboy` exits as the services do where the cause is the same: 78 for a
/// refused configuration (plain `redis://` to another host), 69 when Redis is
/// away, 1 for a request that cannot be met (an unknown approval), 2 for a
/// malformed one (as clap's own usage errors).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_exits_like_the_services() {
    let mut d = Deployment::new(&crate::approval_config(3600));
    let unknown = d.cowboy(&["approvals", "show", "zzz"]);
    assert_eq!(unknown.status.code(), Some(1), "{:?}", text(&unknown));
    let malformed = d.cowboy(&["audit", "--since", "last tuesday"]);
    assert_eq!(malformed.status.code(), Some(2), "{:?}", text(&malformed));
    let remote = d.path("remote.toml");
    let body = std::fs::read_to_string(&d.config_path)
        .unwrap()
        .replace(&d.redis.url(), "redis://192.0.2.1:6379");
    std::fs::write(&remote, body).unwrap();
    let out = Command::new(binary("cowboy"))
        .arg("--config")
        .arg(&remote)
        .arg("status")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78), "{:?}", text(&out));
    assert!(text(&out).1.contains("redis.url"), "{:?}", text(&out));
    d.redis.kill();
    let away = d.cowboy(&["status"]);
    assert_eq!(away.status.code(), Some(69), "{:?}", text(&away));
}

/// Bad config fails at start-up with exit code 78 and the offending key named.
#[test]
fn bad_config_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("[bridges.a]\ntype = \"fax\"\n", "bridges.a.type"),
        ("[bridges.a]\ntype = \"console\"\noutput = \"o\"\ninput = \"i\"\napproval = { notify = \"ghost\" }\n", "bridges.a.approval.notify"),
        ("[bridges.a]\ntype = \"console\"\noutput = \"o\"\ninput = \"i\"\napproval = { required = true, approvers = [\"cli:x\"] }\n", "bridges.a.approval.notify_channel"),
        ("[bridges.a]\ntype = \"console\"\noutput = \"o\"\ninput = \"i\"\ncolour = \"red\"\n", "colour"),
        ("[bridges.a]\ntype = \"console\"\ninput = \"i\"\n", "output"),
        ("[bridges.a]\ntype = \"console\"\noutput = \"o\"\ninput = \"i\"\n[bridges.a.approval]\ntimeout = \"soon\"\n", "timeout"),
    ];
    for (body, key) in cases {
        let path = dir.path().join("c.toml");
        std::fs::write(&path, body).unwrap();
        let out = Command::new(binary("cowboy-console-outbox"))
            .args(["--bridge", "a", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{body}: {stderr}");
        assert!(
            stderr.contains(key),
            "{body}: stderr does not name {key}: {stderr}"
        );
    }
}
