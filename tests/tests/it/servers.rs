//! The servers the gate runs on, beyond one plain `redis-server`: Redis over
//! TLS with a private CA. (Valkey runs the ACL and approval-flow tests of
//! `acl.rs`.)

use broker::config::RedisConfig;
use broker::{Error, Store};
use harness::{Deployment, RedisServer};

use crate::approval::{agent_sends, approval_services, first_sent, notification, react};
use crate::approval_config;

/// Every service reaches a TLS-only Redis through `rediss://` with the
/// private CA in `redis.ca_file`: an approval is parked, shown, approved and
/// sent. The same server under another CA is refused at once, as a
/// configuration error naming the server; `redis://` to a host that is not
/// loopback is refused before anything is sent, naming `redis.url`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls_with_a_private_ca() {
    let redis = RedisServer::start_tls();
    let (ca, other) = redis.ca();
    assert!(redis.url().starts_with("rediss://"));
    let d = Deployment::build(
        redis,
        &format!("ca_file = \"{}\"", ca.display()),
        &approval_config(3600),
    );
    let services = approval_services(&d);
    agent_sends(&d, "over tls", "r1").await;
    let (_, card) = notification(&d, 0).await;
    react(&d, &card, "✅", "boss", "");
    assert_eq!(first_sent(&d).await.content, "over tls");
    for s in services {
        s.stop().await.unwrap();
    }

    let wrong = RedisConfig {
        ca_file: Some(other),
        ..d.config.redis.clone()
    };
    match Store::connect(&wrong).await {
        Err(Error::Config(e)) => {
            let text = e.to_string();
            assert!(
                text.contains("redis.ca_file") && text.contains("127.0.0.1:"),
                "{text}"
            );
        }
        Err(e) => panic!("not a configuration error: {e}"),
        Ok(_) => panic!("an untrusted certificate was accepted"),
    }
    let plain = RedisConfig {
        url: "redis://192.0.2.1:6379".into(),
        ca_file: None,
        ..d.config.redis.clone()
    };
    match Store::connect(&plain).await {
        Err(Error::Config(e)) => assert!(e.to_string().contains("redis.url"), "{e}"),
        Err(e) => panic!("not a configuration error: {e}"),
        Ok(_) => panic!("plain TCP to another host was allowed"),
    }
}
