//! The services tell their supervisor the truth: a harness that implements the
//! systemd notify socket runs the real binary (through `cowboy service`, as the
//! unit templates do).

use std::collections::HashSet;
use std::os::unix::net::UnixDatagram;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use broker::outbox::delivery_key;
use harness::{binary, Deployment};

/// A notify socket and what arrived on it.
struct Supervisor {
    socket: UnixDatagram,
    path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Supervisor {
    fn new() -> Supervisor {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let socket = UnixDatagram::bind(&path).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        Supervisor {
            socket,
            path,
            _dir: dir,
        }
    }

    fn start(&self, d: &Deployment, service: &str, bridge: &str) -> Child {
        Command::new(binary("cowboy"))
            .args(["--config"])
            .arg(&d.config_path)
            .args(["service", service, "--bridge", bridge])
            .env("NOTIFY_SOCKET", &self.path)
            .env("WATCHDOG_USEC", "600000")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }

    /// Waits for a message equal to `want`, returning everything seen until then.
    fn wait_for(&self, want: &str, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while Instant::now() < deadline {
            if let Ok(n) = self.socket.recv(&mut buf) {
                let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
                let done = msg.lines().any(|l| l == want);
                seen.push(msg);
                if done {
                    return seen;
                }
            }
        }
        panic!("no {want} within {timeout:?}; saw {seen:?}");
    }
}

fn config() -> &'static str {
    "[bridges.mail]\ntype = \"console\"\noutput = \"{dir}/mail.out\"\ninput = \"{dir}/mail.in\"\ndestinations = [\"*\"]\n"
}

async fn group_info(d: &Deployment) -> Option<(u64, u64)> {
    let mut store = d.store().await;
    let groups: redis::RedisResult<Vec<std::collections::HashMap<String, redis::Value>>> =
        redis::cmd("XINFO")
            .arg(&["GROUPS", "mail:outbox"])
            .query_async(&mut store.conn)
            .await;
    let g = groups
        .ok()?
        .into_iter()
        .find(|g| g.get("name") == Some(&redis::Value::BulkString(b"mail-outbox".to_vec())))?;
    let num = |k: &str| match g.get(k) {
        Some(redis::Value::Int(n)) => *n as u64,
        _ => 0,
    };
    Some((num("entries-read"), num("pending")))
}

/// READY=1 comes after the group exists, WATCHDOG=1 keeps coming, and SIGTERM
/// sends STOPPING=1 and leaves every entry either delivered and acked, or
/// undelivered and unacked; a restart then delivers the rest exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_watchdog_and_a_clean_stop() {
    let d = Deployment::new(config());
    let sup = Supervisor::new();
    let mut child = sup.start(&d, "outbox", "mail");
    sup.wait_for("READY=1", Duration::from_secs(20));
    assert!(
        group_info(&d).await.is_some(),
        "the consumer group exists when READY=1 arrives"
    );
    for _ in 0..3 {
        // Each wait panics unless another WATCHDOG=1 arrives within 2 s.
        sup.wait_for("WATCHDOG=1", Duration::from_secs(2));
    }

    let mut store = d.store().await;
    let total = 1000;
    let mut ids = Vec::new();
    for i in 0..total {
        ids.push(
            store
                .xadd(
                    "mail:outbox",
                    &[
                        ("channel_id", b"c"),
                        ("content", format!("m{i}").as_bytes()),
                    ],
                )
                .await
                .unwrap(),
        );
    }
    // Stop in the middle of the batch.
    harness::wait_until("some deliveries", crate::SOON, || async {
        (!d.delivered("mail.out").is_empty()).then_some(())
    })
    .await;
    Command::new("kill")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    sup.wait_for("STOPPING=1", Duration::from_secs(10));
    assert!(child.wait().unwrap().success(), "graceful exit code 0");

    let delivered: HashSet<String> = d
        .delivered("mail.out")
        .into_iter()
        .map(|l| l.external_id)
        .collect();
    let (read, pending) = group_info(&d).await.unwrap();
    let acked = read - pending;
    assert_eq!(
        delivered.len() as u64,
        acked,
        "delivered == acked (read {read}, pending {pending})"
    );
    for (i, id) in ids.iter().enumerate() {
        let ext = console::send::external_id(&delivery_key("mail:outbox", id));
        assert_eq!(
            delivered.contains(&ext),
            (i as u64) < acked,
            "entry {i} is delivered iff acked"
        );
    }

    let mut child = sup.start(&d, "outbox", "mail");
    // Only a service that said READY=1 has its signal handlers (the first may
    // have delivered everything already, so the wait below can pass at once).
    sup.wait_for("READY=1", Duration::from_secs(10));
    harness::wait_until("all delivered after restart", crate::SOON, || async {
        (d.delivered("mail.out").len() == total).then_some(())
    })
    .await;
    Command::new("kill")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "second stop: {status}");
    let unique: HashSet<String> = d
        .delivered("mail.out")
        .into_iter()
        .map(|l| l.content)
        .collect();
    assert_eq!(unique.len(), total, "each entry exactly once");
}

/// A bad config exits with the config code through the dispatcher too, and an
/// unknown service is refused.
#[test]
fn the_dispatcher_reports_bad_config() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(
        &path,
        "[bridges.mail]\ntype = \"console\"\noutput = \"o\"\n",
    )
    .unwrap();
    let out = Command::new(binary("cowboy"))
        .arg("--config")
        .arg(&path)
        .args(["service", "outbox", "--bridge", "mail"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(78),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("input"));
    let out = Command::new(binary("cowboy"))
        .arg("--config")
        .arg(&path)
        .args(["service", "dance", "--bridge", "mail"])
        .output()
        .unwrap();
    // No such service: a malformed command (clap's usage code), not a config error.
    assert_eq!(out.status.code(), Some(2));
}
