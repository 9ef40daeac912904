//! Per-agent and per-service Redis ACLs, on a private redis-server started with
//! the users file `cowboy acl` renders (the `default` user off).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use broker::acl::{self, Expect};
use broker::config::Service;
use broker::{keys, Config};
use harness::TestStore;
use harness::{binary, stream, wait_until, Deployment, Engine, RedisServer};
use serde_json::json;

use crate::SOON;

/// Password files for the operator, two agents and every service of two bridges,
/// and the config body that names them.
pub(crate) struct Secrets {
    dir: tempfile::TempDir,
    /// The `desk` bridge's own lines (type and settings); console by default.
    desk: String,
    /// The `mail` bridge's own lines (type and settings); console by default.
    pub(crate) mail: String,
    /// Who may approve `mail`'s messages.
    approvers: String,
    /// More config (e.g. `[operators]` tables).
    extra: String,
    /// More keys of `mail`'s approval table (e.g. `, quorum = 2`).
    approval_extra: String,
    /// The server the users file is loaded into.
    engine: Engine,
}

impl Secrets {
    pub(crate) fn new() -> Secrets {
        Secrets::with_desk(
            "type = \"console\"\noutput = \"{dir}/desk.out\"\ninput = \"{dir}/desk.in\"",
            "console:boss",
        )
    }

    fn with_desk(desk: &str, approver: &str) -> Secrets {
        let dir = tempfile::tempdir().unwrap();
        let mut users = vec!["admin".to_string(), "ann".into(), "bob".into()];
        for b in ["mail", "desk"] {
            for s in Service::ALL {
                users.push(keys::service_user(b, s.as_str()));
            }
        }
        for u in users {
            std::fs::write(
                dir.path().join(&u),
                format!("pw-{u}-{}\n", std::process::id()),
            )
            .unwrap();
        }
        Secrets {
            dir,
            desk: desk.to_string(),
            mail: "type = \"console\"\noutput = \"{dir}/mail.out\"\ninput = \"{dir}/mail.in\""
                .into(),
            approvers: format!("\"{approver}\""),
            extra: String::new(),
            approval_extra: String::new(),
            engine: Engine::under_test(),
        }
    }

    pub(crate) fn file(&self, user: &str) -> String {
        self.dir.path().join(user).display().to_string()
    }

    fn redis_extra(&self) -> String {
        format!(
            "username = \"admin\"\npassword_file = \"{}\"\n",
            self.file("admin")
        )
    }

    fn body(&self) -> String {
        let services = |b: &str| {
            format!(
                "redis_password_files = {{ ingest = \"{}\", outbox = \"{}\", ping = \"{}\" }}",
                self.file(&keys::service_user(b, "ingest")),
                self.file(&keys::service_user(b, "outbox")),
                self.file(&keys::service_user(b, "ping")),
            )
        };
        format!(
            r#"
[agents.ann]
password_file = "{ann}"

[agents.bob]
password_file = "{bob}"

[bridges.mail]
{mail_settings}
destinations = ["*"]
approval = {{ required = true, notify = "desk", notify_channel = "{channel}", timeout = 0, approvers = [{approvers}]{approval_extra} }}
{mail}

[bridges.desk]
{desk_settings}
destinations = ["*"]
{desk}

{extra}
"#,
            extra = self.extra,
            ann = self.file("ann"),
            bob = self.file("bob"),
            mail = services("mail"),
            desk = services("desk"),
            desk_settings = self.desk,
            mail_settings = self.mail,
            approvers = self.approvers,
            approval_extra = self.approval_extra,
            channel = if self.desk.contains("discord") {
                "222222222222222222"
            } else if self.desk.contains("slack") {
                "C0OPS0001"
            } else {
                "ops"
            },
        )
    }

    /// Renders the users file and starts a server with it.
    fn start_redis(&self) -> (RedisServer, String) {
        let text = format!(
            "[redis]\n{}\n{}",
            self.redis_extra(),
            self.body().replace("{dir}", "/nonexistent")
        );
        let config = Config::parse(&text).unwrap();
        let aclfile = acl::render(&config, acl::Format::Aclfile).unwrap();
        let path = self.dir.path().join("users.acl");
        std::fs::write(&path, &aclfile).unwrap();
        let redis = RedisServer::start_on(
            self.engine,
            &[
                "--aclfile",
                path.to_str().unwrap(),
                "--enable-debug-command",
                "yes",
            ],
        );
        (redis, aclfile)
    }

    pub(crate) fn deployment(&self) -> (Deployment, String) {
        let (redis, aclfile) = self.start_redis();
        (
            Deployment::build(redis, &self.redis_extra(), &self.body()),
            aclfile,
        )
    }
}

/// Waits for what agent `ann` reads of `ann:mail:inbox` through its own group
/// (`ann`) with its own connection.
async fn notice_for_ann(ann: &redis::aio::MultiplexedConnection, what: &str) -> redis::Value {
    wait_until(what, SOON, || {
        let mut ann = ann.clone();
        async move {
            let v: redis::Value = redis::cmd("XREADGROUP")
                .arg(&[
                    "GROUP",
                    "ann",
                    "ann-1",
                    "COUNT",
                    "10",
                    "STREAMS",
                    "ann:mail:inbox",
                    ">",
                ])
                .query_async(&mut ann)
                .await
                .unwrap();
            (v != redis::Value::Nil).then_some(v)
        }
    })
    .await
}

/// Every key and its serialized value, for "state unchanged" assertions.
async fn snapshot(admin: &mut TestStore, skip: &dyn Fn(&str) -> bool) -> BTreeMap<String, Vec<u8>> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut admin.conn)
        .await
        .unwrap();
    let mut out = BTreeMap::new();
    for k in keys.into_iter().filter(|k| !skip(k)) {
        let dump: Vec<u8> = redis::cmd("DUMP")
            .arg(&k)
            .query_async(&mut admin.conn)
            .await
            .unwrap();
        out.insert(k, dump);
    }
    out
}

async fn seed_state(admin: &mut TestStore) {
    let _: () = redis::AsyncCommands::hset_multiple(
        &mut admin.conn,
        keys::approval("00000000-0000-4000-8000-000000000000"),
        &[
            ("status", "pending"),
            ("source", "mail"),
            ("expires_at", "0"),
        ],
    )
    .await
    .unwrap();
    let _: () = redis::AsyncCommands::hset(&mut admin.conn, keys::approval_map("mail"), "ext", "x")
        .await
        .unwrap();
    for key in [
        "mail:outbox",
        "ann:mail:outbox",
        "bob:mail:outbox",
        "bob:mail:inbox",
    ] {
        admin.ensure_group(key, "mail-outbox").await.unwrap();
        admin
            .xadd(key, &[("channel_id", b"c"), ("content", b"seed")])
            .await
            .unwrap();
    }
    admin.ensure_group("bob:mail:inbox", "ann").await.unwrap();
}

/// The rendered users file: `default` off, no comment lines, no passwords, hashes only.
#[test]
fn the_users_file_holds_no_secrets() {
    let secrets = Secrets::new();
    let (_redis, aclfile) = secrets.start_redis();
    assert!(
        aclfile.lines().any(|l| l.starts_with("user default off")),
        "{aclfile}"
    );
    assert!(
        aclfile.lines().all(|l| l.starts_with("user ")),
        "only user lines: {aclfile}"
    );
    assert!(!aclfile.contains("pw-"), "a password leaked: {aclfile}");
    let ann_hash =
        broker::approval::sha256_hex(format!("pw-ann-{}", std::process::id()).as_bytes());
    assert!(aclfile.contains(&format!("user ann on #{ann_hash} ")));
    for u in [
        "cowboy-mail-outbox",
        "cowboy-desk-ingest",
        "cowboy-desk-ping",
        "admin",
    ] {
        assert!(aclfile.contains(&format!("user {u} on #")), "{u} missing");
    }
}

/// An agent can XADD its outbox and read and ack its inbox, and every forbidden
/// command of issue 5's list fails with NOPERM, leaving Redis state unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_reaches_its_own_streams_and_nothing_else() {
    let secrets = Secrets::new();
    let (d, _) = secrets.deployment();
    let mut admin = d.store().await;
    seed_state(&mut admin).await;
    let probe_keys = |k: &str| k.contains("cowboy-acl-check");
    let before = snapshot(&mut admin, &probe_keys).await;
    admin
        .ensure_group(&acl::probe_inbox("ann"), "ann")
        .await
        .unwrap();
    admin
        .xadd(&acl::probe_inbox("ann"), &[("kind", b"message")])
        .await
        .unwrap();

    let mut ann = acl::connect_as(&d.config, "ann", Path::new(&secrets.file("ann")))
        .await
        .unwrap();
    let probes = acl::agent_probes("ann", "bob", "mail");
    assert!(probes.len() > 60, "the whole forbidden list is probed");
    let mut surprises = Vec::new();
    for p in &probes {
        let v = acl::run_probe(p, &mut ann, &mut admin, true).await;
        if !v.as_expected {
            surprises.push(format!("{:?} -> {}", p.args, v.got));
        }
        if p.expect == Expect::Refused {
            assert_eq!(v.got, "NOPERM", "{:?} must fail with NOPERM", p.args);
        }
    }
    assert!(
        surprises.is_empty(),
        "unexpected permissions: {surprises:#?}"
    );
    // XACK of the inbox entry its allowed XREADGROUP probe read.
    let inbox = acl::probe_inbox("ann");
    let first = admin.range(&inbox, "-", "+", 1).await.unwrap()[0]
        .id
        .clone();
    let acked: i64 = redis::cmd("XACK")
        .arg(&inbox)
        .arg("ann")
        .arg(&first)
        .query_async(&mut ann)
        .await
        .unwrap();
    assert_eq!(acked, 1, "the agent acks its own inbox entry");
    let after = snapshot(&mut admin, &probe_keys).await;
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>(),
        "no key created or deleted"
    );
    assert!(before == after, "no value changed by a refused command");
}

/// Each service user can do its job's commands and not the forbidden ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_service_user_has_only_what_its_job_needs() {
    service_users_hold_only_their_jobs(Engine::Redis).await;
}

/// The same on Valkey 8: the rendered rules (selectors, read- and
/// write-only key patterns) mean there what they mean on Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_valkey_each_service_user_has_only_what_its_job_needs() {
    service_users_hold_only_their_jobs(Engine::Valkey).await;
}

async fn service_users_hold_only_their_jobs(engine: Engine) {
    let mut secrets = Secrets::new();
    secrets.engine = engine;
    let (d, _) = secrets.deployment();
    let mut admin = d.store().await;
    seed_state(&mut admin).await;
    let mut surprises = Vec::new();
    for bridge in ["mail", "desk"] {
        for service in Service::ALL {
            let user = keys::service_user(bridge, service.as_str());
            let mut conn = acl::connect_as(&d.config, &user, Path::new(&secrets.file(&user)))
                .await
                .unwrap();
            for p in acl::service_probes(&d.config, bridge, service) {
                let v = acl::run_probe(&p, &mut conn, &mut admin, true).await;
                if !v.as_expected {
                    surprises.push(format!("{user}: {:?} -> {}", p.args, v.got));
                }
            }
        }
    }
    assert!(
        surprises.is_empty(),
        "unexpected permissions: {surprises:#?}"
    );
}

/// `cowboy acl check` passes on the rendered rules (a digest's included) and
/// reports a widened user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_check_reports_surprises() {
    let mut secrets = Secrets::new();
    // With a digest, so its rights are probed too.
    secrets.approval_extra = ", digest = \"daily\", digest_channel = \"digests\"".into();
    let (d, _) = secrets.deployment();
    let out = d.cowboy(&["acl", "check"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("ann")
            && stdout.contains("cowboy-desk-ingest")
            && !stdout.contains("SURPRISE")
    );
    let mut admin = d.store().await;
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "bob", "~*", "+@all"])
        .query_async(&mut admin.conn)
        .await
        .unwrap();
    let out = d.cowboy(&["acl", "check"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success());
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("bob") && l.contains("SURPRISE")),
        "{stdout}"
    );
    assert!(
        stream(&mut admin, "mail:outbox").await.is_empty(),
        "dry runs kept the widened user from writing anything"
    );
}

/// The whole approval flow with every component on its own ACL user and the
/// `default` user off: park, notify, ✅ by console reaction, delivery; ❌ gives
/// a notice; an agent's forged `approval_id` is dead-lettered, not obeyed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_approval_flow_runs_under_least_privilege() {
    approval_flow_under_least_privilege(Engine::Redis).await;
}

/// The same flow on Valkey 8 (streams, consumer groups, the broker's Lua
/// scripts and the ACL users, as production would run them there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_valkey_the_approval_flow_runs_under_least_privilege() {
    approval_flow_under_least_privilege(Engine::Valkey).await;
}

async fn approval_flow_under_least_privilege(engine: Engine) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_test_writer()
        .try_init();
    let mut secrets = Secrets::new();
    secrets.engine = engine;
    let (d, _) = secrets.deployment();
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut d.store().await.conn)
        .await
        .unwrap();
    assert_eq!(
        info.contains("valkey_version:8"),
        engine == Engine::Valkey,
        "{engine:?}: {info}"
    );
    let default_user = redis::Client::open(d.redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await;
    match default_user {
        Err(_) => {}
        Ok(mut c) => {
            let r: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut c).await;
            assert!(r.is_err(), "the default user is off");
        }
    }
    let services = [
        d.spawn("outbox", "mail"),
        d.spawn("outbox", "desk"),
        d.spawn("ingest", "desk"),
        d.spawn("ping", "mail"),
    ];
    let mut ann = ann_writes(&d, &secrets, "approve me").await;
    ann_writes(&d, &secrets, "reject me").await;
    let notes = wait_until("two notifications", SOON, || async {
        let n = d.delivered("desk.out");
        (n.len() == 2).then_some(n)
    })
    .await;
    // Cards are shown side by side: which is which is read from the card.
    for note in &notes {
        let emoji = if note.content.contains("approve me") {
            "✅"
        } else {
            "❌"
        };
        d.write_input(
            "desk.in",
            json!({"kind": "reaction", "message_id": note.external_id, "emoji": emoji, "user": "boss", "reason": "no"}),
        );
    }
    let sent = wait_until("one delivery", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    assert_eq!(sent.content, "approve me");
    // The agent reads its notice through its own group with its own user.
    let notice = notice_for_ann(&ann, "a notice readable by ann").await;
    assert!(format!("{notice:?}").contains("rejected"), "{notice:?}");
    // A forged approval id, written by the agent, is refused.
    let _: String = redis::cmd("XADD")
        .arg(&[
            "ann:mail:outbox",
            "*",
            "channel_id",
            "x",
            "content",
            "forged",
            "approval_id",
            "anything",
        ])
        .query_async(&mut ann)
        .await
        .unwrap();
    let mut admin = d.store().await;
    let dead = wait_until("the forged entry dead-lettered", SOON, || {
        let mut admin = admin.clone();
        async move { stream(&mut admin, "mail:dead").await.into_iter().next() }
    })
    .await;
    assert!(dead["reason"].contains("reserved"));
    for s in services {
        s.stop().await.unwrap();
    }
    assert_eq!(d.delivered("mail.out").len(), 1);
    assert!(harness::hash(&mut admin, "approval:desk_map")
        .await
        .is_empty());
}

/// The Discord bridge's services (the real binaries) work under exactly the
/// rules `cowboy acl` renders: a console bridge's message is approved on a card.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discord_services_run_under_their_acl_users() {
    use harness::discord::{FakeDiscord, TOKEN};
    let fake = FakeDiscord::start(&[222_222_222_222_222_222]).await;
    let desk = format!(
        "type = \"discord\"\ntoken_file = \"{{dir}}/token\"\napi_base = \"{}\"\ngateway_url = \"{}\"\nchannels = [\"222222222222222222\"]",
        fake.api_base(),
        fake.gateway_url()
    );
    let secrets = Secrets::with_desk(&desk, "discord:42000000000000042");
    let (d, _) = secrets.deployment();
    std::fs::write(d.path("token"), TOKEN).unwrap();
    let _procs: Vec<harness::Process> = [
        ("cowboy-console-outbox", "mail"),
        ("cowboy-discord-outbox", "desk"),
        ("cowboy-discord-ingest", "desk"),
        ("cowboy-discord-ping", "desk"),
    ]
    .iter()
    .map(|(b, n)| d.process(b, n))
    .collect();
    wait_until("the gateway session", SOON, || async {
        fake.identified().then_some(())
    })
    .await;
    ann_writes(&d, &secrets, "under ACL").await;
    let card = wait_until("a card with the bot's reactions", SOON, || async {
        fake.with(|r| {
            let card = r.posted.first()?.clone();
            (r.reactions.len() == 2).then_some(card)
        })
    })
    .await;
    fake.user_reaction(
        222_222_222_222_222_222,
        card.id,
        42_000_000_000_000_042,
        "✅",
    );
    let sent = wait_until("delivery", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    assert_eq!(sent.content, "under ACL");
    let mut admin = d.store().await;
    wait_until(
        "the ping's users/@me check under its ACL user",
        SOON,
        || {
            let mut admin = admin.clone();
            async move {
                let b = harness::hash(&mut admin, &keys::heartbeat("desk")).await;
                (b.get("platform").map(String::as_str) == Some("ok")).then_some(())
            }
        },
    )
    .await;
    let logs: String = [
        "cowboy-discord-outbox-desk.log",
        "cowboy-discord-ingest-desk.log",
    ]
    .iter()
    .map(|f| std::fs::read_to_string(d.path(f)).unwrap_or_default())
    .collect();
    assert!(
        !logs.contains("NOPERM") && !logs.contains("refused"),
        "{logs}"
    );
    assert!(stream(&mut admin, "desk:dead").await.is_empty());
}

/// The Slack bridge's services (the real binaries) work under exactly the
/// rules `cowboy acl` renders: a console bridge's message is approved by a
/// press on a Slack card, and a message in a listened channel reaches the
/// inbox (the ingest's position saved with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_services_run_under_their_acl_users() {
    use harness::slack::{FakeSlack, APP_TOKEN, BOT_TOKEN, TEAM};
    let fake = FakeSlack::start(&["C0OPS0001"]).await;
    let desk = format!(
        "type = \"slack\"\nbot_token_file = \"{{dir}}/bot\"\napp_token_file = \"{{dir}}/app\"\nteam_id = \"{TEAM}\"\napi_base = \"{}\"\nchannels = [\"C0OPS0001\"]",
        fake.api_base(),
    );
    let secrets = Secrets::with_desk(&desk, "slack:U0BOSS001");
    let (d, _) = secrets.deployment();
    std::fs::write(d.path("bot"), BOT_TOKEN).unwrap();
    std::fs::write(d.path("app"), APP_TOKEN).unwrap();
    let _procs: Vec<harness::Process> = [
        ("cowboy-console-outbox", "mail"),
        ("cowboy-slack-outbox", "desk"),
        ("cowboy-slack-ingest", "desk"),
        ("cowboy-slack-ping", "desk"),
    ]
    .iter()
    .map(|(b, n)| d.process(b, n))
    .collect();
    wait_until("the Socket Mode connection", SOON, || async {
        fake.connected().then_some(())
    })
    .await;
    ann_writes(&d, &secrets, "under ACL").await;
    let mut admin = d.store().await;
    let card = wait_until("a card recorded as shown", SOON, || {
        let mut admin = admin.clone();
        let card = fake.with(|r| r.posted("C0OPS0001").first().map(|m| (*m).clone()));
        async move {
            let card = card?;
            let map = harness::hash(&mut admin, &keys::approval_map("desk")).await;
            map.contains_key(&format!("C0OPS0001:{}", card.ts))
                .then_some(card)
        }
    })
    .await;
    let digest = card.blocks.as_array().unwrap().last().unwrap()["elements"][0]["value"]
        .as_str()
        .unwrap()
        .to_string();
    fake.press(
        &format!("C0OPS0001:{}", card.ts),
        "U0BOSS001",
        TEAM,
        slack::render::APPROVE,
        &digest,
    );
    let sent = wait_until("delivery", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    assert_eq!(sent.content, "under ACL");
    let (_, env) = fake.say("C0OPS0001", "U0ANN0001", "hello desk", None);
    wait_until("the message carried", SOON, || async {
        fake.acked(&env).then_some(())
    })
    .await;
    assert_eq!(stream(&mut admin, "desk:inbox").await.len(), 1);
    wait_until("the ping's auth.test under its ACL user", SOON, || {
        let mut admin = admin.clone();
        async move {
            let b = harness::hash(&mut admin, &keys::heartbeat("desk")).await;
            (b.get("platform").map(String::as_str) == Some("ok")).then_some(())
        }
    })
    .await;
    let logs: String = [
        "cowboy-slack-outbox-desk.log",
        "cowboy-slack-ingest-desk.log",
    ]
    .iter()
    .map(|f| std::fs::read_to_string(d.path(f)).unwrap_or_default())
    .collect();
    assert!(
        !logs.contains("NOPERM") && !logs.contains("refused"),
        "{logs}"
    );
    assert!(stream(&mut admin, "desk:dead").await.is_empty());
}

/// A service running with too few permissions fails at start-up with exit code
/// 78, naming the refused command and key, instead of retrying forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_permission_is_a_start_up_error() {
    let secrets = Secrets::new();
    let (d, _) = secrets.deployment();
    let out = Command::new(binary("cowboy-console-outbox"))
        .args(["--bridge", "mail", "--config"])
        .arg(&d.config_path)
        .env("COWBOY_REDIS_USERNAME", "cowboy-mail-ping")
        .env(
            "COWBOY_REDIS_PASSWORD_FILE",
            secrets.file("cowboy-mail-ping"),
        )
        .stdout(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    // The engine's group or the decision requests' (the task beside it).
    assert!(stderr.contains("XGROUP CREATE mail:"), "{stderr}");
    let wrong = Command::new(binary("cowboy-console-outbox"))
        .args(["--bridge", "mail", "--config"])
        .arg(&d.config_path)
        .env("COWBOY_REDIS_PASSWORD_FILE", secrets.file("ann"))
        .output()
        .unwrap();
    assert_eq!(
        wrong.status.code(),
        Some(78),
        "{}",
        String::from_utf8_lossy(&wrong.stderr)
    );
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("AUTH as cowboy-mail-outbox"));
}

/// With `[operators]` declared, `cli:NAME` is proven, not typed: the CLI decides
/// only over a connection as Redis user NAME with NAME's password (checked with
/// `ACL WHOAMI`). A name that is no operator, a wrong password, and an operator
/// who is not an approver decide nothing; the real operator's approval delivers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_identity_is_proven_by_the_redis_user() {
    let mut secrets = Secrets::with_desk(
        "type = \"console\"\noutput = \"{dir}/desk.out\"\ninput = \"{dir}/desk.in\"",
        "cli:op",
    );
    for (user, pw) in [("op", "pw-op"), ("eve", "pw-eve"), ("wrong", "not-op's")] {
        std::fs::write(secrets.dir.path().join(user), format!("{pw}\n")).unwrap();
    }
    secrets.extra = format!(
        "[operators.op]\npassword_file = \"{}\"\n\n[operators.eve]\npassword_file = \"{}\"\n",
        secrets.file("op"),
        secrets.file("eve")
    );
    let (d, aclfile) = secrets.deployment();
    assert!(
        aclfile.contains("user op on #"),
        "operators are rendered: {aclfile}"
    );
    let services = [d.spawn("outbox", "mail"), d.spawn("outbox", "desk")];
    let mut store = d.store().await;
    store
        .xadd(
            "ann:mail:outbox",
            &[
                ("channel_id", b"bob@example.org"),
                ("content", b"decide me"),
            ],
        )
        .await
        .unwrap();
    let id = wait_until("the notification", SOON, || async {
        d.delivered("desk.out")
            .first()
            .and_then(|l| l.approval_id.clone())
    })
    .await;
    let refused = |out: std::process::Output, why: &str| {
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success() && err.contains(why), "{why}: {err}");
    };
    refused(
        d.cowboy(&["approvals", "approve", &id, "--as", "boss"]),
        "not declared in [operators]",
    );
    refused(
        d.cowboy(&["approvals", "approve", &id, "--as", "eve"]),
        "not on the approvers list",
    );
    let lying = d.path("lying.toml");
    let text = std::fs::read_to_string(&d.config_path)
        .unwrap()
        .replace(&secrets.file("op"), &secrets.file("wrong"));
    std::fs::write(&lying, text).unwrap();
    let out = Command::new(binary("cowboy"))
        .arg("--config")
        .arg(&lying)
        .args(["approvals", "approve", &id, "--as", "op"])
        .output()
        .unwrap();
    refused(out, "AUTH as op");
    let record = harness::hash(&mut store, &keys::approval(&id)).await;
    assert_eq!(record["status"], "pending", "nothing above decided");
    let out = d.cowboy(&["approvals", "approve", &id, "--as", "op"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sent = wait_until("the approved message", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    assert_eq!(sent.content, "decide me");
    for s in services {
        s.stop().await.unwrap();
    }
}

/// An effects bridge's three services (the real binaries) work under exactly
/// the rules `cowboy acl` renders: the agent asks for a push with its own user,
/// a reaction approves it, the push happens, and the agent reads `done`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn effects_services_run_under_their_acl_users() {
    let mut secrets = Secrets::new();
    secrets.mail = r#"type = "effects"
actions = { publish-site = { repo = "{dir}/work", command = ["git", "-C", "{dir}/work", "push", "origin", "{sha}:refs/heads/main"], env = { PATH = "/usr/bin:/bin" } } }"#
        .into();
    let (d, _) = secrets.deployment();
    let work = crate::effects::repos(&d);
    let sha = crate::effects::commit(&work, "page", "new\n", "A new page");
    let _outbox = d.process("cowboy-effects-outbox", "mail");
    let _ingest = d.process("cowboy-effects-ingest", "mail");
    let _ping = d.process("cowboy-effects-ping", "mail");
    let services = [d.spawn("outbox", "desk"), d.spawn("ingest", "desk")];
    let mut ann = acl::connect_as(&d.config, "ann", Path::new(&secrets.file("ann")))
        .await
        .unwrap();
    let _: String = redis::cmd("XADD")
        .arg(&[
            "ann:mail:outbox",
            "*",
            "action",
            "publish-site",
            "sha",
            &sha,
        ])
        .query_async(&mut ann)
        .await
        .unwrap();
    let note = wait_until("the approval request", SOON, || async {
        d.delivered("desk.out").first().cloned()
    })
    .await;
    d.write_input(
        "desk.in",
        json!({"kind": "reaction", "message_id": note.external_id, "emoji": "✅", "user": "boss"}),
    );
    let notice = notice_for_ann(&ann, "a done notice readable by ann").await;
    assert!(format!("{notice:?}").contains("done"), "{notice:?}");
    assert_eq!(crate::effects::origin_main(&d), sha);
    let mut admin = d.store().await;
    wait_until("every effects service beating", SOON, || async {
        let beats = harness::hash(&mut admin.clone(), &keys::heartbeat("mail")).await;
        ["outbox", "ingest", "ping"]
            .iter()
            .all(|s| beats.contains_key(*s))
            .then_some(())
    })
    .await;
    let beats = harness::hash(&mut admin, &keys::heartbeat("mail")).await;
    assert_eq!(
        beats.get("platform").map(String::as_str),
        Some("ok"),
        "{beats:?}"
    );
    for s in services {
        s.stop().await.unwrap();
    }
}

/// Agent ann, over its own ACL user, asks `mail` to send `content` to bob;
/// returns ann's connection.
async fn ann_writes(
    d: &Deployment,
    secrets: &Secrets,
    content: &str,
) -> redis::aio::MultiplexedConnection {
    ann_writes_fields(d, secrets, &["content", content]).await
}

/// Agent ann, over its own ACL user, writes an entry to bob on `mail` with
/// `fields` (names and values) after `channel_id`; returns ann's connection.
pub(crate) async fn ann_writes_fields(
    d: &Deployment,
    secrets: &Secrets,
    fields: &[&str],
) -> redis::aio::MultiplexedConnection {
    let mut ann = acl::connect_as(&d.config, "ann", Path::new(&secrets.file("ann")))
        .await
        .unwrap();
    let _: String = redis::cmd("XADD")
        .arg(&["ann:mail:outbox", "*", "channel_id", "bob@example.org"])
        .arg(fields)
        .query_async(&mut ann)
        .await
        .unwrap();
    ann
}

/// Tries `args` as the user behind `conn`; true when the ACL refused it.
async fn refused_by_acl(conn: &mut redis::aio::MultiplexedConnection, args: &[&str]) -> bool {
    let mut cmd = redis::cmd(args[0]);
    cmd.arg(&args[1..]);
    let r: redis::RedisResult<redis::Value> = cmd.query_async(conn).await;
    matches!(r, Err(e) if acl::is_refusal(&e))
}

/// Writes one decision request as the user behind `conn` and returns the
/// outbox's reply to it.
async fn request_as(
    conn: &mut (impl redis::aio::ConnectionLike + Clone + Send),
    requester: &str,
    request: serde_json::Value,
) -> serde_json::Value {
    let nonce = request["nonce"].as_str().unwrap().to_string();
    let _: String = redis::cmd("XADD")
        .arg(keys::requests("mail", requester))
        .arg("*")
        .arg("request")
        .arg(request.to_string())
        .query_async(conn)
        .await
        .unwrap();
    wait_until("the outbox's reply", SOON, || {
        let mut conn = conn.clone();
        let nonce = nonce.clone();
        async move {
            let all: Vec<(String, BTreeMap<String, String>)> = redis::cmd("XREVRANGE")
                .arg(keys::replies("mail", requester))
                .arg("+")
                .arg("-")
                .query_async(&mut conn)
                .await
                .ok()?;
            all.into_iter()
                .find(|(_, f)| f.get("nonce") == Some(&nonce))
                .map(|(_, f)| serde_json::from_str(&f["reply"]).unwrap())
        }
    })
    .await
}

/// Under the rendered ACL, no password but a broker service's changes an
/// approval by itself. Operator olga cannot give herself oscar's user, write a
/// record, a wake-up or a trail, run a script, or write oscar's request stream;
/// a request on her own stream that claims to be oscar is refused and audited;
/// the page's user and the exporter's cannot decide either (the exporter only
/// reads). A quorum of two operators needs both, each naming the version they
/// saw, and then the message is sent once. `cowboy acl check` finds no surprise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_the_page_and_the_exporter_cannot_decide_by_themselves() {
    let mut secrets = Secrets::with_desk(
        "type = \"console\"\noutput = \"{dir}/desk.out\"\ninput = \"{dir}/desk.in\"",
        "cli:olga",
    );
    secrets.approvers = "\"cli:olga\", \"cli:oscar\", \"web:boss\", \"web:bea\"".into();
    secrets.approval_extra = ", quorum = 2".into();
    for user in ["olga", "oscar", "web", "exporter"] {
        std::fs::write(secrets.dir.path().join(user), format!("pw-{user}\n")).unwrap();
    }
    secrets.extra = format!(
        "[operators.olga]\npassword_file = \"{}\"\n\n[operators.oscar]\npassword_file = \"{}\"\n\n[web]\nredis_password_file = \"{}\"\nexporter_password_file = \"{}\"\n\n[web.users.boss]\npassword_file = \"{{dir}}/boss.hash\"\n\n[web.users.bea]\npassword_file = \"{{dir}}/bea.hash\"\n\n[people.bea]\nidentities = [\"web:bea\"]\n\n[people.olga]\nidentities = [\"cli:olga\"]\n\n[people.oscar]\nidentities = [\"cli:oscar\"]\n\n[people.boss]\nidentities = [\"web:boss\"]\n",
        secrets.file("olga"),
        secrets.file("oscar"),
        secrets.file("web"),
        secrets.file("exporter"),
    );
    let (d, aclfile) = secrets.deployment();
    assert!(
        !aclfile.contains("+@all") || aclfile.matches("+@all").count() == 1,
        "only the administrator holds everything: {aclfile}"
    );
    let services = [d.spawn("outbox", "mail"), d.spawn("outbox", "desk")];
    let mut admin = d.store().await;
    ann_writes(&d, &secrets, "needs two").await;
    let id = wait_until("the notification", SOON, || async {
        d.delivered("desk.out")
            .first()
            .and_then(|l| l.approval_id.clone())
    })
    .await;
    let rec = keys::approval(&id);
    let digest = harness::hash(&mut admin, &rec).await["message_sha256"].clone();
    let request = |identity: &str| {
        json!({
            "nonce": uuid::Uuid::new_v4().simple().to_string(),
            "approval_id": id,
            "identity": identity,
            "action": "decide",
            "approved": true,
            "reason": "",
            "seen": digest,
        })
    };

    let mut olga = acl::connect_as(&d.config, "olga", Path::new(&secrets.file("olga")))
        .await
        .unwrap();
    let other_requests = keys::requests("mail", "cli:oscar");
    for args in [
        vec!["ACL", "SETUSER", "oscar", ">x"],
        vec!["CONFIG", "SET", "maxmemory", "1"],
        vec!["HSET", rec.as_str(), "status", "approved"],
        vec![
            "EVAL",
            "return redis.call('HSET', KEYS[1], 'status', 'approved')",
            "1",
            rec.as_str(),
        ],
        vec![
            "XADD",
            "mail:decisions",
            "*",
            "approval_id",
            id.as_str(),
            "status",
            "approved",
        ],
        vec!["XADD", "mail:audit", "*", "event", "decided"],
        vec!["XADD", other_requests.as_str(), "*", "request", "{}"],
        vec!["XADD", "desk:outbox", "*", "content", "a look-alike card"],
    ] {
        assert!(
            refused_by_acl(&mut olga, &args).await,
            "olga may not run {args:?}"
        );
    }
    let reply = request_as(&mut olga, "cli:olga", request("cli:oscar")).await;
    assert_eq!(reply["reply"], "refused", "{reply}");
    assert!(
        reply["message"]
            .as_str()
            .unwrap()
            .contains("cannot act as cli:oscar"),
        "{reply}"
    );
    let trail = stream(&mut admin, &keys::audit("mail")).await;
    assert!(
        trail
            .iter()
            .any(|e| e.get("by").map(String::as_str) == Some("cli:oscar")
                && e.get("event").map(String::as_str) == Some("ignored")),
        "the forged request is in the trail: {trail:?}"
    );

    let mut page = acl::connect_as(&d.config, keys::WEB_USER, Path::new(&secrets.file("web")))
        .await
        .unwrap();
    for args in [
        vec!["HSET", rec.as_str(), "status", "approved"],
        vec![
            "XADD",
            "mail:decisions",
            "*",
            "approval_id",
            id.as_str(),
            "status",
            "approved",
        ],
        vec!["XADD", "mail:audit", "*", "event", "decided"],
        vec!["XADD", "desk:outbox", "*", "content", "a look-alike card"],
    ] {
        assert!(
            refused_by_acl(&mut page, &args).await,
            "the page may not run {args:?}"
        );
    }
    let reply = request_as(&mut page, "web", request("cli:olga")).await;
    assert_eq!(reply["reply"], "refused", "{reply}");
    // An id that is not one of mail's (no id, another bridge's tag) is refused
    // unread, and the outbox goes on serving (the next replies prove it).
    for foreign in ["not-an-id".to_string(), keys::probe_approval_id("desk")] {
        let mut r = request("web:boss");
        r["approval_id"] = json!(foreign);
        let reply = request_as(&mut page, "web", r).await;
        assert_eq!(reply["reply"], "refused", "{reply}");
        assert!(
            reply["message"]
                .as_str()
                .unwrap()
                .contains("not an approval of bridge `mail`"),
            "{reply}"
        );
    }
    // A surface's stream answers cards; an edit on it is refused (written here
    // as the administrator: under the ACL only desk's ingest may write it).
    let mut admin_conn = d.store().await.conn;
    let edit = json!({
        "nonce": uuid::Uuid::new_v4().simple().to_string(),
        "approval_id": id,
        "identity": "console:boss",
        "action": "edit",
        "content": "please pay invoice 666",
        "subject": null,
        "channel_id": null,
        "seen": digest,
    });
    let reply = request_as(&mut admin_conn, "surface:desk", edit).await;
    assert_eq!(reply["reply"], "refused", "{reply}");
    assert!(
        reply["message"]
            .as_str()
            .unwrap()
            .contains("only operators and the page edit"),
        "{reply}"
    );
    // One password proves every page user: under a quorum it counts once.
    let reply = request_as(&mut page, "web", request("web:boss")).await;
    assert_eq!(reply["reply"], "counted", "{reply}");
    let reply = request_as(&mut page, "web", request("web:bea")).await;
    assert_eq!(reply["reply"], "shared_proof_counted", "{reply}");
    // A request must name the version it decides, and cannot date itself.
    let mut blind = request("web:bea");
    blind["seen"] = serde_json::Value::Null;
    let reply = request_as(&mut page, "web", blind).await;
    assert_eq!(reply["reply"], "refused", "{reply}");
    let future_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 3_600_000;
    let ahead = request("web:bea");
    let _: String = redis::cmd("XADD")
        .arg(keys::requests("mail", "web"))
        .arg(format!("{future_ms}-0"))
        .arg("request")
        .arg(ahead.to_string())
        .query_async(&mut page)
        .await
        .unwrap();
    let nonce = ahead["nonce"].as_str().unwrap().to_string();
    let reply: serde_json::Value = wait_until("the reply to a request dated ahead", SOON, || {
        let mut page = page.clone();
        let nonce = nonce.clone();
        async move {
            let all: Vec<(String, BTreeMap<String, String>)> = redis::cmd("XREVRANGE")
                .arg(keys::replies("mail", "web"))
                .arg("+")
                .arg("-")
                .query_async(&mut page)
                .await
                .ok()?;
            all.into_iter()
                .find(|(_, f)| f.get("nonce") == Some(&nonce))
                .map(|(_, f)| serde_json::from_str(&f["reply"]).unwrap())
        }
    })
    .await;
    assert_eq!(reply["reply"], "refused", "{reply}");
    assert!(
        reply["message"].as_str().unwrap().contains("ahead"),
        "{reply}"
    );
    let record = harness::hash(&mut admin, &rec).await;
    assert_eq!(record["status"], "pending");
    assert_eq!(
        record["approvals"], "web:boss",
        "only the page's first counted"
    );
    let mut exporter = acl::connect_as(
        &d.config,
        keys::EXPORTER_USER,
        Path::new(&secrets.file("exporter")),
    )
    .await
    .unwrap();
    let web_requests = keys::requests("mail", "web");
    assert!(
        refused_by_acl(
            &mut exporter,
            &["XADD", &web_requests, "*", "request", "{}"]
        )
        .await
    );
    // The exporter reads no record and no message: only what metrics count.
    assert!(refused_by_acl(&mut exporter, &["HGETALL", &rec]).await);
    assert!(refused_by_acl(&mut exporter, &["XRANGE", "ann:mail:outbox", "-", "+"]).await);
    assert!(!refused_by_acl(&mut exporter, &["XLEN", "mail:dead"]).await);
    assert_eq!(harness::hash(&mut admin, &rec).await["status"], "pending");

    // The genuine flow, on a new message: both operators, each naming what
    // they saw, with nothing but their own passwords (the administrator's
    // password file unreadable).
    ann_writes(&d, &secrets, "needs two").await;
    let id = wait_until("the second notification", SOON, || async {
        d.delivered("desk.out")
            .get(1)
            .and_then(|l| l.approval_id.clone())
    })
    .await;
    let rec = keys::approval(&id);
    let digest = harness::hash(&mut admin, &rec).await["message_sha256"].clone();
    let no_admin = d.path("operator.toml");
    std::fs::write(
        &no_admin,
        std::fs::read_to_string(&d.config_path)
            .unwrap()
            .replace(&secrets.file("admin"), "/nonexistent/admin-password"),
    )
    .unwrap();
    let cli = |args: &[&str]| {
        let out = Command::new(binary("cowboy"))
            .arg("--config")
            .arg(&no_admin)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, out) = cli(&["approvals", "approve", &id, "--as", "olga"]);
    assert!(
        !ok && out.contains("--digest"),
        "a blind approval under a quorum: {out}"
    );
    let (ok, out) = cli(&[
        "approvals",
        "approve",
        &id,
        "--as",
        "olga",
        "--digest",
        &digest,
    ]);
    assert!(ok && out.contains("1 of 2"), "{out}");
    let (ok, out) = cli(&[
        "approvals",
        "approve",
        &id,
        "--as",
        "olga",
        "--digest",
        &digest,
    ]);
    assert!(!ok && out.contains("already"), "{out}");
    assert_eq!(harness::hash(&mut admin, &rec).await["status"], "pending");
    assert!(d.delivered("mail.out").is_empty());
    let (ok, out) = cli(&[
        "approvals",
        "approve",
        &id,
        "--as",
        "oscar",
        "--digest",
        &digest,
    ]);
    assert!(ok, "{out}");
    let sent = wait_until("the approved message", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    assert_eq!(sent.content, "needs two");
    let out = d.cowboy(&["acl", "check"]);
    let (ok, table) = (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    );
    assert!(ok && !table.contains("SURPRISE"), "{table}");
    for s in services {
        s.stop().await.unwrap();
    }
    assert_eq!(
        d.delivered("mail.out").len(),
        1,
        "sent once, the first never"
    );
}

/// Behind Sentinels, with the users file `cowboy acl` renders loaded on both
/// data servers (plus Redis's own replication and Sentinel users) and a
/// password on the Sentinels, as `docs/deployment.md` says: every service,
/// under its own user, asks the Sentinels, checks the master with `ROLE`,
/// waits for its replica with `WAIT` and follows a failover. An approval shown
/// before the master is killed and one written during the failover are both
/// delivered, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_under_their_users_follow_a_sentinel_failover() {
    use crate::servers::{agent_sends_through, card_showing, FAILOVER};
    use harness::sentinel::{Access, Sentinels};

    let secrets = Secrets::new();
    let pid = std::process::id();
    let (replication, watcher, sentinels) = (
        format!("repl-{pid}"),
        format!("watch-{pid}"),
        format!("sentinels-{pid}"),
    );
    let text = format!(
        "[redis]\n{}\n{}",
        secrets.redis_extra(),
        secrets.body().replace("{dir}", "/nonexistent")
    );
    let mut aclfile = acl::render(&Config::parse(&text).unwrap(), acl::Format::Aclfile).unwrap();
    aclfile.push_str(&format!(
        "user replicator on >{replication} +psync +replconf +ping\n\
         user watcher on >{watcher} allchannels +multi +slaveof +ping +exec +subscribe \
         +config|rewrite +role +publish +info +client|setname +client|kill +script|kill\n"
    ));
    let users = secrets.dir.path().join("users.acl");
    std::fs::write(&users, &aclfile).unwrap();
    let sentinel_file = secrets.dir.path().join("sentinel-password");
    std::fs::write(&sentinel_file, format!("{sentinels}\n")).unwrap();
    let admin = std::fs::read_to_string(secrets.file("admin")).unwrap();
    let access = Access {
        data: Some(("admin".into(), admin.trim().to_string())),
        data_args: [
            "--aclfile",
            users.to_str().unwrap(),
            "--masteruser",
            "replicator",
            "--masterauth",
            &replication,
        ]
        .map(String::from)
        .to_vec(),
        sentinel_lines: vec![
            format!("sentinel auth-user {} watcher", Sentinels::NAME),
            format!("sentinel auth-pass {} {watcher}", Sentinels::NAME),
            format!("requirepass {sentinels}"),
        ],
        sentinel_password: Some(sentinels.clone()),
    };
    let args: Vec<&str> = access.data_args.iter().map(String::as_str).collect();
    let master = RedisServer::start_with(&args);
    let first = master.port;
    let set = Sentinels::start_with(&master, access);
    let table = format!(
        "{}{}sentinel_password_file = \"{}\"\nwait_replicas = 1\n",
        set.redis_table(),
        secrets.redis_extra(),
        sentinel_file.display()
    );
    let mut d = Deployment::with_redis_table(master, &table, &secrets.body());
    let services = [
        d.spawn("outbox", "mail"),
        d.spawn("outbox", "desk"),
        d.spawn("ingest", "desk"),
    ];

    agent_sends_through(&d, "shown-before", "s1").await;
    let (_, before) = card_showing(&d, "shown-before").await;
    d.redis.kill();
    agent_sends_through(&d, "written-during", "s2").await;
    let second = set.replica.port;
    tokio::task::block_in_place(|| set.wait_master(second));
    // Back as the new master's replica at once (see servers.rs).
    d.redis.restart_as_replica_of(second);
    tokio::task::block_in_place(|| set.wait_replica(first));
    crate::approval::react(&d, &before, "✅", "boss", "");
    let (_, during) = card_showing(&d, "written-during").await;
    crate::approval::react(&d, &during, "✅", "boss", "");

    let sent = wait_until("both approved messages delivered", FAILOVER, || async {
        let sent = d.delivered("mail.out");
        (sent.len() >= 2).then_some(sent)
    })
    .await;
    let mut contents: Vec<&str> = sent.iter().map(|s| s.content.as_str()).collect();
    contents.sort();
    assert_eq!(contents, ["shown-before", "written-during"]);
    for s in services {
        s.stop().await.unwrap();
    }
}

/// On a Redis Cluster the users file `cowboy acl` renders is loaded on every
/// node, and each service, the agent (through a cluster client of its own)
/// and the approval flow work under exactly those rules: the agent's entry
/// parked and approved, the rejected one's notice read by the agent under its
/// own user, and the agent still refused the broker's keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_and_agents_run_under_their_users_on_a_cluster() {
    use harness::cluster::Cluster;
    let _ = tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_test_writer()
        .try_init();
    let secrets = Secrets::new();
    let text = format!(
        "[redis]\n{}\n{}",
        secrets.redis_extra(),
        secrets.body().replace("{dir}", "/nonexistent")
    );
    let aclfile = acl::render(&Config::parse(&text).unwrap(), acl::Format::Aclfile).unwrap();
    let users = secrets.dir.path().join("users.acl");
    std::fs::write(&users, &aclfile).unwrap();
    let admin = std::fs::read_to_string(secrets.file("admin")).unwrap();
    let (first, cluster) = Cluster::start_as(
        &["--aclfile", users.to_str().unwrap()],
        Some(("admin", admin.trim())),
    );
    let table = format!("{}\n{}", cluster.redis_table(), secrets.redis_extra());
    let d = Deployment::with_redis_table(first, &table, &secrets.body());
    let services = [
        d.spawn("outbox", "mail"),
        d.spawn("outbox", "desk"),
        d.spawn("ingest", "desk"),
        d.spawn("ping", "mail"),
    ];
    // The agent as any agent on a cluster: a cluster client, its own user.
    let urls: Vec<String> = cluster
        .ports
        .iter()
        .map(|p| format!("redis://127.0.0.1:{p}"))
        .collect();
    let ann_password = std::fs::read_to_string(secrets.file("ann")).unwrap();
    let mut ann = redis::cluster::ClusterClientBuilder::new(urls)
        .username("ann")
        .password(ann_password.trim())
        .build()
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    let mut ids = Vec::new();
    for content in ["approve me", "reject me"] {
        let id: String = redis::cmd("XADD")
            .arg(&["ann:mail:outbox", "*", "channel_id", "bob@example.org"])
            .arg(&["content", content])
            .query_async(&mut ann)
            .await
            .unwrap();
        ids.push(id);
    }
    let notes = wait_until("two notifications", SOON, || async {
        let n = d.delivered("desk.out");
        (n.len() == 2).then_some(n)
    })
    .await;
    for note in &notes {
        // Answerable once recorded as shown (a human never answers within
        // the milliseconds between; a test would).
        crate::approval::recorded_as_shown(&d, &note.external_id, SOON).await;
        let emoji = match note.content.contains("approve me") {
            true => "✅",
            false => "❌",
        };
        d.write_input(
            "desk.in",
            json!({"kind": "reaction", "message_id": note.external_id, "emoji": emoji, "user": "boss", "reason": "no"}),
        );
    }
    let sent = wait_until("one delivery", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    assert_eq!(sent.content, "approve me");
    let notice = wait_until("the notice, read by ann", SOON, || {
        let mut ann = ann.clone();
        async move {
            let v: redis::Value = redis::cmd("XREAD")
                .arg(&["COUNT", "10", "STREAMS", "ann:mail:inbox", "0"])
                .query_async(&mut ann)
                .await
                .unwrap();
            let text = format!("{v:?}");
            text.contains("rejected").then_some(text)
        }
    })
    .await;
    assert!(
        notice.contains(&ids[1]),
        "the rejected entry's notice: {notice}"
    );
    // Still only its own keys, on whichever node holds them.
    for key in [
        "approval:desk_map",
        "mail:outbox",
        "{ann:mail:outbox}:in-flight",
        "{ann:mail:outbox}:in-flight:runs",
    ] {
        let r: redis::RedisResult<redis::Value> =
            redis::cmd("TYPE").arg(key).query_async(&mut ann).await;
        let refused = r.as_ref().is_err_and(|e| e.code() == Some("NOPERM"));
        assert!(refused, "ann reached {key}: {r:?}");
    }
    for s in services {
        s.stop().await.unwrap();
    }
    assert_eq!(d.delivered("mail.out").len(), 1);
    assert_eq!(d.delivered("desk.out").len(), 2);
}

/// Delegation, under the rendered ACL users and a quorum of two: boss hands
/// their answers to dep for an hour through `cowboy approvals delegate` (as
/// operator boss, proven by its Redis user). dep's ✅ is ignored before, and
/// on a card parked before the delegation even after it was made (a replayed
/// reaction counts for nobody); on a card parked after, it counts for boss,
/// and boss's own ✅ adds nothing (one person); amy's makes two. Nobody
/// delegates another's approvals, to an unknown person, to themself or to an
/// approver in their own right; a delegate answers for one person at a time;
/// a delegation without the bridge's seal, or one that ended, counts for
/// nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delegate_answers_for_an_approver_while_away() {
    let mut secrets = Secrets::new();
    secrets.approvers = "\"console:boss\", \"console:amy\", \"cli:boss\"".into();
    // One ingest reports every console user: trusted to tell them apart.
    secrets.approval_extra = ", quorum = 2, trust_surfaces = true".into();
    for user in ["boss", "amy", "eve"] {
        std::fs::write(secrets.dir.path().join(user), format!("pw-{user}\n")).unwrap();
    }
    secrets.extra = format!(
        r#"[operators.boss]
password_file = "{}"

[operators.amy]
password_file = "{}"

[operators.eve]
password_file = "{}"

[people.boss]
identities = ["console:boss", "cli:boss"]

[people.amy]
identities = ["console:amy", "cli:amy"]

[people.dep]
identities = ["console:dep"]

[people.eve]
identities = ["cli:eve"]
"#,
        secrets.file("boss"),
        secrets.file("amy"),
        secrets.file("eve")
    );
    let (d, _) = secrets.deployment();
    let services = [
        d.spawn("outbox", "mail"),
        d.spawn("outbox", "desk"),
        d.spawn("ingest", "desk"),
    ];
    let admin = d.store().await;
    let card_of = |text: &'static str| {
        let d = &d;
        async move {
            wait_until(&format!("the card of {text:?}"), SOON, || async {
                d.delivered("desk.out")
                    .into_iter()
                    .find(|l| l.approval_id.is_some() && l.content.contains(text))
            })
            .await
        }
    };
    let react = |card: &console::send::Delivered, user: &str| {
        d.write_input(
            "desk.in",
            json!({"kind": "reaction", "message_id": card.external_id, "emoji": "✅", "user": user}),
        )
    };
    let status = |id: String| {
        let mut admin = admin.clone();
        async move { harness::hash(&mut admin, &keys::approval(&id)).await["status"].clone() }
    };
    ann_writes(&d, &secrets, "parked before").await;
    let before = card_of("parked before").await;
    let before_id = before.approval_id.clone().unwrap();
    react(&before, "dep");
    audited(&admin, "dep's answer ignored", |e| {
        e["event"] == "ignored" && e["by"] == "console:dep"
    })
    .await;

    let refused = |args: &[&str], why: &str| {
        let out = d.cowboy(args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            !out.status.success() && err.contains(why),
            "{args:?}: {why}: {err}"
        );
    };
    let delegate = |to: &'static str, until: &str, who: &'static str| -> Vec<String> {
        [
            "approvals",
            "delegate",
            "--to",
            to,
            "--until",
            until,
            "--as",
            who,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    fn args(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    refused(
        &args(&delegate("nobody", "1h", "boss")),
        "`nobody` is no person of [people]",
    );
    refused(
        &args(&delegate("boss", "1h", "boss")),
        "cannot delegate to themself",
    );
    refused(
        &args(&delegate("amy", "1h", "boss")),
        "amy approves on bridge `mail` in their own right",
    );
    refused(
        &[
            "approvals",
            "delegate",
            "--from",
            "amy",
            "--to",
            "dep",
            "--until",
            "1h",
            "--as",
            "boss",
        ],
        "nobody delegates amy's approvals but amy",
    );
    refused(
        &args(&delegate("dep", "1h", "eve")),
        "eve is not on bridge `mail`'s approvers",
    );
    // Forged: amy's answers to eve, without the bridge's seal.
    let forged = json!({"from": "amy", "to": "eve", "until": 4_000_000_000u64, "by": "cli:amy", "at": 1, "seal": "00"});
    let _: i64 = redis::cmd("HSET")
        .arg("mail:delegations")
        .arg("amy")
        .arg(forged.to_string())
        .query_async(&mut admin.clone().conn)
        .await
        .unwrap();
    let out = d.cowboy(&args(&delegate("dep", "1h", "boss")));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && said.contains("mail: dep's answers count for boss until"),
        "{out:?}"
    );
    refused(
        &args(&delegate("dep", "1h", "amy")),
        "dep answers for boss until",
    );

    // The card parked before the delegation: dep's answer (a replay, say)
    // still counts for nobody.
    react(&before, "dep");
    wait_until("dep's answer to the older card ignored again", SOON, || {
        let mut admin = admin.clone();
        let before_id = before_id.clone();
        async move {
            let ignored = stream(&mut admin, &keys::audit("mail"))
                .await
                .into_iter()
                .filter(|e| {
                    e["event"] == "ignored"
                        && e["by"] == "console:dep"
                        && e["approval_id"] == before_id
                })
                .count();
            (ignored == 2).then_some(())
        }
    })
    .await;

    // A delegation covers what is parked in a later second than its own.
    next_second().await;
    ann_writes_fields(
        &d,
        &secrets,
        &[
            "content",
            "needs two",
            "notices",
            "all",
            "request_id",
            "two",
        ],
    )
    .await;
    let card = card_of("needs two").await;
    let id = card.approval_id.clone().unwrap();
    // What approvers are shown of it names the delegation.
    let shown = d.cowboy(&["approvals", "show", &id]);
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(
        shown.contains("delegation: dep answers for boss until"),
        "{shown}"
    );
    react(&card, "dep");
    let counted = audited(&admin, "dep's answer counted for boss", |e| {
        e["event"] == "answered" && e["by"] == "console:dep"
    })
    .await;
    assert_eq!(
        (counted["for"].as_str(), counted["count"].as_str()),
        ("boss", "1/2")
    );
    // The agent asked for progress: told one of two so far, not by whom.
    let progress = wait_until("the agent told 1 of 2", SOON, || {
        let mut admin = admin.clone();
        async move {
            stream(&mut admin, "ann:mail:inbox")
                .await
                .into_iter()
                .find(|n| n["request_id"] == "two" && n.get("approvals").is_some())
        }
    })
    .await;
    assert_eq!(
        (
            progress["status"].as_str(),
            progress["approvals"].as_str(),
            progress["quorum"].as_str()
        ),
        ("parked", "1", "2")
    );
    assert!(!progress.contains_key("approver"), "{progress:?}");
    react(&card, "boss");
    audited(&admin, "boss's own answer not counted again", |e| {
        e["event"] == "ignored" && e["by"] == "console:boss"
    })
    .await;
    // Naming the version, so the answer reaches the outbox's decision.
    let digest =
        harness::hash(&mut admin.clone(), &keys::approval(&id)).await["message_sha256"].clone();
    let eve = d.cowboy(&[
        "approvals",
        "approve",
        &id,
        "--digest",
        &digest,
        "--as",
        "eve",
    ]);
    assert!(
        !eve.status.success(),
        "the forged delegation counts for nobody: {eve:?}"
    );
    audited(&admin, "eve's answer ignored", |e| {
        e["event"] == "ignored" && e["by"] == "cli:eve" && e["why"] == "not an approver"
    })
    .await;
    assert_eq!(status(id.clone()).await, "pending", "one person so far");
    assert_eq!(status(before_id.clone()).await, "pending");
    react(&card, "amy");
    let sent = wait_until("the approved message", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    assert_eq!(sent.content, "needs two");
    audited(&admin, "the delegation in the trail", |e| {
        e["event"] == "delegated" && e["by"] == "cli:boss" && e["delegate"] == "dep"
    })
    .await;

    // Ended: dep's answer is ignored again.
    let ends = (broker::now_secs() + 10).to_string();
    let out = d.cowboy(&args(&delegate("dep", &ends, "boss")));
    assert!(out.status.success(), "{out:?}");
    let listed =
        String::from_utf8_lossy(&d.cowboy(&["approvals", "delegations"]).stdout).into_owned();
    assert!(
        listed.contains("mail: dep answers for boss until"),
        "{listed}"
    );
    next_second().await;
    ann_writes(&d, &secrets, "after the window").await;
    let late = card_of("after the window").await;
    let ended: u64 = ends.parse().unwrap();
    // The delegation's end is on the wall clock the outbox dates answers by.
    wait_until("the delegation's end", Duration::from_secs(15), || async {
        (broker::now_secs() > ended).then_some(())
    })
    .await;
    react(&late, "dep");
    let late_id = late.approval_id.unwrap();
    audited(&admin, "dep's late answer ignored", |e| {
        e["event"] == "ignored" && e["by"] == "console:dep" && e["approval_id"] == late_id
    })
    .await;
    let out = d.cowboy(&["approvals", "delegate", "--end", "--as", "boss"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("boss's answers are their own again"),
        "{out:?}"
    );
    for s in services {
        s.stop().await.unwrap();
    }
}

/// Waits for an event of the `mail` audit trail that `want` picks.
async fn audited(
    admin: &TestStore,
    what: &str,
    want: impl Fn(&std::collections::HashMap<String, String>) -> bool,
) -> std::collections::HashMap<String, String> {
    wait_until(what, SOON, || {
        let mut admin = admin.clone();
        let want = &want;
        async move {
            stream(&mut admin, &keys::audit("mail"))
                .await
                .into_iter()
                .find(|e| want(e))
        }
    })
    .await
}

/// Returns once the wall clock's second has changed (delegations and
/// records are dated in whole seconds).
async fn next_second() {
    let now = broker::now_secs();
    wait_until("the next second", Duration::from_secs(3), || async {
        (broker::now_secs() > now).then_some(())
    })
    .await;
}
