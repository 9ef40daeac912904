//! The Discord bridge: the real serenity client (in the real binaries) against
//! a local Discord that speaks the real protocol (harness::discord).

use std::time::Duration;

use broker::outbox::delivery_key;
use broker::{approval, keys};
use discord::render;
use harness::discord::{contents, FakeDiscord, BOT_ID, TOKEN};
use harness::TestStore;
use harness::{inbox, stream, wait_until, Deployment, Process};

/// Bounded wait on the local Discord: a gateway round trip and serenity's own
/// pacing take longer than a console bridge's `crate::SOON`.
const PLATFORM_SOON: Duration = Duration::from_secs(30);
const TALK: u64 = 111_111_111_111_111_111;
const OPS: u64 = 222_222_222_222_222_222;
const NOWHERE: u64 = 333_333_333_333_333_333;
const APPROVER: u64 = 42_000_000_000_000_042;
const STRANGER: u64 = 43_000_000_000_000_043;

fn deployment(fake: &FakeDiscord, approval: &str, extra: &str) -> Deployment {
    let d = Deployment::new(&format!(
        r#"
[agents.ann]

[bridges.dc]
type = "discord"
token_file = "{{dir}}/token"
api_base = "{api}"
gateway_url = "{gw}"
channels = ["{TALK}", "{OPS}"]
destinations = ["*"]
ping = {{ command = ["sh", "-c", "echo \"$COWBOY_FIELD_CONTENT\" >> {{dir}}/pinged"], debounce_ms = 100 }}
{approval}
{extra}"#,
        api = fake.api_base(),
        gw = fake.gateway_url(),
    ));
    std::fs::write(d.path("token"), format!("{TOKEN}\n")).unwrap();
    d
}

const GATED: &str = "approval = { required = true, notify = \"dc\", notify_channel = \"222222222222222222\", timeout = 0, approvers = [\"discord:42000000000000042\"] }";

async fn connected(fake: &FakeDiscord) {
    wait_until(
        "the ingest identified on the gateway",
        PLATFORM_SOON,
        || async { fake.identified().then_some(()) },
    )
    .await;
}

/// The card for the n-th approval: its head message.
async fn card(fake: &FakeDiscord, n: usize) -> harness::discord::Posted {
    wait_until(
        "an approval card with the bot's reactions",
        PLATFORM_SOON,
        || async {
            fake.with(|r| {
                let cards: Vec<_> = r
                    .posted
                    .iter()
                    .filter(|p| p.channel_id == OPS && p.content.contains("Approval requested"))
                    .cloned()
                    .collect();
                let card = cards.get(n)?.clone();
                let reacted = r
                    .reactions
                    .iter()
                    .filter(|(m, _, u)| *m == card.id && *u == BOT_ID)
                    .count()
                    == 2;
                reacted.then_some(card)
            })
        },
    )
    .await
}

/// Waits until the card is answerable: its map entry is recorded (just after
/// the bot's reactions; a human never reacts within those milliseconds).
async fn answerable(d: &Deployment, card: u64) {
    let store = d.store().await;
    wait_until("the card recorded as shown", PLATFORM_SOON, || {
        let mut store = store.clone();
        async move {
            let map = harness::hash(&mut store, &keys::approval_map("dc")).await;
            map.contains_key(&card.to_string()).then_some(())
        }
    })
    .await;
}

/// Waits for the card's closing edit and returns its text.
async fn closed(fake: &FakeDiscord, card: u64) -> String {
    wait_until("the card closed", PLATFORM_SOON, || async {
        fake.with(|r| {
            r.posted
                .iter()
                .find(|p| p.id == card)
                .and_then(|p| p.edits.last().cloned())
        })
    })
    .await
}

/// An agent entry is delivered with its content, reply reference and a nonce
/// derived from the entry (enforced).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivers_with_reference_and_nonce() {
    let fake = FakeDiscord::start(&[TALK, OPS]).await;
    let d = deployment(&fake, "", "");
    let outbox = d.process("cowboy-discord-outbox", "dc");
    let mut store = d.store().await;
    let id = store
        .xadd(
            "ann:dc:outbox",
            &[
                ("channel_id", TALK.to_string().as_bytes()),
                ("content", b"hello **there**"),
                ("reply_to", b"555555555555555555"),
            ],
        )
        .await
        .unwrap();
    let posted = wait_until("a message", PLATFORM_SOON, || async {
        fake.with(|r| r.posted.first().cloned())
    })
    .await;
    assert_eq!(
        (posted.channel_id, posted.content.as_str()),
        (TALK, "hello **there**")
    );
    assert_eq!(posted.reference, Some(555_555_555_555_555_555));
    assert_eq!(
        posted.nonce.as_deref(),
        Some(render::nonce(&delivery_key("ann:dc:outbox", &id), 0).as_str())
    );
    assert!(posted.enforce_nonce);
    assert_eq!(outbox.stop(), Some(0));
    assert!(
        fake.with(|r| r.unexpected.is_empty()),
        "{:?}",
        fake.with(|r| r.unexpected.clone())
    );
}

/// A wrong or revoked token is the deployment's fault, not the message's: the
/// outbox stops at its first refused send with exit 78 (which systemd does not
/// restart) naming the bridge, the ingest with exit 78 naming `token_file`;
/// nothing is dead-lettered, and once the token is fixed the waiting message
/// is delivered, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_token_stops_the_bridge_and_loses_nothing() {
    let fake = FakeDiscord::start(&[TALK, OPS]).await;
    let d = deployment(&fake, "", "");
    std::fs::write(d.path("token"), "revoked-token\n").unwrap();
    let mut store = d.store().await;
    store
        .xadd(
            "ann:dc:outbox",
            &[
                ("channel_id", TALK.to_string().as_bytes()),
                ("content", b"kept"),
            ],
        )
        .await
        .unwrap();
    let outbox = d.process("cowboy-discord-outbox", "dc");
    assert_eq!(outbox.wait_code(PLATFORM_SOON), Some(78));
    let log = std::fs::read_to_string(d.path("cowboy-discord-outbox-dc.log")).unwrap();
    assert!(
        log.contains("`bridges.dc`") && log.contains("refused this bridge's credentials"),
        "{log}"
    );
    let ingest = d.process("cowboy-discord-ingest", "dc");
    assert_eq!(ingest.wait_code(PLATFORM_SOON), Some(78));
    let log = std::fs::read_to_string(d.path("cowboy-discord-ingest-dc.log")).unwrap();
    assert!(log.contains("`bridges.dc.token_file`"), "{log}");
    assert!(stream(&mut store, &keys::dead("dc")).await.is_empty());
    assert!(
        inbox(&d, "ann:dc:inbox").await.is_empty(),
        "no notice: nothing failed"
    );
    assert!(fake.with(|r| r.posted.is_empty()));

    std::fs::write(d.path("token"), format!("{TOKEN}\n")).unwrap();
    let outbox = d.process("cowboy-discord-outbox", "dc");
    wait_until("the waiting message delivered", PLATFORM_SOON, || async {
        fake.with(|r| r.posted.first().cloned())
    })
    .await;
    assert_eq!(outbox.stop(), Some(0));
    let posted = fake.with(|r| r.posted.clone());
    assert_eq!(posted.len(), 1, "{posted:?}");
    assert_eq!(posted[0].content, "kept");
}

/// 5,000 characters arrive whole, in several messages within Discord's limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_message_arrives_whole_split() {
    let fake = FakeDiscord::start(&[TALK]).await;
    let d = deployment(&fake, "", "");
    let _outbox = d.process("cowboy-discord-outbox", "dc");
    let content: String = (0..1000)
        .map(|i| format!("w{i:03}"))
        .collect::<Vec<_>>()
        .join(" ");
    assert!(content.len() >= 4999);
    let mut store = d.store().await;
    store
        .xadd(
            "dc:outbox",
            &[
                ("channel_id", TALK.to_string().as_bytes()),
                ("content", content.as_bytes()),
            ],
        )
        .await
        .unwrap();
    let parts = wait_until("all parts", PLATFORM_SOON, || async {
        let c = fake.with(|r| contents(r, TALK));
        (c.len() >= 3 && c.join(" ").len() == content.len()).then_some(c)
    })
    .await;
    assert!(parts.iter().all(|p| p.chars().count() <= 2000));
    assert_eq!(parts.join(" "), content, "nothing cut");
}

/// Discord's buckets are obeyed before they bite: with the local Discord
/// enforcing 5 posts per channel per second and sending the real
/// X-RateLimit-* headers, 20 messages to one channel and 20 spread over four
/// are all delivered, in order per channel, with no 429 at all (the sender
/// reads each channel's bucket from the headers and waits for it to refill), and a
/// full bucket on one channel holds back no other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_buckets_are_obeyed_before_they_bite() {
    const MORE: [u64; 3] = [
        444_444_444_444_444_444,
        555_555_555_555_555_555,
        666_666_666_666_666_666,
    ];
    let fake = FakeDiscord::start(&[TALK, OPS, MORE[0], MORE[1], MORE[2]]).await;
    fake.enforce_buckets(5, Duration::from_secs(1));
    let d = deployment(&fake, "", "");
    let outbox = d.process("cowboy-discord-outbox", "dc");
    let mut store = d.store().await;
    let spread = [TALK, MORE[0], MORE[1], MORE[2]];
    for i in 0..20 {
        for (to, text) in [
            (TALK, format!("one {i}")),
            (spread[i % 4], format!("spread {i}")),
        ] {
            store
                .xadd(
                    "ann:dc:outbox",
                    &[
                        ("channel_id", to.to_string().as_bytes()),
                        ("content", text.as_bytes()),
                    ],
                )
                .await
                .unwrap();
        }
    }
    wait_until("all 40 delivered", Duration::from_secs(60), || async {
        fake.with(|r| (r.posted.len() == 40).then_some(()))
    })
    .await;
    let in_order = |channel: u64| {
        let c = fake.with(|r| contents(r, channel));
        let mut sorted = c.clone();
        sorted.sort_by_key(|t| t.rsplit(' ').next().unwrap().parse::<u32>().unwrap());
        (c.len(), c == sorted)
    };
    assert_eq!(in_order(TALK), (25, true));
    for c in MORE {
        assert_eq!(in_order(c), (5, true));
    }
    let refused = fake.with(|r| r.bucket_429s.clone());
    assert!(refused.is_empty(), "429s per channel: {refused:?}");
    assert!(inbox(&d, "ann:dc:inbox")
        .await
        .iter()
        .all(|n| n["status"] == "delivered"));
    assert_eq!(outbox.stop(), Some(0));
}

/// Buckets as Discord sets them (5 posts per channel per 5 s, with the real
/// headers), on paused time, counted window by window while the clock stands
/// still: 50 messages to one channel go 5 per window, so they need nine
/// refills, while 50 spread over five channels go 25 per window and need
/// one (a full bucket on one channel holds back no other); no bucket draws a
/// 429 (the sender waits before it would).
#[tokio::test(start_paused = true)]
async fn five_channels_are_served_side_by_side() {
    const MORE: [u64; 4] = [
        444_444_444_444_444_444,
        555_555_555_555_555_555,
        666_666_666_666_666_666,
        777_777_777_777_777_777,
    ];
    const WINDOW: Duration = Duration::from_secs(5);
    let time = harness::Frozen::hold();
    let fake = FakeDiscord::start(&[TALK, OPS, MORE[0], MORE[1], MORE[2], MORE[3]]).await;
    fake.enforce_buckets(5, WINDOW);
    let d = deployment(&fake, "", "");
    let _outbox = d.run_paused::<discord::Discord>(
        broker::config::Service::Outbox,
        "dc",
        broker::timing::Timing::default(),
    );
    let mut store = d.store().await;
    let posted = || fake.with(|r| r.posted.len());
    // Writes 50 messages over `channels`; returns how many posts each window
    // took, with the clock still within a window and moved past the next
    // refill after it.
    let mut run = async |channels: &[u64], tag: &str| {
        let before = posted();
        for i in 0..50 {
            let to = channels[i % channels.len()];
            store
                .xadd(
                    "ann:dc:outbox",
                    &[
                        ("channel_id", to.to_string().as_bytes()),
                        ("content", format!("{tag} {i}").as_bytes()),
                    ],
                )
                .await
                .unwrap();
        }
        let mut per_window = Vec::new();
        let mut seen = before;
        while seen < before + 50 && per_window.len() < 12 {
            // What this window lets through, the clock standing still: the
            // count settles once every sender waits for its bucket.
            let want = (before + 50).min(seen + 5 * channels.len());
            let now = wait_until(
                &format!("the {tag} run's posts in window {}", per_window.len() + 1),
                PLATFORM_SOON,
                || async { (posted() >= want).then_some(posted()) },
            )
            .await;
            per_window.push(now - seen);
            seen = now;
            // To half a window past the next refill: a sender hears when its
            // bucket refills from an answer that may land after the clock
            // has moved a step or two (the machine is busy), and waits
            // that much longer; half a window of slack still counts each
            // refill in a window of its own.
            let to = fake.next_refill() + WINDOW / 2;
            time.advance(to - tokio::time::Instant::now()).await;
        }
        per_window
    };
    let one = run(&[TALK], "one").await;
    assert_eq!(one, [5; 10], "one channel: posts per window");
    let five = run(&[TALK, MORE[0], MORE[1], MORE[2], MORE[3]], "five").await;
    assert_eq!(five, [25, 25], "five channels: posts per window");
    let refused = fake.with(|r| r.bucket_429s.clone());
    assert!(refused.is_empty(), "429s per channel: {refused:?}");
    for (channel, n) in [(TALK, 60), (MORE[0], 10), (MORE[3], 10)] {
        assert_eq!(contents_of(&fake, channel).len(), n, "posts in {channel}");
    }
}

/// The saved positions are taken up before anything is carried: a live
/// message heard right after READY, before the guild has arrived and the
/// catch-up has begun, does not make the catch-up forget where the other
/// channels stood, so what was written there meanwhile is still carried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_message_before_the_catch_up_loses_nothing_written_meanwhile() {
    let fake = FakeDiscord::start(&[TALK, OPS]).await;
    let d = deployment(&fake, "", "");
    let ingest = d.process("cowboy-discord-ingest", "dc");
    connected(&fake).await;
    fake.user_message(TALK, APPROVER, "boss", "before 1", None);
    fake.user_message(OPS, APPROVER, "boss", "before 2", None);
    let carried = |text: &'static str| {
        let d = &d;
        async move {
            let entries = inbox(d, "dc:inbox").await;
            entries.iter().any(|e| e["content"] == text).then_some(())
        }
    };
    wait_until("the first messages carried", PLATFORM_SOON, || async {
        carried("before 1").await?;
        carried("before 2").await
    })
    .await;
    assert_eq!(ingest.stop(), Some(0));
    fake.user_message(OPS, APPROVER, "boss", "while away", None);
    fake.hold_guilds();
    let _ingest = d.process("cowboy-discord-ingest", "dc");
    wait_until("a new session", PLATFORM_SOON, || async {
        fake.with(|r| (r.identifies >= 2).then_some(()))
    })
    .await;
    fake.user_message(TALK, APPROVER, "boss", "live first", None);
    wait_until("the live message carried", PLATFORM_SOON, || {
        carried("live first")
    })
    .await;
    fake.release_guilds();
    wait_until(
        "the message written meanwhile carried",
        PLATFORM_SOON,
        || carried("while away"),
    )
    .await;
    let texts: Vec<String> = inbox(&d, "dc:inbox")
        .await
        .iter()
        .map(|e| e["content"].clone())
        .collect();
    assert_eq!(texts.len(), 4, "each once: {texts:?}");
}

/// The bridge's own budget of refused requests (Discord bans an address for
/// an hour at 10,000 in ten minutes): with a token Discord refuses, 1,000
/// calls draw 1,000 401s, the next is held back without reaching Discord, and
/// once ten minutes have passed since the first, calls go out again.
#[tokio::test(start_paused = true)]
async fn refused_requests_stop_at_the_bridges_budget() {
    let _time = harness::Frozen::hold();
    let fake = FakeDiscord::start(&[TALK]).await;
    let settings: discord::config::DiscordSettings = serde_json::from_value(
        serde_json::json!({"token_file": "unused", "api_base": fake.api_base()}),
    )
    .unwrap();
    let rest = discord::rest(&settings, "not-the-token").unwrap();
    let requests = || fake.with(|r| r.requests);
    for n in 0..discord::rest::INVALID_BUDGET {
        let refused = rest.channel(TALK).await.unwrap_err().to_string();
        assert!(refused.contains("401"), "call {n}: {refused}");
    }
    assert_eq!(requests(), discord::rest::INVALID_BUDGET);
    let held = rest.channel(TALK).await.unwrap_err().to_string();
    assert!(held.contains("holding back"), "{held}");
    assert_eq!(requests(), discord::rest::INVALID_BUDGET, "nothing asked");
    tokio::time::advance(discord::rest::INVALID_WINDOW).await;
    let asked = rest.channel(TALK).await.unwrap_err().to_string();
    assert!(asked.contains("401"), "{asked}");
    assert_eq!(requests(), discord::rest::INVALID_BUDGET + 1);
}

/// Calls Discord would refuse are not made (each 403 counts toward its ban):
/// where the bot may not manage messages, a stranger's ✅ on a card stays, no
/// removal tried, and the approver's still decides; a listened channel the
/// bot may not view is not read when catching up, while the others are. The
/// local Discord sends the overwrites in GUILD_CREATE, answers 403 where they
/// deny, and counts no such answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_the_bots_permissions_refuse_are_not_made() {
    use harness::discord::permission;
    let fake = FakeDiscord::start(&[TALK, OPS]).await;
    fake.deny_bot(OPS, permission::MANAGE_MESSAGES);
    fake.deny_bot(TALK, permission::VIEW_CHANNEL);
    let d = deployment(&fake, GATED, "");
    let _outbox = d.process("cowboy-discord-outbox", "dc");
    let ingest = d.process("cowboy-discord-ingest", "dc");
    connected(&fake).await;
    let mut store = d.store().await;
    ann_posts(&mut store, &["needs a yes"]).await;
    let card = card(&fake, 0).await;
    answerable(&d, card.id).await;
    let log = || std::fs::read_to_string(d.path("cowboy-discord-ingest-dc.log")).unwrap();
    fake.user_reaction(OPS, card.id, STRANGER, "✅");
    wait_until("the stranger's reaction left", PLATFORM_SOON, || async {
        log().contains("a stranger's reaction stays").then_some(())
    })
    .await;
    fake.user_reaction(OPS, card.id, APPROVER, "✅");
    wait_until("the approved delivery", PLATFORM_SOON, || async {
        (contents_of(&fake, TALK) == ["needs a yes"]).then_some(())
    })
    .await;
    assert_eq!(ingest.stop(), Some(0));
    fake.user_message(TALK, APPROVER, "boss", "unreadable", None);
    fake.user_message(OPS, APPROVER, "boss", "readable", None);
    let _ingest = d.process("cowboy-discord-ingest", "dc");
    wait_until("the readable channel caught up", PLATFORM_SOON, || async {
        let carried = inbox(&d, "dc:inbox").await;
        carried
            .iter()
            .any(|e| e["content"] == "readable")
            .then_some(())
    })
    .await;
    wait_until(
        "the unreadable channel passed over",
        PLATFORM_SOON,
        || async {
            log()
                .lines()
                .any(|l| l.contains("not caught up") && l.contains(&TALK.to_string()))
                .then_some(())
        },
    )
    .await;
    let carried = inbox(&d, "dc:inbox").await;
    assert!(carried.iter().all(|e| e["content"] != "unreadable"));
    assert!(fake.with(|r| r.removed.is_empty()), "no removal tried");
    assert_eq!(fake.with(|r| r.forbidden), 0, "no call Discord refused");
}

/// With `dms = true` a direct message to the bot reaches the inbox (with its
/// DM channel, which is not listed in `channels`), and the agent's answer to
/// that channel is delivered there; DMs written while the ingest was away are
/// caught up once; with `dms` off, a DM is not carried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_messages_in_and_out() {
    const DM: u64 = 777_777_777_777_777_777;
    let fake = FakeDiscord::start(&[TALK, DM]).await;
    let d = deployment(&fake, "", "dms = true");
    let outbox = d.process("cowboy-discord-outbox", "dc");
    let ingest = d.process("cowboy-discord-ingest", "dc");
    connected(&fake).await;
    let id = fake.user_dm(DM, APPROVER, "boss", "are you there?");
    let entry = wait_until("the DM in the inbox", PLATFORM_SOON, || async {
        inbox(&d, "dc:inbox").await.into_iter().next()
    })
    .await;
    assert_eq!(
        (
            entry["channel_id"].as_str(),
            entry["message_id"].as_str(),
            entry["content"].as_str()
        ),
        (
            DM.to_string().as_str(),
            id.to_string().as_str(),
            "are you there?"
        )
    );
    let mut store = d.store().await;
    store
        .xadd(
            "ann:dc:outbox",
            &[
                ("channel_id", DM.to_string().as_bytes()),
                ("content", b"yes, here"),
            ],
        )
        .await
        .unwrap();
    wait_until("the answer in the DM", PLATFORM_SOON, || async {
        fake.with(|r| (contents(r, DM) == ["yes, here"]).then_some(()))
    })
    .await;
    // DMs written while the ingest is away are caught up in a DM channel it
    // has carried from before, in order, once each.
    assert_eq!(ingest.stop(), Some(0));
    fake.user_dm(DM, APPROVER, "boss", "while you were away");
    fake.user_dm(DM, APPROVER, "boss", "and again");
    let ingest = d.process("cowboy-discord-ingest", "dc");
    let dms = wait_until("the DMs caught up", PLATFORM_SOON, || async {
        let e = inbox(&d, "dc:inbox").await;
        (e.len() >= 3).then_some(e)
    })
    .await;
    let texts: Vec<&str> = dms.iter().map(|e| e["content"].as_str()).collect();
    assert_eq!(
        texts,
        ["are you there?", "while you were away", "and again"]
    );
    assert_eq!(ingest.stop(), Some(0));
    let _ingest = d.process("cowboy-discord-ingest", "dc");
    connected(&fake).await;
    fake.user_dm(DM, APPROVER, "boss", "live again");
    let all = wait_until(
        "the live DM after a second restart",
        PLATFORM_SOON,
        || async {
            let e = inbox(&d, "dc:inbox").await;
            (e.len() >= 4).then_some(e)
        },
    )
    .await;
    assert_eq!(all.len(), 4, "nothing carried twice");
    drop(_ingest);
    assert_eq!(outbox.stop(), Some(0));

    let fake = FakeDiscord::start(&[TALK, DM]).await;
    let d = deployment(&fake, "", "");
    let _ingest = d.process("cowboy-discord-ingest", "dc");
    connected(&fake).await;
    fake.user_dm(DM, APPROVER, "boss", "not carried");
    fake.user_message(TALK, APPROVER, "boss", "carried", None);
    let entries = wait_until("the channel message", PLATFORM_SOON, || async {
        let e = inbox(&d, "dc:inbox").await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    let texts: Vec<&str> = entries.iter().map(|e| e["content"].as_str()).collect();
    assert_eq!(texts, ["carried"]);
}

/// A retried send with the same nonce creates one message, and returns its id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_send_creates_one_message() {
    use broker::bridge::{Outgoing, Sender};
    let fake = FakeDiscord::start(&[TALK]).await;
    let d = deployment(&fake, "", "");
    let s = discord::settings(&d.config, "dc").unwrap();
    let sender = discord::send::DiscordSender::new(
        std::sync::Arc::new(discord::rest(&s, TOKEN).unwrap()),
        vec!["users".into()],
    );
    let message = broker::entry::Message {
        channel_id: TALK.to_string(),
        content: "once".into(),
        ..Default::default()
    };
    let mut ids = Vec::new();
    for retry in [false, true] {
        ids.push(
            sender
                .send(Outgoing {
                    message: &message,
                    delivery_key: "dc:outbox/9-0",
                    retry,
                    approval: None,
                })
                .await
                .unwrap(),
        );
    }
    assert_eq!(ids[0], ids[1]);
    assert_eq!(fake.with(|r| (r.posted.len(), r.nonce_hits)), (1, 1));
}

/// 429s are waited out, not turned into failures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_are_waited_out() {
    let fake = FakeDiscord::start(&[TALK]).await;
    let d = deployment(&fake, "", "");
    fake.rate_limit(2);
    let _outbox = d.process("cowboy-discord-outbox", "dc");
    let mut store = d.store().await;
    store
        .xadd(
            "dc:outbox",
            &[
                ("channel_id", TALK.to_string().as_bytes()),
                ("content", b"patience"),
            ],
        )
        .await
        .unwrap();
    wait_until("delivery after two 429s", PLATFORM_SOON, || async {
        fake.with(|r| r.posted.first().cloned())
    })
    .await;
    assert_eq!(fake.with(|r| (r.rate_limited, r.posted.len())), (2, 1));
    assert!(stream(&mut store, "dc:dead").await.is_empty());
}

/// An unknown channel is a permanent error: dead letter with Discord's reason, and a
/// notice. Discord is asked once: later entries to that channel are refused from
/// memory for ten minutes (refused requests count toward its ban on an address).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_channel_is_dead_lettered() {
    let fake = FakeDiscord::start(&[TALK]).await;
    let d = deployment(&fake, "", "");
    let _outbox = d.process("cowboy-discord-outbox", "dc");
    let mut store = d.store().await;
    for _ in 0..5 {
        store
            .xadd(
                "ann:dc:outbox",
                &[
                    ("channel_id", NOWHERE.to_string().as_bytes()),
                    ("content", b"lost"),
                ],
            )
            .await
            .unwrap();
    }
    let notices = wait_until("five notices", PLATFORM_SOON, || async {
        let n = inbox(&d, "ann:dc:inbox").await;
        (n.len() == 5).then_some(n)
    })
    .await;
    for notice in &notices {
        assert_eq!(notice["status"], "failed");
        assert!(
            notice["reason"].contains("Unknown Channel"),
            "{}",
            notice["reason"]
        );
    }
    assert_eq!(stream(&mut store, "dc:dead").await.len(), 5);
    // Discord was asked once: the refusal is remembered, so invalid requests
    // do not pile up toward its ban on the address.
    assert_eq!(fake.with(|r| r.invalid), 1);
}

/// The approval channel under another spelling is still the approval channel:
/// `+id` and `0id` (which serenity's id parsing reads as `id`) are refused as
/// not a channel id, the exact id as where approvals are shown; nothing is
/// posted there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_approval_channel_has_one_spelling() {
    let fake = FakeDiscord::start(&[TALK, OPS]).await;
    let d = deployment(&fake, GATED, "");
    let outbox = d.process("cowboy-discord-outbox", "dc");
    let mut store = d.store().await;
    let spellings = [
        (format!("+{OPS}"), "not a Discord channel id"),
        (format!("0{OPS}"), "not a Discord channel id"),
        (format!("{OPS}"), "where approval requests are shown"),
    ];
    for (to, _) in &spellings {
        store
            .xadd(
                "ann:dc:outbox",
                &[
                    ("channel_id", to.as_bytes()),
                    ("content", b"Approval requested"),
                ],
            )
            .await
            .unwrap();
    }
    let notices = wait_until("three refusals", PLATFORM_SOON, || async {
        let n = inbox(&d, "ann:dc:inbox").await;
        (n.len() >= 3).then_some(n)
    })
    .await;
    for ((to, why), n) in spellings.iter().zip(&notices) {
        assert_eq!(n["status"], "invalid", "{to}: {n:?}");
        assert!(n["reason"].contains(why), "{to}: {n:?}");
    }
    assert_eq!(outbox.stop(), Some(0));
    assert!(
        fake.with(|r| r.posted.is_empty()),
        "nothing was posted anywhere"
    );
}

/// The card shows the full content and sha256 and carries the bot's ✅ ❌; the
/// bot's own ✅ and a stranger's ✅ change nothing (the stranger's is removed);
/// the approver's ✅ delivers once and closes the card.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_by_reaction() {
    let fake = FakeDiscord::start(&[TALK, OPS]).await;
    let d = deployment(&fake, GATED, "");
    let _outbox = d.process("cowboy-discord-outbox", "dc");
    let _ingest = d.process("cowboy-discord-ingest", "dc");
    connected(&fake).await;
    let mut store = d.store().await;
    let content = "Dear all,\nthe release ships **today**.";
    store
        .xadd(
            "ann:dc:outbox",
            &[
                ("channel_id", TALK.to_string().as_bytes()),
                ("content", content.as_bytes()),
            ],
        )
        .await
        .unwrap();
    let card = card(&fake, 0).await;
    assert!(card.content.contains(content), "{}", card.content);
    let message = broker::entry::Message {
        channel_id: TALK.to_string(),
        content: content.to_string(),
        ..Default::default()
    };
    assert!(
        card.content.contains(&message.sha256()),
        "the whole-message digest"
    );
    fake.user_reaction(OPS, card.id, STRANGER, "✅");
    wait_until("the stranger's reaction removed", PLATFORM_SOON, || async {
        fake.with(|r| {
            r.removed
                .iter()
                .any(|(m, e, u)| *m == card.id && e == "✅" && *u == STRANGER)
                .then_some(())
        })
    })
    .await;
    let ids = approval::list_ids(&mut store).await.unwrap();
    assert_eq!(
        harness::hash(&mut store, &keys::approval(&ids[0])).await["status"],
        "pending",
        "bot and stranger decided nothing"
    );
    assert!(fake.with(|r| contents(r, TALK)).is_empty());
    fake.user_reaction(OPS, card.id, APPROVER, "✅");
    wait_until("delivery", PLATFORM_SOON, || async {
        fake.with(|r| (!contents(r, TALK).is_empty()).then_some(()))
    })
    .await;
    let edited = closed(&fake, card.id).await;
    assert!(
        edited.contains("Approved") && edited.contains(&format!("<@{APPROVER}>")),
        "{edited}"
    );
    assert_eq!(fake.with(|r| contents(r, TALK)), [content]);
    no_records_left(&store).await;
}

/// 💤 on a card: a stranger's moves nothing (and is removed); the approver's
/// moves the deadline by `approval.snooze` and the card is drawn again, still
/// answerable, saying until when; a `later 2h` reply moves it again; then a
/// ✅ delivers once and closes the card.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn later_on_a_card_moves_its_deadline_and_redraws_it() {
    let fake = FakeDiscord::start(&[TALK, OPS]).await;
    let gated = GATED.replace(
        "timeout = 0",
        "timeout = 600, snooze = 900, max_snooze = 7200",
    );
    let d = deployment(&fake, &gated, "");
    let _outbox = d.process("cowboy-discord-outbox", "dc");
    let _ingest = d.process("cowboy-discord-ingest", "dc");
    connected(&fake).await;
    let mut store = d.store().await;
    ann_posts(&mut store, &["after the meeting"]).await;
    let card = card(&fake, 0).await;
    answerable(&d, card.id).await;
    let id = approval::list_ids(&mut store).await.unwrap().remove(0);
    let deadline =
        |r: &std::collections::HashMap<String, String>| -> u64 { r["expires_at"].parse().unwrap() };
    let first = deadline(&harness::hash(&mut store, &keys::approval(&id)).await);
    fake.user_reaction(OPS, card.id, STRANGER, "💤");
    wait_until("the stranger's 💤 removed", PLATFORM_SOON, || async {
        fake.with(|r| {
            r.removed
                .iter()
                .any(|(m, e, u)| *m == card.id && e == "💤" && *u == STRANGER)
                .then_some(())
        })
    })
    .await;
    fake.user_reaction(OPS, card.id, APPROVER, "💤");
    let redrawn = wait_until(
        "the card redrawn with its snooze",
        PLATFORM_SOON,
        || async {
            fake.with(|r| {
                let p = r.posted.iter().find(|p| p.id == card.id)?;
                p.edits.last().filter(|e| e.contains("Snoozed")).cloned()
            })
        },
    )
    .await;
    let r = harness::hash(&mut store, &keys::approval(&id)).await;
    assert_eq!(
        deadline(&r),
        first + 900,
        "the stranger moved nothing: {r:?}"
    );
    assert!(
        redrawn.contains(&format!("<t:{}:f>", first + 900))
            && redrawn.contains("after the meeting")
            && redrawn.contains(render::HOW_TO_ANSWER),
        "the live card, with its new deadline: {redrawn}"
    );
    fake.user_message(
        OPS,
        APPROVER,
        "boss",
        "later 2h back from lunch",
        Some(card.id),
    );
    wait_until("the reply's snooze", PLATFORM_SOON, || {
        let mut store = store.clone();
        let id = id.clone();
        async move {
            let r = harness::hash(&mut store, &keys::approval(&id)).await;
            (r.get("snoozes").map(String::as_str) == Some("2")).then_some(())
        }
    })
    .await;
    let r = harness::hash(&mut store, &keys::approval(&id)).await;
    assert_eq!(deadline(&r), first + 900 + 7200);
    assert_eq!(r["status"], "pending", "a snooze decides nothing");
    fake.user_reaction(OPS, card.id, APPROVER, "✅");
    let edited = closed_with(&fake, card.id, "Approved").await;
    assert!(edited.contains("Approved"), "{edited}");
    assert_eq!(fake.with(|r| contents(r, TALK)), ["after the meeting"]);
    no_records_left(&store).await;
}

/// An escalation step on a Discord approval: nobody answers for 2 s, so the
/// step's surface (a console bridge) is asked too; the live Discord card is
/// redrawn saying so, still answerable; the step's approver decides on the
/// other surface, and the Discord card is closed with the outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_escalation_redraws_the_card_and_an_answer_elsewhere_closes_it() {
    let fake = FakeDiscord::start(&[TALK, OPS]).await;
    let ladder = GATED.replace(
        "timeout = 0",
        "timeout = 600, escalate = [{ after = 2, notify = \"hall\", notify_channel = \"floor\", approvers = [\"console:carol\"] }]",
    );
    let hall = "[bridges.hall]\ntype = \"console\"\noutput = \"{dir}/hall.out\"\ninput = \"{dir}/hall.in\"\ndestinations = [\"floor\"]\n";
    let d = deployment(&fake, &ladder, hall);
    let _outbox = d.process("cowboy-discord-outbox", "dc");
    let _ingest = d.process("cowboy-discord-ingest", "dc");
    let _hall = [d.spawn("outbox", "hall"), d.spawn("ingest", "hall")];
    connected(&fake).await;
    let mut store = d.store().await;
    ann_posts(&mut store, &["ship the release"]).await;
    let card = card(&fake, 0).await;
    answerable(&d, card.id).await;
    let redrawn = wait_until("the card redrawn with the step", PLATFORM_SOON, || async {
        fake.with(|r| {
            let p = r.posted.iter().find(|p| p.id == card.id)?;
            p.edits.last().filter(|e| e.contains("Escalated")).cloned()
        })
    })
    .await;
    assert!(
        redrawn.contains("asked on dc, hall")
            && redrawn.contains("ship the release")
            && redrawn.contains(render::HOW_TO_ANSWER),
        "the live card, saying who else is asked: {redrawn}"
    );
    let asked = wait_until("the step's card on hall", PLATFORM_SOON, || async {
        d.delivered("hall.out").first().cloned()
    })
    .await;
    assert_eq!(asked.channel_id, "floor");
    wait_until("hall's card recorded as shown", PLATFORM_SOON, || {
        let mut store = store.clone();
        let external = asked.external_id.clone();
        async move {
            harness::hash(&mut store, &keys::approval_map("hall"))
                .await
                .contains_key(&external)
                .then_some(())
        }
    })
    .await;
    d.write_input(
        "hall.in",
        serde_json::json!({"kind": "reaction", "message_id": asked.external_id, "emoji": "✅", "user": "carol", "reason": ""}),
    );
    let edited = closed_with(&fake, card.id, "Approved").await;
    assert!(edited.contains("console:carol"), "{edited}");
    assert_eq!(fake.with(|r| contents(r, TALK)), ["ship the release"]);
}

/// `approval.remind_after`: a card still waiting gets one reminder, a reply
/// to it, once; a card decided first gets none; the trail says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_card_is_reminded_once_and_a_decided_one_never() {
    let fake = FakeDiscord::start(&[TALK, OPS]).await;
    let gated = GATED.replace("timeout = 0", "timeout = 600, remind_after = 2");
    let d = deployment(&fake, &gated, "");
    let _outbox = d.process("cowboy-discord-outbox", "dc");
    let _ingest = d.process("cowboy-discord-ingest", "dc");
    connected(&fake).await;
    let mut store = d.store().await;
    ann_posts(&mut store, &["waits", "decided at once"]).await;
    let (waiting, decided) = (card(&fake, 0).await, card(&fake, 1).await);
    answerable(&d, decided.id).await;
    fake.user_reaction(OPS, decided.id, APPROVER, "✅");
    closed(&fake, decided.id).await;
    let reminders = |card: u64| {
        fake.with(|r| {
            r.posted
                .iter()
                .filter(|p| p.reference == Some(card) && p.content.contains("Still waiting"))
                .count()
        })
    };
    let reminder = wait_until("the waiting card's reminder", PLATFORM_SOON, || async {
        fake.with(|r| {
            r.posted
                .iter()
                .find(|p| p.reference == Some(waiting.id))
                .cloned()
        })
    })
    .await;
    assert!(
        reminder.content.contains("Still waiting") && reminder.channel_id == OPS,
        "{}",
        reminder.content
    );
    answerable(&d, waiting.id).await;
    fake.user_reaction(OPS, waiting.id, APPROVER, "✅");
    closed(&fake, waiting.id).await;
    assert_eq!(reminders(waiting.id), 1, "reminded once");
    assert_eq!(reminders(decided.id), 0, "a decided card is never reminded");
    let trail = stream(&mut store, &keys::audit("dc")).await;
    let reminded: Vec<_> = trail.iter().filter(|e| e["event"] == "reminded").collect();
    assert_eq!(reminded.len(), 1, "{trail:?}");
    no_records_left(&store).await;
}

/// Ann writes each of `contents` to TALK through dc, in order.
async fn ann_posts(store: &mut TestStore, contents: &[&str]) {
    for content in contents {
        store
            .xadd(
                "ann:dc:outbox",
                &[
                    ("channel_id", TALK.to_string().as_bytes()),
                    ("content", content.as_bytes()),
                ],
            )
            .await
            .unwrap();
    }
}

/// Waits for an edit of the card containing `what`.
async fn closed_with(fake: &FakeDiscord, card: u64, what: &str) -> String {
    wait_until("the card's edit", PLATFORM_SOON, || async {
        fake.with(|r| {
            let p = r.posted.iter().find(|p| p.id == card)?;
            p.edits.iter().rev().find(|e| e.contains(what)).cloned()
        })
    })
    .await
}

/// A restarted ingest identifies afresh, and the gateway replays nothing to a
/// new session: what approvers did on live cards meanwhile is read over REST
/// when it connects. The approver's ✅ on one card delivers it (a stranger's
/// ✅ there decides nothing and is removed), the approver's reply `reject`
/// to another rejects it with the reason, and a card with both ✅ and ❌ is
/// rejected (rejections are answered first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_made_while_the_ingest_was_away_are_caught_up() {
    let fake = FakeDiscord::start(&[TALK, OPS]).await;
    let d = deployment(&fake, GATED, "");
    let _outbox = d.process("cowboy-discord-outbox", "dc");
    let ingest = d.process("cowboy-discord-ingest", "dc");
    connected(&fake).await;
    let mut store = d.store().await;
    for (content, request) in [("one", "r1"), ("two", "r2"), ("three", "r3")] {
        store
            .xadd(
                "ann:dc:outbox",
                &[
                    ("channel_id", TALK.to_string().as_bytes()),
                    ("content", content.as_bytes()),
                    ("request_id", request.as_bytes()),
                ],
            )
            .await
            .unwrap();
    }
    let (first, second) = (card(&fake, 0).await, card(&fake, 1).await);
    let third = card(&fake, 2).await;
    assert_eq!(ingest.stop(), Some(0));
    // Both on one card: a rejection counts whatever order they are listed in.
    fake.user_reaction(OPS, third.id, APPROVER, "✅");
    fake.user_reaction(OPS, third.id, APPROVER, "❌");
    fake.user_reaction(OPS, first.id, STRANGER, "✅");
    fake.user_reaction(OPS, first.id, APPROVER, "✅");
    fake.user_message(OPS, APPROVER, "boss", "reject not now", Some(second.id));
    assert!(
        fake.with(|r| contents(r, TALK)).is_empty(),
        "nobody listened"
    );
    let _ingest = d.process("cowboy-discord-ingest", "dc");
    wait_until("the approved message delivered", PLATFORM_SOON, || async {
        fake.with(|r| (!contents(r, TALK).is_empty()).then_some(()))
    })
    .await;
    let rejected = wait_until("the rejection notice", PLATFORM_SOON, || async {
        inbox(&d, "ann:dc:inbox")
            .await
            .into_iter()
            .find(|n| n.get("status").map(String::as_str) == Some("rejected"))
    })
    .await;
    assert_eq!(
        (rejected["request_id"].as_str(), rejected["reason"].as_str()),
        ("r2", "not now")
    );
    wait_until("the third rejected", PLATFORM_SOON, || async {
        inbox(&d, "ann:dc:inbox")
            .await
            .into_iter()
            .find(|n| n.get("request_id").map(String::as_str) == Some("r3"))
            .filter(|n| n["status"] == "rejected")
    })
    .await;
    wait_until("the stranger's reaction removed", PLATFORM_SOON, || async {
        fake.with(|r| {
            r.removed
                .iter()
                .any(|(m, e, u)| *m == first.id && e == "✅" && *u == STRANGER)
                .then_some(())
        })
    })
    .await;
    assert_eq!(fake.with(|r| contents(r, TALK)), ["one"]);
    no_records_left(&store).await;
}

/// Messages written in a listened channel while the ingest was down reach
/// the inbox when it comes back, in order and once each, from where it left
/// off; the bot's own are not carried, and live ones go on as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_written_while_the_ingest_was_away_are_carried_once() {
    let fake = FakeDiscord::start(&[TALK, OPS]).await;
    let d = deployment(&fake, "", "");
    let ingest = d.process("cowboy-discord-ingest", "dc");
    connected(&fake).await;
    fake.user_message(TALK, APPROVER, "boss", "before", None);
    wait_until("the first message carried", PLATFORM_SOON, || async {
        (inbox(&d, "dc:inbox").await.len() == 1).then_some(())
    })
    .await;
    assert_eq!(ingest.stop(), Some(0));
    fake.user_message(TALK, APPROVER, "boss", "while away 1", None);
    fake.user_message(OPS, APPROVER, "boss", "while away 2", None);
    fake.user_message(TALK, STRANGER, "eve", "while away 3", None);
    let _ingest = d.process("cowboy-discord-ingest", "dc");
    wait_until("the missed messages carried", PLATFORM_SOON, || async {
        (inbox(&d, "dc:inbox").await.len() >= 4).then_some(())
    })
    .await;
    fake.user_message(TALK, APPROVER, "boss", "live again", None);
    let entries = wait_until("the live message carried", PLATFORM_SOON, || async {
        let e = inbox(&d, "dc:inbox").await;
        (e.len() >= 5).then_some(e)
    })
    .await;
    let texts: Vec<&str> = entries.iter().map(|e| e["content"].as_str()).collect();
    // Each channel in its order (OPS had carried nothing yet: its position
    // was taken when the first session connected).
    let at = |t: &str| texts.iter().position(|x| *x == t).unwrap();
    assert_eq!(texts.len(), 5, "each once: {texts:?}");
    assert!(at("before") < at("while away 1") && at("while away 1") < at("while away 3"));
    assert_eq!(texts[4], "live again", "{texts:?}");
    assert!(texts.contains(&"while away 2"), "{texts:?}");
}

/// The notify side deletes a settled record once the card shows its outcome.
async fn no_records_left(store: &TestStore) {
    wait_until("every approval record deleted", PLATFORM_SOON, || {
        let mut store = store.clone();
        async move {
            approval::list_ids(&mut store)
                .await
                .unwrap()
                .is_empty()
                .then_some(())
        }
    })
    .await;
}

/// ❌, or a reply `reject too early`, gives the agent a notice with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejection_by_reaction_or_reply() {
    let fake = FakeDiscord::start(&[TALK, OPS]).await;
    let d = deployment(&fake, GATED, "");
    let _outbox = d.process("cowboy-discord-outbox", "dc");
    let _ingest = d.process("cowboy-discord-ingest", "dc");
    connected(&fake).await;
    let mut store = d.store().await;
    store
        .xadd(
            "ann:dc:outbox",
            &[
                ("channel_id", TALK.to_string().as_bytes()),
                ("content", b"one"),
                ("request_id", b"r1"),
            ],
        )
        .await
        .unwrap();
    let first = card(&fake, 0).await;
    fake.user_reaction(OPS, first.id, APPROVER, "❌");
    let n1 = wait_until("the first notice", PLATFORM_SOON, || async {
        inbox(&d, "ann:dc:inbox").await.into_iter().next()
    })
    .await;
    assert_eq!(
        (n1["status"].as_str(), n1["request_id"].as_str()),
        ("rejected", "r1")
    );
    store
        .xadd(
            "ann:dc:outbox",
            &[
                ("channel_id", TALK.to_string().as_bytes()),
                ("content", b"two"),
            ],
        )
        .await
        .unwrap();
    let second = card(&fake, 1).await;
    fake.user_message(OPS, APPROVER, "boss", "reject too early", Some(second.id));
    let n2 = wait_until("the second notice", PLATFORM_SOON, || async {
        inbox(&d, "ann:dc:inbox").await.into_iter().nth(1)
    })
    .await;
    assert_eq!(
        (n2["status"].as_str(), n2["reason"].as_str()),
        ("rejected", "too early")
    );
    assert_eq!(n2["approver"], format!("discord:{APPROVER}"));
    let edited = closed(&fake, second.id).await;
    assert!(
        edited.contains("Rejected") && edited.contains("too early"),
        "{edited}"
    );
    assert!(fake.with(|r| contents(r, TALK)).is_empty(), "nothing sent");
    assert!(
        inbox(&d, "dc:inbox").await.is_empty(),
        "the reply to the card is not agent mail"
    );
}

/// Expiry closes the card, and a late ✅ is ignored. (A 3 s timeout leaves the
/// card time to be posted on a loaded machine; a notification for an approval
/// that already expired is refused, by design.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_closes_the_card_and_late_answers_are_ignored() {
    let fake = FakeDiscord::start(&[TALK, OPS]).await;
    let d = deployment(&fake, &GATED.replace("timeout = 0", "timeout = 3"), "");
    let _outbox = d.process("cowboy-discord-outbox", "dc");
    let _ingest = d.process("cowboy-discord-ingest", "dc");
    connected(&fake).await;
    let mut store = d.store().await;
    store
        .xadd(
            "ann:dc:outbox",
            &[
                ("channel_id", TALK.to_string().as_bytes()),
                ("content", b"slow"),
            ],
        )
        .await
        .unwrap();
    let card = card(&fake, 0).await;
    let notice = wait_until("the expiry notice", PLATFORM_SOON, || async {
        inbox(&d, "ann:dc:inbox").await.into_iter().next()
    })
    .await;
    assert_eq!(notice["status"], "expired");
    let edited = closed(&fake, card.id).await;
    assert!(edited.contains("Expired"), "{edited}");
    fake.user_reaction(OPS, card.id, APPROVER, "✅");
    // A later inbound message is handled after the reaction event.
    fake.user_message(TALK, APPROVER, "boss", "marker", None);
    wait_until("the marker", PLATFORM_SOON, || async {
        (!inbox(&d, "dc:inbox").await.is_empty()).then_some(())
    })
    .await;
    assert!(
        fake.with(|r| contents(r, TALK)).is_empty(),
        "a late answer sends nothing"
    );
}

/// Inbound messages in listened channels become inbox entries (the bot's own
/// and other channels' do not), the ping command runs, and the ingest resumes
/// after the gateway connection drops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbound_messages_ping_and_resume() {
    let fake = FakeDiscord::start(&[TALK, OPS]).await;
    let d = deployment(&fake, "", "");
    let _outbox = d.process("cowboy-discord-outbox", "dc");
    let _ingest = d.process("cowboy-discord-ingest", "dc");
    let _ping = d.process("cowboy-discord-ping", "dc");
    connected(&fake).await;
    let mut store = d.store().await;
    // The bot's own message (the fake reports it on the gateway).
    store
        .xadd(
            "dc:outbox",
            &[
                ("channel_id", TALK.to_string().as_bytes()),
                ("content", b"from the bot"),
            ],
        )
        .await
        .unwrap();
    wait_until("the bot's post", PLATFORM_SOON, || async {
        fake.with(|r| r.posted.first().cloned())
    })
    .await;
    fake.user_message(999, APPROVER, "boss", "elsewhere", None);
    let mid = fake.user_message(TALK, APPROVER, "boss", "hello bot", Some(123));
    let entry = wait_until("an inbox entry", PLATFORM_SOON, || async {
        inbox(&d, "dc:inbox").await.into_iter().next()
    })
    .await;
    assert_eq!(entry["content"], "hello bot");
    assert_eq!(entry["channel_id"], TALK.to_string());
    assert_eq!(entry["message_id"], mid.to_string());
    assert_eq!(entry["author_id"], APPROVER.to_string());
    assert_eq!(entry["author"], "boss");
    assert_eq!(entry["reply_to"], "123");
    assert!(!entry["timestamp"].is_empty());
    wait_until("the ping command ran", PLATFORM_SOON, || async {
        std::fs::read_to_string(d.path("pinged"))
            .ok()
            .filter(|s| s.contains("hello bot"))
    })
    .await;
    fake.drop_gateway();
    wait_until("a resume or a new session", PLATFORM_SOON, || async {
        fake.with(|r| (r.resumes + r.identifies >= 2).then_some(()))
    })
    .await;
    fake.user_message(TALK, APPROVER, "boss", "after the drop", None);
    let entries = wait_until("the message after the drop", PLATFORM_SOON, || async {
        let e = inbox(&d, "dc:inbox").await;
        (e.len() >= 2).then_some(e)
    })
    .await;
    let texts: Vec<&str> = entries.iter().map(|e| e["content"].as_str()).collect();
    assert_eq!(
        texts,
        ["hello bot", "after the drop"],
        "not the bot's own, not other channels'"
    );
    let beat = wait_until("users/@me in the heartbeat", PLATFORM_SOON, || {
        let mut store = store.clone();
        async move {
            let b = harness::hash(&mut store, &keys::heartbeat("dc")).await;
            (b.get("platform").map(String::as_str) == Some("ok")).then_some(b)
        }
    })
    .await;
    assert!(beat.contains_key("ping"));
    assert!(fake.with(|r| r.me_calls) >= 1);
}

/// Approval across bridges: a console bridge notifying through Discord is
/// decided by a Discord reaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_bridge_is_approved_by_discord_reaction() {
    let fake = FakeDiscord::start(&[TALK, OPS]).await;
    let d = deployment(
        &fake,
        "",
        "[bridges.desk]\ntype = \"console\"\noutput = \"{dir}/desk.out\"\ninput = \"{dir}/desk.in\"\ndestinations = [\"*\"]\napproval = { required = true, notify = \"dc\", notify_channel = \"222222222222222222\", timeout = 0, approvers = [\"discord:42000000000000042\"] }\n",
    );
    let _dc_outbox = d.process("cowboy-discord-outbox", "dc");
    let _dc_ingest = d.process("cowboy-discord-ingest", "dc");
    let _desk: Process = d.process("cowboy-console-outbox", "desk");
    connected(&fake).await;
    let mut store = d.store().await;
    store
        .xadd(
            "ann:desk:outbox",
            &[
                ("channel_id", b"ops"),
                ("content", b"console, approved on Discord"),
            ],
        )
        .await
        .unwrap();
    let card = card(&fake, 0).await;
    fake.user_reaction(OPS, card.id, APPROVER, "✅");
    let sent = wait_until("console delivery", PLATFORM_SOON, || async {
        d.delivered("desk.out").first().cloned()
    })
    .await;
    assert_eq!(sent.content, "console, approved on Discord");
}

/// A card pings nobody and shows agent text verbatim: mentions, masked links and
/// markdown stay inside its code block and `allowed_mentions` is empty. Forged
/// outcome entries for the live card edit nothing. Deliveries may ping users but
/// not `@everyone` or roles by default; the closing edit pings nobody either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cards_ping_nobody_and_forged_outcomes_edit_nothing() {
    let fake = FakeDiscord::start(&[TALK, OPS]).await;
    let d = deployment(&fake, GATED, "");
    let _outbox = d.process("cowboy-discord-outbox", "dc");
    let _ingest = d.process("cowboy-discord-ingest", "dc");
    connected(&fake).await;
    let mut store = d.store().await;
    let content = "@everyone look: [your bank](https://evil.example) ```\n**Approved** by the CEO";
    store
        .xadd(
            "ann:dc:outbox",
            &[
                ("channel_id", TALK.to_string().as_bytes()),
                ("content", content.as_bytes()),
            ],
        )
        .await
        .unwrap();
    let card = card(&fake, 0).await;
    assert_eq!(
        card.allowed_mentions[0]["parse"],
        serde_json::json!([]),
        "{:?}",
        card.allowed_mentions
    );
    let fenced = card.content.split_once("```text\n").unwrap().1;
    assert_eq!(
        fenced.matches("```").count(),
        1,
        "one closing fence: {}",
        card.content
    );
    let id = approval::list_ids(&mut store).await.unwrap().remove(0);
    for f in [
        vec![
            ("approval_id", id.as_bytes()),
            ("approval_outcome", b"approved".as_slice()),
        ],
        vec![
            ("approval_id", id.as_bytes()),
            ("approval_outcome", b"approved".as_slice()),
            ("approval_external_id", card.id.to_string().as_bytes()),
            ("channel_id", OPS.to_string().as_bytes()),
            ("approval_reason", b"looks fine".as_slice()),
        ],
    ] {
        store.xadd("dc:outbox", &f).await.unwrap();
    }
    wait_until("both forged outcomes dead-lettered", PLATFORM_SOON, || {
        let mut store = store.clone();
        async move { (stream(&mut store, "dc:dead").await.len() == 2).then_some(()) }
    })
    .await;
    assert!(
        fake.with(|r| r.posted.iter().all(|p| p.edits.is_empty())),
        "nothing was edited"
    );
    assert_eq!(
        harness::hash(&mut store, &keys::approval(&id)).await["status"],
        "pending"
    );
    fake.user_reaction(OPS, card.id, APPROVER, "✅");
    let sent = wait_until("delivery", PLATFORM_SOON, || async {
        fake.with(|r| r.posted.iter().find(|p| p.channel_id == TALK).cloned())
    })
    .await;
    assert_eq!(sent.content, content);
    assert_eq!(
        sent.allowed_mentions[0]["parse"],
        serde_json::json!(["users"])
    );
    closed(&fake, card.id).await;
    let edit = fake.with(|r| {
        r.posted
            .iter()
            .find(|p| p.id == card.id)
            .unwrap()
            .allowed_mentions
            .clone()
    });
    assert_eq!(edit.last().unwrap()["parse"], serde_json::json!([]));
    no_records_left(&store).await;
}

/// A destination answering 429 does not hold up the others: its delivery waits
/// for a retry while a later entry to another channel goes out at once; the
/// stalled destination's entries then arrive in their stream order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_destination_does_not_hold_up_the_others() {
    let fake = FakeDiscord::start(&[TALK, OPS]).await;
    let d = deployment(&fake, "", "");
    fake.rate_limit_channel(TALK, 4); // about 6 s of backoff
    let _outbox = d.process("cowboy-discord-outbox", "dc");
    let mut store = d.store().await;
    for (channel, content) in [(TALK, "talk 1"), (OPS, "ops"), (TALK, "talk 2")] {
        store
            .xadd(
                "ann:dc:outbox",
                &[
                    ("channel_id", channel.to_string().as_bytes()),
                    ("content", content.as_bytes()),
                ],
            )
            .await
            .unwrap();
    }
    let talk_then = wait_until(
        "the other destination's delivery",
        PLATFORM_SOON,
        || async { fake.with(|r| (!contents(r, OPS).is_empty()).then(|| contents(r, TALK).len())) },
    )
    .await;
    assert_eq!(
        talk_then, 0,
        "ops went out while talk was still rate limited"
    );
    let talk = wait_until(
        "the stalled destination's deliveries",
        PLATFORM_SOON,
        || async {
            fake.with(|r| {
                let t = contents(r, TALK);
                (t.len() == 2).then_some(t)
            })
        },
    )
    .await;
    assert_eq!(talk, ["talk 1", "talk 2"], "order kept per destination");
    assert!(stream(&mut store, "dc:dead").await.is_empty());
}

/// A delivery that keeps failing transiently (a poison entry) is dead-lettered
/// after `max_attempts`, with the last error and a notice; the bridge goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_that_never_stops_failing_is_dead_lettered() {
    let fake = FakeDiscord::start(&[TALK, OPS]).await;
    let d = deployment(&fake, "", "max_attempts = 3");
    fake.rate_limit_channel(TALK, usize::MAX);
    let _outbox = d.process("cowboy-discord-outbox", "dc");
    let mut store = d.store().await;
    for (channel, content) in [(TALK, "poison"), (OPS, "fine")] {
        store
            .xadd(
                "ann:dc:outbox",
                &[
                    ("channel_id", channel.to_string().as_bytes()),
                    ("content", content.as_bytes()),
                ],
            )
            .await
            .unwrap();
    }
    let notice = wait_until("the notice for the poison entry", PLATFORM_SOON, || async {
        inbox(&d, "ann:dc:inbox").await.into_iter().next()
    })
    .await;
    assert_eq!(notice["status"], "failed");
    assert!(
        notice["reason"].contains("gave up after 3 attempts"),
        "{notice:?}"
    );
    assert_eq!(stream(&mut store, "dc:dead").await.len(), 1);
    assert_eq!(fake.with(|r| contents(r, OPS)), ["fine"]);
    assert_eq!(fake.with(|r| r.rate_limited), 3);
}

/// Entries queued behind one channel go as runs, their gates passed
/// together: a 429 in the middle of a run stops it there, the refused send
/// waits for its retry with the rest of the run behind it, unattempted, and
/// every message reaches the channel once, in the stream's order. No mark
/// is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cut_by_a_429_keeps_order_and_sends_each_once() {
    let fake = FakeDiscord::start(&[TALK, OPS]).await;
    let d = deployment(&fake, "", "");
    let mut store = d.store().await;
    let want: Vec<String> = (0..12).map(|i| format!("run {i}")).collect();
    ann_posts(
        &mut store,
        &want.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .await;
    // The first goes alone, the rest queue behind it and go as a run, which
    // the fourth post cuts.
    fake.rate_limit_channel_after(TALK, 4, 1);
    let _outbox = d.process("cowboy-discord-outbox", "dc");
    delivered_once_in_order(&d, &fake, &want).await;
    assert_eq!(fake.with(|r| r.rate_limited), 1);
    let log = std::fs::read_to_string(d.path("cowboy-discord-outbox-dc.log")).unwrap();
    assert_eq!(log.matches("send failed; deferred").count(), 1, "{log}");
    assert!(stream(&mut store, "dc:dead").await.is_empty());
}

/// Waits until `want` reached TALK, then checks it came once each, in
/// order, and that no in-flight mark is left behind.
async fn delivered_once_in_order(d: &Deployment, fake: &FakeDiscord, want: &[String]) {
    let talk = wait_until("every message delivered", PLATFORM_SOON, || async {
        let t = fake.with(|r| contents(r, TALK));
        (t.len() >= want.len()).then_some(t)
    })
    .await;
    assert_eq!(talk, want, "each once, in order");
    wait_until("every mark cleared", PLATFORM_SOON, || async {
        let mut s = d.store().await;
        let marks = harness::hash(&mut s, &keys::in_flight_marks("ann:dc:outbox")).await;
        let runs = harness::hash(&mut s, &keys::in_flight_runs("ann:dc:outbox")).await;
        (marks.is_empty() && runs.is_empty()).then_some(())
    })
    .await;
}

/// A run whose gate is stale before its second send (a slow Redis or
/// platform) still delivers: its first send goes, the rest pass the gate
/// again, one run after another, each message once and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_whose_gate_is_always_stale_still_deliver_in_order() {
    let fake = FakeDiscord::start(&[TALK, OPS]).await;
    let d = deployment(&fake, "", "");
    let mut store = d.store().await;
    let want: Vec<String> = (0..8).map(|i| format!("stale {i}")).collect();
    ann_posts(
        &mut store,
        &want.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .await;
    let timing = broker::timing::Timing {
        run_fresh: Duration::ZERO,
        ..Default::default()
    };
    let _outbox = d.run_timed::<discord::Discord>(broker::config::Service::Outbox, "dc", timing);
    delivered_once_in_order(&d, &fake, &want).await;
}

/// A destination answering 429 for a whole minute holds up nothing else, on
/// paused time (the outbox runs in the test on tokio's clock, held still
/// between the test's steps). All the while, an approval on another
/// destination goes from the approver's reaction to its delivery with that
/// clock standing still: no timer of any length stands between them. The
/// stalled destination is tried again only on its growing backoff (a handful
/// of attempts in the minute, not one per round), the outbox keeps beating,
/// and the stalled entry, approved before the 429s began, is delivered once
/// they stop (the wait grows to the backoff's 30 s cap). The minute and a
/// half of the service's time take a few seconds of the test's.
#[tokio::test(start_paused = true)]
async fn a_destination_rate_limited_for_a_minute_delays_nothing_else() {
    const QUIET: u64 = 444_444_444_444_444_444;
    let time = harness::Frozen::hold();
    let fake = FakeDiscord::start(&[TALK, OPS, QUIET]).await;
    let d = deployment(&fake, GATED, "");
    let _outbox = d.run_paused::<discord::Discord>(
        broker::config::Service::Outbox,
        "dc",
        broker::timing::Timing::default(),
    );
    let _ingest = d.process("cowboy-discord-ingest", "dc");
    connected(&fake).await;
    let store = d.store().await;
    let send = |channel: u64, content: String| {
        let mut store = store.clone();
        async move {
            store
                .xadd(
                    "ann:dc:outbox",
                    &[
                        ("channel_id", channel.to_string().as_bytes()),
                        ("content", content.as_bytes()),
                    ],
                )
                .await
                .unwrap();
        }
    };
    let attempts = || fake.with(|r| r.rate_limited_on.get(&QUIET).copied().unwrap_or(0));
    send(QUIET, "stalled".into()).await;
    let first = card(&fake, 0).await;
    answerable(&d, first.id).await;
    fake.rate_limit_channel_for(QUIET, Duration::from_secs(60));
    let began = tokio::time::Instant::now();
    fake.user_reaction(OPS, first.id, APPROVER, "✅");
    wait_until(
        "the first attempt on the stalled destination",
        PLATFORM_SOON,
        || async { (attempts() > 0).then_some(()) },
    )
    .await;
    let beat = || {
        let mut store = store.clone();
        async move {
            harness::hash(&mut store, &keys::heartbeat("dc")).await["outbox"]
                .parse::<u64>()
                .unwrap()
        }
    };
    let first_beat = beat().await;
    let mut rounds = 0;
    while began.elapsed() < Duration::from_secs(58) {
        rounds += 1;
        let content = format!("round {rounds}");
        send(TALK, content.clone()).await;
        let card = card(&fake, rounds).await;
        answerable(&d, card.id).await;
        fake.user_reaction(OPS, card.id, APPROVER, "✅");
        // tokio's clock does not move here: were any wait needed on the way
        // (a backoff, a queue behind the stalled destination), this would
        // time out.
        wait_until("the approved delivery", PLATFORM_SOON, || async {
            fake.with(|r| contents(r, TALK).contains(&content).then_some(()))
        })
        .await;
        time.advance(Duration::from_secs(2)).await;
    }
    assert_eq!(rounds, 29, "a round every 2 s of the minute");
    assert!(contents_of(&fake, QUIET).is_empty(), "still rate limited");
    // From 200 ms doubling: attempts at about 0, 0.4, 1.2, 2.8, 6, 12.4,
    // 25.2 and 50.8 s. One attempt per round would be 29 or more.
    let in_the_minute = attempts();
    assert!(
        (6..=10).contains(&in_the_minute),
        "{in_the_minute} attempts on the stalled destination in the minute"
    );
    let later_beat = beat().await;
    assert!(
        later_beat >= first_beat + 40,
        "heartbeats went on: {first_beat} then {later_beat}"
    );
    time.advance_until(
        "the stalled delivery after the 429s",
        Duration::from_secs(45),
        || async { (contents_of(&fake, QUIET) == ["stalled"]).then_some(()) },
    )
    .await;
    assert_eq!(
        attempts(),
        in_the_minute,
        "no attempt after the minute failed"
    );
    assert!(stream(&mut store.clone(), "dc:dead").await.is_empty());
}

fn contents_of(fake: &FakeDiscord, channel: u64) -> Vec<String> {
    fake.with(|r| contents(r, channel))
}

/// Long messages go out as several Discord messages. Two cards for one approval
/// channel, and two approved long messages for one destination, never overlap:
/// each one's messages are consecutive, so no card shows another's text under
/// its head, even though sends run side by side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_messages_to_one_channel_never_interleave() {
    let fake = FakeDiscord::start(&[TALK, OPS]).await;
    fake.with(|r| r.post_delay = Duration::from_millis(50));
    let d = deployment(&fake, GATED, "");
    let _outbox = d.process("cowboy-discord-outbox", "dc");
    let _ingest = d.process("cowboy-discord-ingest", "dc");
    connected(&fake).await;
    let mut store = d.store().await;
    for letter in ["a", "b"] {
        store
            .xadd(
                "ann:dc:outbox",
                &[
                    ("channel_id", TALK.to_string().as_bytes()),
                    ("content", format!("{letter} ").repeat(2_500).as_bytes()),
                ],
            )
            .await
            .unwrap();
    }
    let cards = [card(&fake, 0).await, card(&fake, 1).await];
    // Every message of a card is posted before the next card begins.
    let shape = |channel: u64| {
        fake.with(|r| {
            contents(r, channel)
                .iter()
                .map(|c| match c {
                    c if c.contains("Approval requested") => 'H',
                    c if c.contains("a a a") => 'a',
                    c if c.contains("b b b") => 'b',
                    _ => '?',
                })
                .collect::<String>()
        })
    };
    let ops = shape(OPS);
    assert!(
        ops == format!("H{}H{}", "a".repeat(3), "b".repeat(3))
            || ops == format!("H{}H{}", "b".repeat(3), "a".repeat(3)),
        "cards interleaved: {ops}"
    );
    for c in &cards {
        fake.user_reaction(OPS, c.id, APPROVER, "✅");
    }
    wait_until(
        "both approved messages delivered",
        PLATFORM_SOON,
        || async { (shape(TALK).len() == 6).then_some(()) },
    )
    .await;
    let talk = shape(TALK);
    assert!(
        talk == "aaabbb" || talk == "bbbaaa",
        "deliveries interleaved: {talk}"
    );
}

/// An approval decided while its card is still being posted: the outcome waits
/// for the card and then closes it, so no card is left asking for an answer
/// that can no longer count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_while_the_card_is_posted_still_closes_it() {
    let fake = FakeDiscord::start(&[TALK, OPS]).await;
    fake.with(|r| r.post_delay = Duration::from_millis(1500));
    let gated = GATED.replace(
        "approvers = [\"discord:42000000000000042\"]",
        "approvers = [\"discord:42000000000000042\", \"cli:op\"]",
    );
    let d = deployment(&fake, &gated, "");
    let _outbox = d.process("cowboy-discord-outbox", "dc");
    let mut store = d.store().await;
    store
        .xadd(
            "ann:dc:outbox",
            &[
                ("channel_id", TALK.to_string().as_bytes()),
                ("content", b"too late to ask"),
            ],
        )
        .await
        .unwrap();
    let id = wait_until(
        "the card claimed and being posted",
        PLATFORM_SOON,
        || async {
            let ids = approval::list_ids(&mut store.clone()).await.unwrap();
            let id = ids.first()?.clone();
            harness::hash(&mut store.clone(), &keys::approval(&id))
                .await
                .contains_key("notify_entry")
                .then_some(id)
        },
    )
    .await;
    let out = d.cowboy(&["approvals", "reject", &id, "--as", "op", "--reason", "no"]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        fake.with(|r| contents(r, OPS)).is_empty(),
        "decided before the card was posted"
    );
    let card = card(&fake, 0).await;
    let edited = closed(&fake, card.id).await;
    assert!(edited.contains("Rejected"), "{edited}");
    no_records_left(&store).await;
}

/// A global 429 (`X-RateLimit-Global`, all routes) holds every channel, not
/// only the one that drew it: after it, nothing reaches Discord until its
/// `retry_after` has passed, then everything is delivered, with no second 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_rate_limit_holds_every_channel() {
    let fake = FakeDiscord::start(&[TALK, OPS]).await;
    let d = deployment(&fake, "", "");
    let hold = Duration::from_secs(1);
    fake.rate_limit_globally(hold);
    let _outbox = d.process("cowboy-discord-outbox", "dc");
    let mut store = d.store().await;
    for (i, channel) in [TALK, OPS, TALK, OPS, TALK, OPS].iter().enumerate() {
        store
            .xadd(
                "dc:outbox",
                &[
                    ("channel_id", channel.to_string().as_bytes()),
                    ("content", format!("m{i}").as_bytes()),
                ],
            )
            .await
            .unwrap();
    }
    wait_until("all six delivered", PLATFORM_SOON, || async {
        fake.with(|r| (r.posted.len() == 6).then_some(()))
    })
    .await;
    let (global, times, limited) =
        fake.with(|r| (r.global_429s.clone(), r.post_times.clone(), r.rate_limited));
    assert_eq!(global.len(), 1);
    assert_eq!(limited, 1, "no 429 after the global one");
    let (at, _) = global[0];
    // Sends already on their way when it was answered may arrive just after.
    let during = times
        .iter()
        .filter(|t| **t > at + Duration::from_millis(100) && **t < at + hold)
        .count();
    assert_eq!(during, 0, "nothing was asked while the global limit held");
}

/// A super (burst) reaction counts as an answer, live and when caught up:
/// Discord lists the two kinds apart (`type=1`), so the catch-up asks for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn super_reactions_approve_live_and_when_caught_up() {
    let fake = FakeDiscord::start(&[TALK, OPS]).await;
    let d = deployment(&fake, GATED, "");
    let _outbox = d.process("cowboy-discord-outbox", "dc");
    let ingest = d.process("cowboy-discord-ingest", "dc");
    connected(&fake).await;
    let mut store = d.store().await;
    ann_posts(&mut store, &["live", "away"]).await;
    let (first, second) = (card(&fake, 0).await, card(&fake, 1).await);
    answerable(&d, first.id).await;
    answerable(&d, second.id).await;
    fake.user_burst_reaction(OPS, first.id, APPROVER, "✅");
    wait_until(
        "the live super reaction delivered",
        PLATFORM_SOON,
        || async { fake.with(|r| (contents(r, TALK) == ["live"]).then_some(())) },
    )
    .await;
    assert_eq!(ingest.stop(), Some(0));
    fake.user_burst_reaction(OPS, second.id, APPROVER, "✅");
    let _ingest = d.process("cowboy-discord-ingest", "dc");
    wait_until(
        "the caught-up super reaction delivered",
        PLATFORM_SOON,
        || async { fake.with(|r| (contents(r, TALK) == ["live", "away"]).then_some(())) },
    )
    .await;
    no_records_left(&store).await;
}
