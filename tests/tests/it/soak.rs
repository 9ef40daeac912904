//! A chaos soak on both platforms: an agent writes to a Discord bridge and an
//! email bridge, every entry waits for a human, who answers by reaction or
//! reply on Discord and by email reply, while people also write to the bridges;
//! meanwhile the four services are killed with SIGKILL and started again, the
//! local Discord has outages and Postfix and Dovecot restart. Then it counts.
//!
//! Short in CI (`COWBOY_SOAK_SECONDS`, default 20, sets the chaos window;
//! `COWBOY_SOAK_SEED` replays a run). After the chaos, Postfix's queue is
//! flushed every 2 s, as an administrator would after an outage: Postfix
//! itself can set a mail aside for minutes ([`MailStack::flush_queue`]). It prints one line,
//! `lost=… duplicate_notifications=… duplicate_deliveries=… unconfirmed=…`
//! (and the rest of the tally), and fails unless nothing is lost, no approval is
//! asked twice, nothing failed, and every delivery made twice was reported
//! `uncertain` to the agent.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use broker::keys;
use harness::discord::{FakeDiscord, TOKEN};
use harness::mail::MailStack;
use harness::{inbox, real_sleep, Deployment, Process};

const TALK: u64 = 111_111_111_111_111_111;
const OPS: u64 = 222_222_222_222_222_222;
const APPROVER: u64 = 42_000_000_000_000_042;
const PERSON: u64 = 44_000_000_000_000_044;

/// The services under chaos: (binary, bridge).
const SERVICES: [(&str, &str); 4] = [
    ("cowboy-discord-outbox", "dc"),
    ("cowboy-discord-ingest", "dc"),
    ("cowboy-email-outbox", "mail"),
    ("cowboy-email-ingest", "mail"),
];

/// After the chaos window: how long everything may take to settle.
const DRAIN: Duration = Duration::from_secs(150);

fn config(fake: &FakeDiscord, stack: &MailStack) -> String {
    format!(
        r#"
[agents.ann]

[bridges.dc]
type = "discord"
token_file = "{{dir}}/token"
api_base = "{api}"
gateway_url = "{gw}"
channels = ["{TALK}", "{OPS}"]
destinations = ["{TALK}", "{OPS}"]
approval = {{ required = true, notify = "dc", notify_channel = "{OPS}", timeout = 0, approvers = ["discord:{APPROVER}"] }}

[bridges.mail]
type = "email"
destinations = ["*@bridge.test"]
{mail}approval = {{ required = true, notify = "mail", notify_channel = "approver@bridge.test", timeout = 0, approvers = ["email:approver@bridge.test"] }}
require_authentication = true
authserv_id = "mx.bridge.test"
"#,
        api = fake.api_base(),
        gw = fake.gateway_url(),
        mail = stack.bridge_settings(),
    )
}

/// A small deterministic generator (xorshift), so a seed replays a run.
struct Dice(u64);

impl Dice {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The marker an entry's text carries: delimited, so `#1#` is not in `#10#`.
fn marker(kind: &str, n: usize) -> String {
    format!("soak {kind} #{n}#")
}

/// Which entries the approvers reject (the rest they approve).
fn rejected(n: usize) -> bool {
    n % 3 == 2
}

/// The number in a text's marker of `kind`, if it carries one.
fn marked(kind: &str, text: &str) -> Option<usize> {
    let rest = &text[text.find(&format!("soak {kind} #"))? + kind.len() + 7..];
    rest[..rest.find('#')?].parse().ok()
}

struct Soak {
    fake: FakeDiscord,
    stack: MailStack,
    d: Deployment,
    running: Vec<Option<Process>>,
    dice: Dice,
    /// Entries the agent wrote, per bridge.
    written: usize,
    /// Inbound messages people wrote, per platform.
    said: usize,
    /// Inbound mails Postfix took (a refused one is tried again next turn).
    mailed: usize,
    answered_cards: HashSet<usize>,
    answered_mails: HashSet<usize>,
    /// The end of the local Discord's current outage.
    discord_back_at: Option<Instant>,
    chaos: Vec<String>,
}

impl Soak {
    fn start_service(&mut self, i: usize) {
        let (bin, bridge) = SERVICES[i];
        self.running[i] = Some(self.d.process(bin, bridge));
    }

    /// The agent writes one entry to each bridge.
    async fn agent_writes(&mut self) {
        let n = self.written;
        let mut store = self.d.store().await;
        let dc = marker("dc", n);
        store
            .xadd(
                "ann:dc:outbox",
                &[
                    ("channel_id", TALK.to_string().as_bytes()),
                    ("content", dc.as_bytes()),
                    ("request_id", format!("dc-{n}").as_bytes()),
                ],
            )
            .await
            .unwrap();
        let mail = marker("mail", n);
        store
            .xadd(
                "ann:mail:outbox",
                &[
                    ("channel_id", b"bob@bridge.test".as_slice()),
                    ("subject", mail.as_bytes()),
                    ("content", mail.as_bytes()),
                    ("request_id", format!("mail-{n}").as_bytes()),
                ],
            )
            .await
            .unwrap();
        self.written += 1;
    }

    /// People write to the bridges: a message in a listened channel (kept by
    /// the local Discord even when no session hears it) and a mail.
    fn people_write(&mut self) {
        if self.said <= self.mailed {
            let text = marker("said", self.said);
            self.fake.user_message(TALK, PERSON, "pat", &text, None);
            self.said += 1;
        }
        let subject = marker("in", self.mailed);
        let raw = format!(
            "From: pat@bridge.test\r\nTo: bridge@bridge.test\r\nSubject: {subject}\r\nMessage-ID: <in.{}@bridge.test>\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nhello\r\n",
            self.mailed
        );
        if self
            .stack
            .try_send_raw("pat@bridge.test", "bridge@bridge.test", &raw, None)
            .is_ok()
        {
            self.mailed += 1;
        }
    }

    /// The approvers answer what they were shown, once each: on Discord by ✅
    /// or a `reject` reply (once the card is recorded as shown, as a human
    /// never answers within its first milliseconds), by mail with APPROVE or
    /// REJECT (tried again next turn while Postfix is away).
    async fn approvers_answer(&mut self) {
        let mut store = self.d.store().await;
        let shown = harness::hash(&mut store, &keys::approval_map("dc")).await;
        let cards: Vec<(u64, usize)> = self.fake.with(|r| {
            r.posted
                .iter()
                .filter(|p| p.channel_id == OPS && p.content.contains("Approval requested"))
                .filter_map(|p| Some((p.id, marked("dc", &p.content)?)))
                .collect()
        });
        for (card, n) in cards {
            if self.answered_cards.contains(&n) || !shown.contains_key(&card.to_string()) {
                continue;
            }
            if rejected(n) {
                let reason = format!("reject not this one {}", marker("why", n));
                self.fake
                    .user_message(OPS, APPROVER, "boss", &reason, Some(card));
            } else {
                self.fake.user_reaction(OPS, card, APPROVER, "✅");
            }
            self.answered_cards.insert(n);
        }
        for raw in self.stack.mails("approver") {
            let mail = super::email::parse(&raw);
            if !mail.subject.starts_with("Approval needed") {
                continue;
            }
            let Some(n) = marked("mail", &mail.body) else {
                continue;
            };
            if self.answered_mails.contains(&n) {
                continue;
            }
            let body = match rejected(n) {
                true => format!("REJECT not this one {}", marker("why", n)),
                false => "APPROVE".to_string(),
            };
            let reply = super::email::reply_in_thread(&mail, &body);
            if self
                .stack
                .try_send_raw(
                    "approver@bridge.test",
                    "bridge@bridge.test",
                    &reply,
                    Some("approver"),
                )
                .is_ok()
            {
                self.answered_mails.insert(n);
            }
        }
    }

    /// One blow: a service killed and started again, an outage of the local
    /// Discord, or a restart of Postfix or Dovecot.
    async fn strike(&mut self) {
        let blow = self.dice.below(8);
        match blow {
            0..=3 => {
                let i = blow as usize;
                if let Some(p) = self.running[i].take() {
                    p.kill();
                }
                self.chaos.push(format!("kill -9 {}", SERVICES[i].0));
                self.start_service(i);
            }
            4 | 5 if self.discord_back_at.is_none() => {
                self.fake.go_down().await;
                let for_ms = 500 + self.dice.below(2500);
                self.discord_back_at = Some(Instant::now() + Duration::from_millis(for_ms));
                self.chaos.push(format!("discord down {for_ms} ms"));
            }
            4..=6 => {
                self.stack.restart_postfix();
                self.chaos.push("postfix restart".into());
            }
            _ => {
                self.stack.restart_dovecot();
                self.chaos.push("dovecot restart".into());
            }
        }
    }

    async fn discord_back_if_due(&mut self, now: Instant) {
        if self.discord_back_at.is_some_and(|t| now >= t) {
            self.fake.come_up().await;
            self.discord_back_at = None;
        }
    }
}

/// What the platforms and the agent's inboxes show, counted.
#[derive(Debug, Default)]
struct Tally {
    lost: Vec<String>,
    duplicate_notifications: Vec<String>,
    duplicate_deliveries: usize,
    unconfirmed: Vec<String>,
    uncertain: usize,
    failed: Vec<String>,
    inbound_lost: usize,
    inbound_duplicates: Vec<String>,
    /// Copies of one mail: Postfix delivering one submission again around a
    /// restart, or an approval email sent again after its connection was
    /// lost in the server's hands (same Message-ID). Shown, not failed on.
    repeated_mails: usize,
}

impl Tally {
    fn settled(&self) -> bool {
        self.lost.is_empty() && self.inbound_lost == 0
    }

    fn line(&self) -> String {
        format!(
            "lost={} duplicate_notifications={} duplicate_deliveries={} unconfirmed={} uncertain={} failed={} inbound_lost={} inbound_duplicates={} repeated_mails={}",
            self.lost.len(),
            self.duplicate_notifications.len(),
            self.duplicate_deliveries,
            self.unconfirmed.len(),
            self.uncertain,
            self.failed.len(),
            self.inbound_lost,
            self.inbound_duplicates.len(),
            self.repeated_mails
        )
    }
}

/// Per marker number (as `number` reads it off a mail): how many separate
/// submissions reached the mailbox; and how many copies repeated a submission.
fn submissions(
    raw: &[Vec<u8>],
    number: impl Fn(&super::email::Mail) -> Option<usize>,
) -> (HashMap<usize, usize>, usize) {
    let mut seen: HashMap<usize, HashSet<String>> = HashMap::new();
    let mut repeated = 0;
    for m in raw {
        let Some(n) = number(&super::email::parse(m)) else {
            continue;
        };
        if !seen.entry(n).or_default().insert(queue_id(m)) {
            repeated += 1;
        }
    }
    let counts = seen.into_iter().map(|(n, ids)| (n, ids.len())).collect();
    (counts, repeated)
}

/// The Postfix queue id a mail was delivered under (its topmost
/// `Received: … (Postfix) with … id QUEUEID`): one per submission.
fn queue_id(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    text.find("(Postfix) with ")
        .and_then(|at| {
            let rest = &text[at..];
            let id = &rest[rest.find(" id ")? + 4..];
            Some(id[..id.find(|c: char| c.is_whitespace() || c == ';')?].to_string())
        })
        .unwrap_or_default()
}

/// How many times each marker number of `kind` occurs in `texts`.
fn counts<'a>(kind: &str, texts: impl Iterator<Item = &'a str>) -> HashMap<usize, usize> {
    let mut out = HashMap::new();
    for t in texts {
        if let Some(n) = marked(kind, t) {
            *out.entry(n).or_default() += 1;
        }
    }
    out
}

async fn tally(s: &Soak) -> Tally {
    let mut t = Tally::default();
    let (cards, delivered) = s.fake.with(|r| {
        let cards = counts(
            "dc",
            r.posted
                .iter()
                .filter(|p| p.channel_id == OPS && p.content.contains("Approval requested"))
                .map(|p| p.content.as_str()),
        );
        let delivered = counts(
            "dc",
            r.posted
                .iter()
                .filter(|p| p.channel_id == TALK)
                .map(|p| p.content.as_str()),
        );
        (cards, delivered)
    });
    // Mail is counted by submission: copies Postfix delivered twice of one
    // submission (its queue id) are the mail system's doing, not the bridge's.
    // Approval emails by Message-ID: one sent again after a connection lost
    // in the server's hands (by design, see `email::send`) is the same mail.
    let mut asked_by_mail: HashMap<usize, HashSet<String>> = HashMap::new();
    for raw in s.stack.mails("approver") {
        let m = super::email::parse(&raw);
        if let Some(n) = m
            .subject
            .starts_with("Approval needed")
            .then(|| marked("mail", &m.body))
            .flatten()
        {
            if !asked_by_mail.entry(n).or_default().insert(m.message_id) {
                t.repeated_mails += 1;
            }
        }
    }
    let asked_by_mail: HashMap<usize, usize> = asked_by_mail
        .into_iter()
        .map(|(n, ids)| (n, ids.len()))
        .collect();
    let (mailed, repeated) = submissions(&s.stack.mails("bob"), |m| marked("mail", &m.subject));
    t.repeated_mails += repeated;
    for (kind, asked, sent) in [
        ("dc", &cards, &delivered),
        ("mail", &asked_by_mail, &mailed),
    ] {
        let notices = inbox(&s.d, &format!("ann:{kind}:inbox")).await;
        let status_of = |n: usize| -> Vec<String> {
            let id = format!("{kind}-{n}");
            notices
                .iter()
                .filter(|e| e.get("request_id") == Some(&id))
                .map(|e| e["status"].clone())
                .collect()
        };
        for n in 0..s.written {
            let statuses = status_of(n);
            let times = sent.get(&n).copied().unwrap_or(0);
            let shown = asked.get(&n).copied().unwrap_or(0);
            if shown > 1 {
                t.duplicate_notifications
                    .push(format!("{kind}-{n} asked {shown} times"));
            }
            t.duplicate_deliveries += times.saturating_sub(1);
            let uncertain = statuses.iter().any(|s| s == "uncertain");
            t.uncertain += usize::from(uncertain);
            if let Some(bad) = statuses
                .iter()
                .find(|s| !["rejected", "uncertain"].contains(&s.as_str()))
            {
                t.failed.push(format!("{kind}-{n}: {bad}"));
            }
            if times > 1 && !uncertain {
                t.unconfirmed
                    .push(format!("{kind}-{n} delivered {times} times"));
            }
            let done = match rejected(n) {
                true => statuses.iter().any(|s| s == "rejected") && times == 0,
                false => times > 0 || uncertain,
            };
            if !done {
                t.lost.push(format!(
                    "{kind}-{n} (asked {}×, delivered {times}×, notices {statuses:?})",
                    asked.get(&n).copied().unwrap_or(0)
                ));
            }
        }
    }
    let dc_in = inbox(&s.d, "dc:inbox").await;
    let heard = counts(
        "said",
        dc_in
            .iter()
            .filter_map(|e| e.get("content"))
            .map(String::as_str),
    );
    let mail_in = inbox(&s.d, "mail:inbox").await;
    let read = counts(
        "in",
        mail_in
            .iter()
            .filter_map(|e| e.get("subject"))
            .map(String::as_str),
    );
    // A mail the test or Postfix delivered twice is two mails in the
    // mailbox, each to be carried once.
    let copies = counts(
        "in",
        s.stack
            .mails("bridge")
            .iter()
            .map(|m| super::email::parse(m).subject)
            .collect::<Vec<_>>()
            .iter()
            .map(String::as_str),
    );
    let once: HashMap<usize, usize> = (0..s.said).map(|n| (n, 1)).collect();
    for (kind, count, expected, of) in [
        ("discord", &heard, &once, s.said),
        ("mail", &read, &copies, s.mailed),
    ] {
        for n in 0..of {
            let want = expected.get(&n).copied().unwrap_or(1);
            match count.get(&n).copied().unwrap_or(0) {
                0 => t.inbound_lost += 1,
                k if k > want => t.inbound_duplicates.push(format!(
                    "{kind} #{n} carried {k} times ({want} in the mailbox)"
                )),
                _ => {}
            }
        }
    }
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_soak_on_discord_and_email() {
    let seconds: u64 = std::env::var("COWBOY_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let seed: u64 = std::env::var("COWBOY_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("soak: {seconds} s of chaos, COWBOY_SOAK_SEED={seed}");
    let fake = FakeDiscord::start(&[TALK, OPS]).await;
    let stack = MailStack::start();
    let d = Deployment::new(&config(&fake, &stack));
    std::fs::write(d.path("token"), format!("{TOKEN}\n")).unwrap();
    let mut s = Soak {
        fake,
        stack,
        d,
        running: (0..SERVICES.len()).map(|_| None).collect(),
        dice: Dice(seed),
        written: 0,
        said: 0,
        mailed: 0,
        answered_cards: HashSet::new(),
        answered_mails: HashSet::new(),
        discord_back_at: None,
        chaos: Vec::new(),
    };
    for i in 0..SERVICES.len() {
        s.start_service(i);
    }
    harness::wait_until(
        "the Discord ingest identified on the gateway",
        Duration::from_secs(30),
        || async { s.fake.identified().then_some(()) },
    )
    .await;

    let start = Instant::now();
    let chaos_ends = start + Duration::from_secs(seconds);
    let mut next_write = start;
    let mut next_blow = start + Duration::from_secs(1);
    let mut next_flush = chaos_ends;
    let t = loop {
        let now = Instant::now();
        s.discord_back_if_due(now).await;
        if now < chaos_ends {
            if now >= next_write {
                s.agent_writes().await;
                s.people_write();
                next_write = now + Duration::from_millis(400);
            }
            if now >= next_blow {
                s.strike().await;
                next_blow = now + Duration::from_millis(800 + s.dice.below(1700));
            }
        } else {
            if let Some(back) = s.discord_back_at {
                real_sleep(back.saturating_duration_since(now)).await;
                s.discord_back_if_due(Instant::now()).await;
            }
            let t = tally(&s).await;
            if t.settled() || now > chaos_ends + DRAIN {
                break t;
            }
            // What Postfix deferred during the chaos is its own to retry,
            // on a schedule of minutes: tried now, as after an outage.
            if now >= next_flush {
                s.stack.flush_queue();
                next_flush = now + Duration::from_secs(2);
            }
        }
        s.approvers_answer().await;
        real_sleep(Duration::from_millis(100)).await;
    };
    let line = t.line();
    eprintln!(
        "soak: {} entries per bridge, {} inbound each; chaos: {}",
        s.written,
        s.said,
        s.chaos.join(", ")
    );
    println!("{line}");
    let clean = t.settled()
        && t.duplicate_notifications.is_empty()
        && t.failed.is_empty()
        && t.unconfirmed.is_empty()
        && t.inbound_duplicates.is_empty();
    if !clean {
        panic!(
            "{line}\nnot settled within {DRAIN:?} after the chaos: {:?}\nasked twice: {:?}\nfailed: {:?}\ndelivered twice unreported: {:?}\ninbound twice: {:?}\nthe services' logs are kept in {}",
            t.lost,
            t.duplicate_notifications,
            t.failed,
            t.unconfirmed,
            t.inbound_duplicates,
            keep_logs(&s, seed)
        );
    }
}

/// Copies the services' logs out of the deployment (which is removed when
/// the test ends) for a failed run; returns where.
fn keep_logs(s: &Soak, seed: u64) -> String {
    let to = std::env::temp_dir().join(format!("cowboy-soak-{seed}"));
    let _ = std::fs::create_dir_all(&to);
    let _ = std::fs::write(to.join("postfix.log"), s.stack.postfix_log());
    let _ = std::fs::write(to.join("postfix-queue.txt"), s.stack.queue_listing());
    if let Ok(dir) = std::fs::read_dir(s.d.path("")) {
        for e in dir.flatten() {
            if e.file_name().to_string_lossy().ends_with(".log") {
                let _ = std::fs::copy(e.path(), to.join(e.file_name()));
            }
        }
    }
    to.display().to_string()
}
