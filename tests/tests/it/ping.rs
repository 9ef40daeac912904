//! The ping service: one wake per burst, ack only after success, retry on failure.

use broker::keys;
use harness::{pending, wait_until, Deployment};

use crate::SOON;

fn config(command: &str) -> String {
    format!(
        "[agents.ann]\n[bridges.mail]\ntype = \"console\"\noutput = \"{{dir}}/mail.out\"\ninput = \"{{dir}}/mail.in\"\nping = {{ command = [\"sh\", \"-c\", {command:?}], debounce_ms = 200 }}\n"
    )
}

/// A burst of entries wakes the agent once, with the newest entry's fields in the
/// environment, and everything is acked afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_runs_the_command_once() {
    let dir = tempfile::tempdir().unwrap();
    let runs_file = dir.path().join("runs");
    let d = Deployment::new(&config(&format!(
        "echo \"$COWBOY_AGENT $COWBOY_COUNT $COWBOY_FIELD_CONTENT\" >> {}",
        runs_file.display()
    )));
    let runs = || -> Vec<String> {
        std::fs::read_to_string(&runs_file)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    };
    let mut store = d.store().await;
    for i in 0..5 {
        store
            .xadd(
                "ann:mail:inbox",
                &[
                    ("kind", b"message"),
                    ("content", format!("m{i}").as_bytes()),
                ],
            )
            .await
            .unwrap();
    }
    let ping = d.spawn("ping", "mail");
    wait_until("one run", SOON, || async {
        (!runs().is_empty()).then_some(())
    })
    .await;
    wait_until("all acked", SOON, || {
        let mut store = store.clone();
        async move { (pending(&mut store, "ann:mail:inbox", "mail-ping").await == 0).then_some(()) }
    })
    .await;
    // A second burst while running: still one run per burst.
    for i in 5..8 {
        store
            .xadd(
                "ann:mail:inbox",
                &[
                    ("kind", b"message"),
                    ("content", format!("m{i}").as_bytes()),
                ],
            )
            .await
            .unwrap();
    }
    wait_until("a second run", SOON, || async {
        (runs().len() == 2).then_some(())
    })
    .await;
    ping.stop().await.unwrap();
    assert_eq!(runs(), ["ann 5 m4", "ann 3 m7"]);
    let beat = harness::hash(&mut store, &keys::heartbeat("mail")).await;
    assert!(beat.contains_key("ping"), "liveness published: {beat:?}");
}

/// A failing command leaves the entries pending and is retried until it succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_command_is_retried_before_acking() {
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("ok");
    let log = dir.path().join("attempts");
    let cmd = format!(
        "echo x >> {log}; test -e {flag}",
        log = log.display(),
        flag = flag.display()
    );
    let d = Deployment::new(&config(&cmd));
    let mut store = d.store().await;
    store
        .xadd("mail:inbox", &[("kind", b"message"), ("content", b"hello")])
        .await
        .unwrap();
    let ping = d.spawn("ping", "mail");
    let attempts = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .count()
    };
    wait_until("two failed attempts", SOON, || async {
        (attempts() >= 2).then_some(())
    })
    .await;
    assert_eq!(
        pending(&mut store, "mail:inbox", "mail-ping").await,
        1,
        "not acked while failing"
    );
    std::fs::write(&flag, "").unwrap();
    wait_until("acked after success", SOON, || {
        let mut store = store.clone();
        async move { (pending(&mut store, "mail:inbox", "mail-ping").await == 0).then_some(()) }
    })
    .await;
    ping.stop().await.unwrap();
}
