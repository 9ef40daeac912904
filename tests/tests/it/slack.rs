//! The Slack bridge: the real client crate (slack-morphism, in the real
//! binaries) against a local Slack that speaks the Web API and Socket Mode
//! (harness::slack).

use std::time::Duration;

use broker::{approval, keys};
use harness::slack::{FakeSlack, Msg, APP_TOKEN, BOT_TOKEN, BOT_USER, OTHER_TEAM, TEAM};
use harness::{inbox, stream, wait_until, Deployment};
use serde_json::Value;

/// Bounded wait on the local Slack (a Socket Mode round trip, and the
/// client's own pacing of each method's tier).
const PLATFORM_SOON: Duration = Duration::from_secs(30);
const TALK: &str = "C0TALK001";
const OPS: &str = "C0OPS0001";
const BOSS: &str = "U0BOSS001";
const STRANGER: &str = "U0STRANGE";

const GATED: &str = "approval = { required = true, notify = \"sl\", notify_channel = \"C0OPS0001\", timeout = 0, approvers = [\"slack:U0BOSS001\"] }";

fn deployment(fake: &FakeSlack, approval: &str) -> Deployment {
    let d = Deployment::new(&format!(
        r#"
[agents.ann]

[bridges.sl]
type = "slack"
bot_token_file = "{{dir}}/bot"
app_token_file = "{{dir}}/app"
team_id = "{TEAM}"
api_base = "{api}"
channels = ["{TALK}"]
destinations = ["*"]
{approval}
"#,
        api = fake.api_base(),
    ));
    std::fs::write(d.path("bot"), format!("{BOT_TOKEN}\n")).unwrap();
    std::fs::write(d.path("app"), format!("{APP_TOKEN}\n")).unwrap();
    d
}

async fn connected(fake: &FakeSlack) {
    wait_until(
        "the ingest connected over Socket Mode",
        PLATFORM_SOON,
        || async { fake.connected().then_some(()) },
    )
    .await;
}

async fn send(d: &Deployment, fields: &[(&str, &str)]) -> String {
    let mut store = d.store().await;
    let fields: Vec<(&str, &[u8])> = fields.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
    store.xadd("ann:sl:outbox", &fields).await.unwrap()
}

/// The bot's messages in `channel`.
fn posted(fake: &FakeSlack, channel: &str) -> Vec<Msg> {
    fake.with(|r| r.posted(channel).into_iter().cloned().collect())
}

/// The text of a delivered message's rich-text blocks, and its elements.
fn elements(m: &Msg) -> Vec<Value> {
    m.blocks[0]["elements"][0]["elements"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The `n`th card in OPS, once it is recorded as shown (answerable).
async fn card(fake: &FakeSlack, d: &Deployment, n: usize) -> Msg {
    let card = wait_until("an approval card", PLATFORM_SOON, || async {
        posted(fake, OPS).get(n).cloned()
    })
    .await;
    let store = d.store().await;
    let external = format!("{OPS}:{}", card.ts);
    wait_until("the card recorded as shown", PLATFORM_SOON, || {
        let (mut store, external) = (store.clone(), external.clone());
        async move {
            let map = harness::hash(&mut store, &keys::approval_map("sl")).await;
            map.contains_key(&external).then_some(())
        }
    })
    .await;
    card
}

fn external(m: &Msg) -> String {
    format!("{}:{}", m.channel, m.ts)
}

/// The approver presses Approve on `card`, for the version it shows;
/// returns the envelope id.
fn approve_by_button(fake: &FakeSlack, card: &Msg) -> String {
    fake.press(
        &external(card),
        BOSS,
        TEAM,
        slack::render::APPROVE,
        &digest(card),
    )
}

/// The digest the card's buttons carry.
fn digest(card: &Msg) -> String {
    let blocks = card.blocks.as_array().unwrap();
    blocks.last().unwrap()["elements"][0]["value"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn acked(fake: &FakeSlack, envelope: &str) {
    wait_until("the envelope acknowledged", PLATFORM_SOON, || async {
        fake.acked(envelope).then_some(())
    })
    .await;
}

/// The card's closing edit, as its status line.
async fn closed(fake: &FakeSlack, card: &Msg) -> String {
    wait_until("the card closed", PLATFORM_SOON, || async {
        let m = fake.with(|r| r.at(&external(card)).cloned())?;
        m.edits.last().map(|blocks| blocks.to_string())
    })
    .await
}

async fn status_of(d: &Deployment) -> String {
    let mut store = d.store().await;
    let ids = approval::list_ids(&mut store).await.unwrap();
    harness::hash(&mut store, &keys::approval(&ids[0])).await["status"].clone()
}

/// Agent text arrives as written: rich text Slack does not interpret
/// (`*bold*`, links and `<!channel>` inert, a user mention real, as
/// `mentions` allows by default), links not unfurled; `reply_to` threads it;
/// 7,000 characters arrive whole in three messages, in order. A person's
/// message in a listened channel reaches the inbox; another app's does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivers_verbatim_threaded_and_split_and_carries_inbound() {
    let fake = FakeSlack::start(&[TALK, OPS]).await;
    let d = deployment(&fake, "");
    let _outbox = d.process("cowboy-slack-outbox", "sl");
    let _ingest = d.process("cowboy-slack-ingest", "sl");
    let text = "hi <@U0ANN0001>, *ship* it <!channel> <https://evil.example|safe> & more";
    send(
        &d,
        &[
            ("channel_id", TALK),
            ("content", text),
            ("request_id", "r1"),
        ],
    )
    .await;
    let first = wait_until("a message", PLATFORM_SOON, || async {
        posted(&fake, TALK).first().cloned()
    })
    .await;
    let els = elements(&first);
    assert_eq!(els[0], serde_json::json!({"type": "text", "text": "hi "}));
    assert_eq!(
        els[1],
        serde_json::json!({"type": "user", "user_id": "U0ANN0001"})
    );
    assert_eq!(
        els[2]["text"], ", *ship* it <!channel> <https://evil.example|safe> & more",
        "shown as written"
    );
    assert_eq!(els.len(), 3);
    assert!(
        !first.text.contains('<'),
        "the fallback is escaped: {}",
        first.text
    );
    assert_eq!(first.request["unfurl_links"], false);
    assert_eq!(first.request["unfurl_media"], false);
    send(
        &d,
        &[
            ("channel_id", TALK),
            ("content", "in the thread"),
            ("reply_to", &first.ts),
        ],
    )
    .await;
    let long: String = (0..1000).map(|i| format!("w{i:05} ")).collect();
    send(&d, &[("channel_id", TALK), ("content", &long)]).await;
    let all = wait_until(
        "the thread reply and three parts",
        PLATFORM_SOON,
        || async {
            let all = posted(&fake, TALK);
            (all.len() == 5).then_some(all)
        },
    )
    .await;
    assert_eq!(all[1].thread_ts.as_deref(), Some(first.ts.as_str()));
    let parts: Vec<String> = all[2..]
        .iter()
        .map(|m| elements(m)[0]["text"].as_str().unwrap().to_string())
        .collect();
    assert!(parts.iter().all(|p| p.chars().count() <= 3000));
    assert_eq!(
        parts.join(" "),
        long.trim_end_matches(' ').to_string() + " ",
        "whole, in order"
    );

    connected(&fake).await;
    let (ts, env) = fake.say(TALK, "U0ANN0001", "a &lt;b&gt; c", None);
    acked(&fake, &env).await;
    let other = fake.app_says(TALK, "from another app");
    acked(&fake, &other).await;
    let inbound = inbox(&d, "sl:inbox").await;
    assert_eq!(inbound.len(), 1, "{inbound:?}");
    assert_eq!(
        (
            inbound[0]["content"].as_str(),
            inbound[0]["message_id"].as_str(),
            inbound[0]["author_id"].as_str()
        ),
        ("a <b> c", ts.as_str(), "U0ANN0001")
    );
    assert!(fake.with(|r| r.unexpected.is_empty()));
}

/// A card with Approve / Reject buttons carrying the version's digest. A
/// press by a stranger, by the bot, from another workspace or with another
/// digest decides nothing; the approver's Approve delivers once and closes
/// the card. Reject opens a modal, and its reason reaches the agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buttons_approve_and_the_modal_rejects_with_a_reason() {
    let fake = FakeSlack::start(&[TALK, OPS]).await;
    let d = deployment(&fake, GATED);
    let _outbox = d.process("cowboy-slack-outbox", "sl");
    let _ingest = d.process("cowboy-slack-ingest", "sl");
    connected(&fake).await;
    let content = "Dear all,\n*the release* ships <!here>";
    send(
        &d,
        &[
            ("channel_id", TALK),
            ("content", content),
            ("request_id", "r1"),
        ],
    )
    .await;
    let first = card(&fake, &d, 0).await;
    let sha = digest(&first);
    let message = broker::entry::Message {
        channel_id: TALK.to_string(),
        content: content.to_string(),
        ..Default::default()
    };
    assert_eq!(
        sha,
        message.sha256(),
        "the buttons carry the whole-message digest"
    );
    let shown = first.blocks.to_string();
    assert!(
        shown.contains("rich_text_preformatted") && shown.contains("ships <!here>"),
        "{shown}"
    );
    for (user, team, value) in [
        (STRANGER, TEAM, sha.as_str()),
        (BOT_USER, TEAM, sha.as_str()),
        (BOSS, OTHER_TEAM, sha.as_str()),
        (
            BOSS,
            TEAM,
            "0000000000000000000000000000000000000000000000000000000000000000",
        ),
    ] {
        let env = fake.press(&external(&first), user, team, slack::render::APPROVE, value);
        acked(&fake, &env).await;
    }
    // The stranger's and the bot's are turned away by the ingest, the other
    // workspace's ignored; the one with another digest reaches the asking
    // outbox, which answers it (late) without deciding.
    let store = d.store().await;
    wait_until("the outbox answered the stale press", PLATFORM_SOON, || {
        let mut store = store.clone();
        async move {
            let replies = stream(&mut store, &keys::replies("sl", "surface:sl")).await;
            (!replies.is_empty()).then_some(())
        }
    })
    .await;
    assert_eq!(
        status_of(&d).await,
        "pending",
        "nobody but the approver decides"
    );
    assert!(posted(&fake, TALK).is_empty());
    let env = fake.press(&external(&first), BOSS, TEAM, slack::render::APPROVE, &sha);
    acked(&fake, &env).await;
    let delivered = wait_until("delivery", PLATFORM_SOON, || async {
        posted(&fake, TALK).first().cloned()
    })
    .await;
    assert_eq!(
        elements(&delivered)[0]["text"],
        "Dear all,\n*the release* ships <!here>"
    );
    let status = closed(&fake, &first).await;
    assert!(
        status.contains("Approved") && status.contains(&format!("<@{BOSS}>")),
        "{status}"
    );

    send(
        &d,
        &[
            ("channel_id", TALK),
            ("content", "two"),
            ("request_id", "r2"),
        ],
    )
    .await;
    let second = card(&fake, &d, 1).await;
    let env = fake.press(
        &external(&second),
        BOSS,
        TEAM,
        slack::render::REJECT,
        &digest(&second),
    );
    acked(&fake, &env).await;
    wait_until("the reason modal opened", PLATFORM_SOON, || async {
        fake.with(|r| (!r.views.is_empty()).then_some(()))
    })
    .await;
    let env = fake.submit(0, BOSS, TEAM, "not before Monday");
    acked(&fake, &env).await;
    let notice = wait_until("the rejection notice", PLATFORM_SOON, || async {
        inbox(&d, "ann:sl:inbox")
            .await
            .into_iter()
            .find(|n| n["request_id"] == "r2")
    })
    .await;
    assert_eq!(
        (
            notice["status"].as_str(),
            notice["reason"].as_str(),
            notice["approver"].as_str()
        ),
        ("rejected", "not before Monday", "slack:U0BOSS001")
    );
    let status = closed(&fake, &second).await;
    assert!(
        status.contains("Rejected") && status.contains("not before Monday"),
        "{status}"
    );
    assert_eq!(
        posted(&fake, TALK).len(),
        1,
        "delivered once, the rejected one never"
    );
    assert!(stream(&mut d.store().await, &keys::dead("sl"))
        .await
        .is_empty());
}

/// A ✅ reaction approves, and `reject <reason>` in the card's thread
/// rejects; the thread reply is an answer, not agent mail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reaction_approves_and_a_thread_reply_rejects() {
    let fake = FakeSlack::start(&[TALK, OPS]).await;
    let d = deployment(&fake, GATED);
    let _outbox = d.process("cowboy-slack-outbox", "sl");
    let _ingest = d.process("cowboy-slack-ingest", "sl");
    connected(&fake).await;
    send(
        &d,
        &[
            ("channel_id", TALK),
            ("content", "one"),
            ("request_id", "r1"),
        ],
    )
    .await;
    let first = card(&fake, &d, 0).await;
    let env = fake.react(&external(&first), STRANGER, "white_check_mark", TEAM);
    acked(&fake, &env).await;
    assert_eq!(status_of(&d).await, "pending");
    let env = fake.react(&external(&first), BOSS, "white_check_mark", TEAM);
    acked(&fake, &env).await;
    wait_until("delivery", PLATFORM_SOON, || async {
        posted(&fake, TALK).first().cloned()
    })
    .await;
    send(
        &d,
        &[
            ("channel_id", TALK),
            ("content", "two"),
            ("request_id", "r2"),
        ],
    )
    .await;
    let second = card(&fake, &d, 1).await;
    let (_, env) = fake.say(OPS, BOSS, "reject too early", Some(&second.ts));
    acked(&fake, &env).await;
    let notice = wait_until("the rejection notice", PLATFORM_SOON, || async {
        inbox(&d, "ann:sl:inbox")
            .await
            .into_iter()
            .find(|n| n["request_id"] == "r2")
    })
    .await;
    assert_eq!(
        (notice["status"].as_str(), notice["reason"].as_str()),
        ("rejected", "too early")
    );
    assert!(
        inbox(&d, "sl:inbox").await.is_empty(),
        "answers are not agent mail"
    );
    assert_eq!(posted(&fake, TALK).len(), 1);
}

/// "Later": a stranger's press moves nothing; the approver's Later button
/// moves the deadline by `approval.snooze` and the card is redrawn, buttons
/// and all, saying until when; `later 30m` in its thread moves it again; a
/// snooze decides nothing, and the approver's ✅ then delivers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn later_moves_the_deadline_and_the_card_says_so() {
    let fake = FakeSlack::start(&[TALK, OPS]).await;
    let gated = GATED.replace("timeout = 0", "timeout = 600, snooze = 900");
    let d = deployment(&fake, &gated);
    let _outbox = d.process("cowboy-slack-outbox", "sl");
    let _ingest = d.process("cowboy-slack-ingest", "sl");
    connected(&fake).await;
    send(&d, &[("channel_id", TALK), ("content", "after lunch")]).await;
    let first = card(&fake, &d, 0).await;
    let mut store = d.store().await;
    let id = approval::list_ids(&mut store).await.unwrap().remove(0);
    let deadline =
        |r: &std::collections::HashMap<String, String>| -> u64 { r["expires_at"].parse().unwrap() };
    let before = deadline(&harness::hash(&mut store, &keys::approval(&id)).await);
    let sha = digest(&first);
    let env = fake.press(
        &external(&first),
        STRANGER,
        TEAM,
        slack::render::LATER,
        &sha,
    );
    acked(&fake, &env).await;
    let env = fake.press(&external(&first), BOSS, TEAM, slack::render::LATER, &sha);
    acked(&fake, &env).await;
    let redrawn = wait_until(
        "the card redrawn with its snooze",
        PLATFORM_SOON,
        || async {
            let m = fake.with(|r| r.at(&external(&first)).cloned())?;
            m.edits
                .last()
                .map(|b| b.to_string())
                .filter(|b| b.contains("snoozed by slack:U0BOSS001"))
        },
    )
    .await;
    let r = harness::hash(&mut store, &keys::approval(&id)).await;
    assert_eq!(
        deadline(&r),
        before + 900,
        "the stranger moved nothing: {r:?}"
    );
    assert!(
        redrawn.contains(slack::render::APPROVE)
            && redrawn.contains(slack::render::LATER)
            && redrawn.contains("after lunch")
            && redrawn.contains(&(before + 900).to_string()),
        "the live card, with its new deadline: {redrawn}"
    );
    let (_, env) = fake.say(OPS, BOSS, "later 30m", Some(&first.ts));
    acked(&fake, &env).await;
    wait_until("the thread's snooze", PLATFORM_SOON, || {
        let (mut store, id) = (store.clone(), id.clone());
        async move {
            let r = harness::hash(&mut store, &keys::approval(&id)).await;
            (r.get("snoozes").map(String::as_str) == Some("2")).then_some(())
        }
    })
    .await;
    let r = harness::hash(&mut store, &keys::approval(&id)).await;
    assert_eq!(deadline(&r), before + 900 + 1800);
    assert_eq!(r["status"], "pending", "a snooze decides nothing");
    let env = fake.react(&external(&first), BOSS, "white_check_mark", TEAM);
    acked(&fake, &env).await;
    wait_until("delivery", PLATFORM_SOON, || async {
        posted(&fake, TALK).first().cloned()
    })
    .await;
    assert_eq!(posted(&fake, TALK).len(), 1);
}

/// While the ingest is down: the approver reacts ✅ on one card, replies
/// `reject not now` in another's thread, a stranger reacts on a third and
/// the approver presses its Approve button, and three messages are written
/// in a listened channel. When the ingest connects, the first is delivered,
/// the second rejected with its reason, the third still waits (Slack keeps
/// no presses; the presser was shown that the app did not respond), and
/// the three messages reach the inbox in order. Restarted again, nothing is
/// carried or decided twice; the third, pressed again, is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_was_said_while_the_ingest_was_away_is_caught_up_once() {
    let fake = FakeSlack::start(&[TALK, OPS]).await;
    let d = deployment(&fake, GATED);
    let _outbox = d.process("cowboy-slack-outbox", "sl");
    let ingest = d.process("cowboy-slack-ingest", "sl");
    connected(&fake).await;
    for (content, request) in [("one", "r1"), ("two", "r2"), ("three", "r3")] {
        send(
            &d,
            &[
                ("channel_id", TALK),
                ("content", content),
                ("request_id", request),
            ],
        )
        .await;
    }
    let (first, second, third) = (
        card(&fake, &d, 0).await,
        card(&fake, &d, 1).await,
        card(&fake, &d, 2).await,
    );
    // A saved position: the ingest carried one message before it stopped.
    let (_, env) = fake.say(TALK, "U0ANN0001", "before", None);
    acked(&fake, &env).await;
    assert_eq!(ingest.stop(), Some(0));
    wait_until("the connection closed", PLATFORM_SOON, || async {
        (!fake.connected()).then_some(())
    })
    .await;
    fake.react(&external(&first), BOSS, "white_check_mark", TEAM);
    fake.say(OPS, BOSS, "reject not now", Some(&second.ts));
    fake.react(&external(&third), STRANGER, "white_check_mark", TEAM);
    // A press nobody heard: Slack gives up on it and shows the presser that
    // the app did not respond. It keeps no history of presses, and one it
    // told the presser had failed must not take effect later.
    approve_by_button(&fake, &third);
    for text in ["m1", "m2", "m3"] {
        fake.say(TALK, "U0ANN0001", text, None);
    }
    assert!(fake.with(|r| r.dropped) >= 7, "nobody listened");
    let ingest = d.process("cowboy-slack-ingest", "sl");
    wait_until("the approved message delivered", PLATFORM_SOON, || async {
        posted(&fake, TALK).first().cloned()
    })
    .await;
    let rejected = wait_until("the rejection notice", PLATFORM_SOON, || async {
        inbox(&d, "ann:sl:inbox")
            .await
            .into_iter()
            .find(|n| n["request_id"] == "r2")
    })
    .await;
    assert_eq!(
        (rejected["status"].as_str(), rejected["reason"].as_str()),
        ("rejected", "not now")
    );
    let carried = wait_until("the three messages carried", PLATFORM_SOON, || async {
        let all = inbox(&d, "sl:inbox").await;
        (all.len() == 4).then_some(all)
    })
    .await;
    let texts: Vec<&str> = carried.iter().map(|m| m["content"].as_str()).collect();
    assert_eq!(texts, ["before", "m1", "m2", "m3"]);
    assert_eq!(ingest.stop(), Some(0));
    // The old connection must be gone first: the local Slack sends to
    // every open one, and a dying one never acknowledges.
    wait_until("the connection closed", PLATFORM_SOON, || async {
        (!fake.connected()).then_some(())
    })
    .await;
    let _ingest = d.process("cowboy-slack-ingest", "sl");
    connected(&fake).await;
    let (_, env) = fake.say(TALK, "U0ANN0001", "after", None);
    acked(&fake, &env).await;
    let texts: Vec<String> = inbox(&d, "sl:inbox")
        .await
        .iter()
        .map(|m| m["content"].clone())
        .collect();
    assert_eq!(
        texts,
        ["before", "m1", "m2", "m3", "after"],
        "nothing twice"
    );
    assert_eq!(posted(&fake, TALK).len(), 1, "delivered once");
    let mut store = d.store().await;
    let ids = approval::list_ids(&mut store).await.unwrap();
    assert_eq!(
        ids.len(),
        1,
        "the stranger and the unheard press decided nothing: the third waits"
    );
    // Pressed again while the ingest listens, it decides.
    let env = approve_by_button(&fake, &third);
    acked(&fake, &env).await;
    wait_until("the third delivered", PLATFORM_SOON, || async {
        (posted(&fake, TALK).len() == 2).then_some(())
    })
    .await;
}

/// A revoked bot token or a token of another workspace stops the services
/// with a configuration error naming the key (exit 78), and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_token_stops_the_bridge_naming_the_key() {
    let fake = FakeSlack::start(&[TALK, OPS]).await;
    let d = deployment(&fake, "");
    std::fs::write(d.path("bot"), "xoxb-revoked\n").unwrap();
    send(&d, &[("channel_id", TALK), ("content", "kept")]).await;
    let outbox = d.process("cowboy-slack-outbox", "sl");
    assert_eq!(outbox.wait_code(PLATFORM_SOON), Some(78));
    let ingest = d.process("cowboy-slack-ingest", "sl");
    assert_eq!(ingest.wait_code(PLATFORM_SOON), Some(78));
    let log = std::fs::read_to_string(d.path("cowboy-slack-ingest-sl.log")).unwrap();
    assert!(log.contains("`bridges.sl.bot_token_file`"), "{log}");
    std::fs::write(d.path("bot"), format!("{BOT_TOKEN}\n")).unwrap();
    std::fs::write(d.path("app"), "xapp-wrong\n").unwrap();
    let ingest = d.process("cowboy-slack-ingest", "sl");
    assert_eq!(ingest.wait_code(PLATFORM_SOON), Some(78));
    let log = std::fs::read_to_string(d.path("cowboy-slack-ingest-sl.log")).unwrap();
    assert!(log.contains("`bridges.sl.app_token_file`"), "{log}");
    let outbox = d.process("cowboy-slack-outbox", "sl");
    wait_until("the waiting message delivered", PLATFORM_SOON, || async {
        posted(&fake, TALK).first().cloned()
    })
    .await;
    assert_eq!(outbox.stop(), Some(0));
    assert_eq!(posted(&fake, TALK).len(), 1);
    assert_eq!(elements(&posted(&fake, TALK)[0])[0]["text"], "kept");
}

/// A 429 on `chat.postMessage` is waited out (its `Retry-After`) and the
/// message is posted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_post_is_waited_out_and_posted_once() {
    let fake = FakeSlack::start(&[TALK, OPS]).await;
    let d = deployment(&fake, "");
    fake.rate_limit("chat.postMessage", 2);
    let _outbox = d.process("cowboy-slack-outbox", "sl");
    send(&d, &[("channel_id", TALK), ("content", "patience")]).await;
    wait_until("delivery", PLATFORM_SOON, || async {
        posted(&fake, TALK).first().cloned()
    })
    .await;
    assert_eq!(
        fake.with(|r| r.rate_limited.get("chat.postMessage").copied()),
        Some(2)
    );
    assert_eq!(posted(&fake, TALK).len(), 1);
}

/// A post whose response is lost (Slack made the message, the bridge heard
/// a 503) is not posted again: the retry finds it by its metadata. For a
/// message in three parts whose second part's response is lost, the retry
/// posts only the third.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_whose_answer_was_lost_is_not_posted_twice() {
    let fake = FakeSlack::start(&[TALK, OPS]).await;
    let d = deployment(&fake, "");
    let _outbox = d.process("cowboy-slack-outbox", "sl");
    // Lost: the first post (a message), and the third (the middle part of the next).
    fake.with(|r| r.lose_posts = [1, 3].into());
    send(&d, &[("channel_id", TALK), ("content", "once")]).await;
    let once = wait_until("the post and its retry", PLATFORM_SOON, || async {
        fake.with(|r| {
            let looked = r.calls.iter().any(|(m, _)| m == "conversations.history");
            let next = r
                .calls
                .iter()
                .filter(|(m, _)| m == "chat.postMessage")
                .count();
            (looked && next == 1).then(|| r.posted(TALK).len())
        })
    })
    .await;
    assert_eq!(once, 1);
    let long: String = (0..1000).map(|i| format!("w{i:05} ")).collect();
    send(&d, &[("channel_id", TALK), ("content", &long)]).await;
    let all = wait_until("all three parts", PLATFORM_SOON, || async {
        let all = posted(&fake, TALK);
        (all.len() == 4).then_some(all)
    })
    .await;
    let parts: Vec<String> = all[1..]
        .iter()
        .map(|m| elements(m)[0]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        parts.join(" "),
        long.trim_end_matches(' ').to_string() + " ",
        "each part once, in order"
    );
    let posts = fake.with(|r| {
        r.calls
            .iter()
            .filter(|(m, _)| m == "chat.postMessage")
            .count()
    });
    assert_eq!(
        posts, 4,
        "one post per part and one for the first message: none repeated"
    );
}

/// The same in a thread: a reply whose response is lost is found in the
/// thread (`conversations.replies`, asked for the metadata Slack lists only
/// when asked) and neither posted again nor reported uncertain. Before,
/// the thread was read without metadata, so such a reply was `uncertain`.
/// A reply to a thread reply, which the lookup cannot see, stays
/// `uncertain` when lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_reply_whose_answer_was_lost_is_not_posted_twice() {
    let fake = FakeSlack::start(&[TALK, OPS]).await;
    let d = deployment(&fake, "");
    let _outbox = d.process("cowboy-slack-outbox", "sl");
    send(&d, &[("channel_id", TALK), ("content", "the parent")]).await;
    let parent = wait_until("the parent posted", PLATFORM_SOON, || async {
        posted(&fake, TALK).first().map(|m| m.ts.clone())
    })
    .await;
    // Lost: the second post, the reply.
    fake.with(|r| r.lose_posts = [2].into());
    send(
        &d,
        &[
            ("channel_id", TALK),
            ("content", "in the thread"),
            ("reply_to", &parent),
            ("request_id", "reply"),
        ],
    )
    .await;
    wait_until("the reply settled", PLATFORM_SOON, || async {
        let mut store = d.store().await;
        let looked = fake.with(|r| r.calls.iter().any(|(m, _)| m == "conversations.replies"));
        (looked && harness::pending(&mut store, "ann:sl:outbox", "sl-outbox").await == 0)
            .then_some(())
    })
    .await;
    let told: Vec<_> = inbox(&d, "ann:sl:inbox")
        .await
        .into_iter()
        .filter(|n| n["request_id"] == "reply")
        .collect();
    assert!(
        told.iter().all(|n| n["status"] != "uncertain"),
        "the lost reply was found in its thread: {told:?}"
    );
    let all = posted(&fake, TALK);
    assert_eq!(all.len(), 2, "the reply posted once");
    assert_eq!(all[1].thread_ts.as_deref(), Some(parent.as_str()));

    // An answer to someone's reply in that thread: Slack lists a reply's
    // "thread" as that reply alone and posts to it in the parent's thread,
    // so the lookup cannot see it there. Lost, it is reported uncertain,
    // never posted twice.
    let (question, _) = fake.say(TALK, "U0ANN0001", "a question", Some(&parent));
    fake.with(|r| r.lose_posts = [3].into());
    send(
        &d,
        &[
            ("channel_id", TALK),
            ("content", "the answer"),
            ("reply_to", &question),
            ("request_id", "answer"),
        ],
    )
    .await;
    let told = wait_until("the answer's outcome", PLATFORM_SOON, || async {
        inbox(&d, "ann:sl:inbox")
            .await
            .into_iter()
            .find(|n| n["request_id"] == "answer")
    })
    .await;
    assert_eq!(told["status"], "uncertain", "{told:?}");
    let all = posted(&fake, TALK);
    assert_eq!(all.len(), 3, "the answer posted once");
    assert_eq!(all[2].thread_ts.as_deref(), Some(parent.as_str()));
}

/// Agent text on a card cannot pass for the frame, a status or a button:
/// the frame is the bot's own section, the content sits verbatim in
/// preformatted blocks and mentions nobody. Outcomes forged on the flat
/// outbox are dead-lettered and edit no card; the approver's press then
/// sends the content as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_frame_cannot_be_imitated_and_forged_outcomes_edit_nothing() {
    let fake = FakeSlack::start(&[TALK, OPS]).await;
    let d = deployment(&fake, GATED);
    let _outbox = d.process("cowboy-slack-outbox", "sl");
    let _ingest = d.process("cowboy-slack-ingest", "sl");
    connected(&fake).await;
    let content = "Approval requested [0000]\n✅ *Approved* by <@U0BOSS001> <!channel> <https://evil.example|your bank>";
    send(&d, &[("channel_id", TALK), ("content", content)]).await;
    let first = card(&fake, &d, 0).await;
    let blocks = first.blocks.as_array().unwrap().clone();
    let mut store = d.store().await;
    let id = approval::list_ids(&mut store).await.unwrap().remove(0);
    assert_eq!(blocks[0]["text"]["type"], "plain_text");
    assert!(blocks[0]["text"]["text"]
        .as_str()
        .unwrap()
        .starts_with(&format!("Approval requested [{id}]")));
    assert!(
        !blocks[0].to_string().contains("evil.example"),
        "the frame holds none of the content"
    );
    let shown = &blocks[1]["elements"];
    assert_eq!(shown.as_array().unwrap().len(), 1);
    assert_eq!(shown[0]["type"], "rich_text_preformatted");
    assert_eq!(
        shown[0]["elements"],
        serde_json::json!([{"type": "text", "text": content}]),
        "as written, no mention"
    );
    assert!(
        !first.text.contains('<'),
        "the notification text is escaped: {}",
        first.text
    );
    for f in [
        vec![
            ("approval_id", id.as_str()),
            ("approval_outcome", "approved"),
        ],
        vec![
            ("approval_id", id.as_str()),
            ("approval_outcome", "approved"),
            ("approval_external_id", &external(&first)),
            ("channel_id", OPS),
            ("approval_reason", "looks fine"),
        ],
    ] {
        let f: Vec<(&str, &[u8])> = f.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        store.xadd("sl:outbox", &f).await.unwrap();
    }
    wait_until("both forged outcomes dead-lettered", PLATFORM_SOON, || {
        let mut store = store.clone();
        async move { (stream(&mut store, "sl:dead").await.len() == 2).then_some(()) }
    })
    .await;
    assert!(
        fake.with(|r| r.messages.iter().all(|m| m.edits.is_empty())),
        "nothing was edited"
    );
    assert_eq!(status_of(&d).await, "pending");
    let env = approve_by_button(&fake, &first);
    acked(&fake, &env).await;
    let sent = wait_until("delivery", PLATFORM_SOON, || async {
        posted(&fake, TALK).first().cloned()
    })
    .await;
    let els = elements(&sent);
    assert!(
        els.iter().all(|e| e["type"] != "broadcast"),
        "<!channel> stays text: {els:?}"
    );
    assert!(
        els.iter().any(|e| e["type"] == "user"),
        "a user mention, as mentions = [users] allows"
    );
    closed(&fake, &first).await;
}

/// Once the deadline passes the card says so and loses its buttons, and a
/// press on it decides nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_press_after_the_deadline_decides_nothing() {
    let fake = FakeSlack::start(&[TALK, OPS]).await;
    let d = deployment(&fake, &GATED.replace("timeout = 0", "timeout = 3"));
    let _outbox = d.process("cowboy-slack-outbox", "sl");
    let _ingest = d.process("cowboy-slack-ingest", "sl");
    connected(&fake).await;
    send(
        &d,
        &[
            ("channel_id", TALK),
            ("content", "late"),
            ("request_id", "r1"),
        ],
    )
    .await;
    let first = card(&fake, &d, 0).await;
    let status = closed(&fake, &first).await;
    assert!(status.contains("Expired"), "{status}");
    let last = fake.with(|r| {
        r.at(&external(&first))
            .unwrap()
            .edits
            .last()
            .cloned()
            .unwrap()
    });
    assert!(
        !last.to_string().contains("cowboy_approve"),
        "no buttons on a closed card"
    );
    let env = approve_by_button(&fake, &first);
    acked(&fake, &env).await;
    let notice = wait_until("the expiry notice", PLATFORM_SOON, || async {
        inbox(&d, "ann:sl:inbox")
            .await
            .into_iter()
            .find(|n| n["request_id"] == "r1")
    })
    .await;
    assert_eq!(notice["status"], "expired");
    assert!(posted(&fake, TALK).is_empty(), "nothing sent");
    assert_eq!(
        inbox(&d, "ann:sl:inbox").await.len(),
        1,
        "one notice, no other outcome"
    );
}

/// A 429 storm on `chat.update` (every card edit refused, `Retry-After: 5`)
/// holds up nothing else: while the closing edit of an approved card is
/// still being waited out, a message to another channel is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_on_card_edits_delays_no_delivery() {
    let fake = FakeSlack::start(&[TALK, OPS]).await;
    let d = deployment(&fake, GATED);
    let _outbox = d.process("cowboy-slack-outbox", "sl");
    let _ingest = d.process("cowboy-slack-ingest", "sl");
    connected(&fake).await;
    fake.with(|r| {
        r.rate_limit_next.insert("chat.update".into(), 1000);
        r.retry_after.insert("chat.update".into(), 5);
    });
    send(&d, &[("channel_id", TALK), ("content", "approved one")]).await;
    let first = card(&fake, &d, 0).await;
    let env = approve_by_button(&fake, &first);
    acked(&fake, &env).await;
    wait_until("the closing edit refused", PLATFORM_SOON, || async {
        fake.with(|r| r.rate_limited.contains_key("chat.update"))
            .then_some(())
    })
    .await;
    // Another delivery of this bridge (a second card) goes out meanwhile.
    send(&d, &[("channel_id", TALK), ("content", "second")]).await;
    let second = card(&fake, &d, 1).await;
    let refused = fake.with(|r| r.rate_limited["chat.update"]);
    assert!(
        refused < 4,
        "the second card came while the first edit was still waited out ({refused} refusals)"
    );
    assert_ne!(second.ts, first.ts);
    assert!(fake.with(|r| r.at(&external(&first)).unwrap().edits.is_empty()));
}

/// With `dms = true`, a direct message to the bot reaches the inbox with
/// its DM channel, the agent answers by sending there, and a DM written
/// while the ingest was away is caught up (the channel is known from the
/// first one carried).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_messages_in_and_out() {
    const DM: &str = "D0ANN0001";
    let fake = FakeSlack::start(&[TALK, OPS, DM]).await;
    let d = deployment(&fake, "dms = true");
    let _outbox = d.process("cowboy-slack-outbox", "sl");
    let ingest = d.process("cowboy-slack-ingest", "sl");
    connected(&fake).await;
    let (ts, env) = fake.say(DM, "U0ANN0001", "hi bot", None);
    acked(&fake, &env).await;
    let carried = inbox(&d, "sl:inbox").await;
    assert_eq!(carried.len(), 1, "{carried:?}");
    assert_eq!(
        (
            carried[0]["channel_id"].as_str(),
            carried[0]["message_id"].as_str()
        ),
        (DM, ts.as_str())
    );
    send(&d, &[("channel_id", DM), ("content", "hello back")]).await;
    let answer = wait_until("the answer in the DM", PLATFORM_SOON, || async {
        posted(&fake, DM).first().cloned()
    })
    .await;
    assert_eq!(elements(&answer)[0]["text"], "hello back");
    assert_eq!(ingest.stop(), Some(0));
    wait_until("the connection closed", PLATFORM_SOON, || async {
        (!fake.connected()).then_some(())
    })
    .await;
    fake.say(DM, "U0ANN0001", "while you were away", None);
    let _ingest = d.process("cowboy-slack-ingest", "sl");
    let carried = wait_until("the DM caught up", PLATFORM_SOON, || async {
        let all = inbox(&d, "sl:inbox").await;
        (all.len() == 2).then_some(all)
    })
    .await;
    assert_eq!(carried[1]["content"], "while you were away");
}
