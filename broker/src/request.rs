//! Decision requests: how the surfaces whose Redis users hold no write rights
//! on approvals (an operator's CLI, the approval page, the ingest of a bridge
//! that shows cards) have a decision or an edit made for them by the
//! requesting bridge's outbox service.
//!
//! A Redis script runs with its caller's rights, so a user allowed to run the
//! DECIDE script on a record may as well `HSET` it. The only users with write
//! rights on records, `{bridge}:decisions` and the trails are therefore the
//! broker's services; an operator or the page writes a request to a stream of
//! its own and reads the answer from another:
//!
//! ```text
//! {bridge}:requests:cli:NAME   XADD by Redis user NAME only      -> read by the bridge's outbox
//! {bridge}:requests:web        XADD by the page's user only      -> read by the bridge's outbox
//! {bridge}:requests:surface:S  XADD by surface S's ingest only   -> read by the bridge's outbox
//! {bridge}:replies:cli:NAME    XADD by the outbox; NAME reads
//! {bridge}:replies:web         XADD by the outbox; the page reads
//! ```
//!
//! Invariants:
//! - The identity a request acts as is bound to the stream it was read from,
//!   never taken from its fields alone: a request on `requests:cli:NAME` acts as
//!   `cli:NAME` only (Redis proved who wrote it), one on `requests:web` only as
//!   a `web:` identity (the page authenticates its own users), one on
//!   `requests:surface:S` only as an identity of S's platform, answering one
//!   of S's cards. Anything else is refused and audited.
//! - A request is applied by one worker of the bridge (a consumer group), under
//!   the same rules as every surface ([`approval::decide`], [`edit::edit`]), at
//!   the time the outbox reads it: the writer cannot date its answer.
//! - A request older than [`LAPSE`] when read (by Redis's clock) is refused
//!   unapplied: a requester that stopped waiting ([`WAIT`]) never has its
//!   request applied behind its back. A surface's answers do not wait and
//!   do not lapse (a human reacted; the card they answered binds the version).
//! - Only requests for the bridge's own approvals are applied.
//! - Request and reply streams are capped ([`KEPT`]).

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::approval::edit::{self, Change, Edited};
use crate::approval::{self, Answer, Approvals, Outcome, Verdict};
use crate::audit;
use crate::clock::Clock;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::identity::Identity;
use crate::keys;
use crate::shutdown::Shutdown;
use crate::store::Store;

/// How long a requester waits for its reply.
pub const WAIT: Duration = Duration::from_secs(15);
/// A request read later than this after it was written is refused unapplied.
pub const LAPSE: Duration = Duration::from_secs(20);
/// About how many entries a request or reply stream keeps.
const KEPT: u64 = 1000;
/// How long one blocking read of the server waits before looking at shutdown.
const BLOCK_MS: u64 = 5000;

/// Who writes a request stream, and so whom its requests may act as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requester {
    /// An `[operators.NAME]` person, over Redis user NAME: acts as `cli:NAME`.
    Operator(String),
    /// The approval page: acts as its logged-in users, `web:USER`.
    Web,
    /// The ingest of bridge `name`, which shows the cards: acts as the people
    /// on its platform (`{kind}:ID`), answering its cards.
    Surface { name: String, kind: String },
}

impl Requester {
    /// The suffix of its request and reply streams.
    pub fn suffix(&self) -> String {
        match self {
            Requester::Operator(name) => Identity::cli(name).to_string(),
            Requester::Web => "web".to_string(),
            Requester::Surface { name, .. } => format!("surface:{name}"),
        }
    }

    /// Whether a request read from this requester's stream may act as `identity`.
    pub fn may_act_as(&self, identity: &str) -> bool {
        match self {
            Requester::Operator(name) => identity == Identity::cli(name).as_str(),
            Requester::Web => identity
                .strip_prefix("web:")
                .is_some_and(|user| !user.is_empty()),
            Requester::Surface { kind, .. } => identity
                .strip_prefix(kind.as_str())
                .and_then(|rest| rest.strip_prefix(':'))
                .is_some_and(|user| !user.is_empty()),
        }
    }

    /// Surface bridge `name` (one that shows cards), as a requester.
    pub fn surface(config: &Config, name: &str) -> Result<Requester> {
        Ok(Requester::Surface {
            name: name.to_string(),
            kind: config.bridge(name)?.kind.clone(),
        })
    }

    /// Every requester of `bridge`'s approvals: the operators, the page, and
    /// each surface that shows its cards.
    pub fn all(config: &Config, bridge: &str) -> Result<Vec<Requester>> {
        let mut all: Vec<Requester> = config
            .operators
            .keys()
            .map(|n| Requester::Operator(n.clone()))
            .collect();
        if config.web.is_some() {
            all.push(Requester::Web);
        }
        if config.bridge(bridge)?.approval.required {
            for (surface, _) in config.surfaces_of(bridge) {
                all.push(Requester::surface(config, surface)?);
            }
        }
        Ok(all)
    }
}

/// What a request asks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    Decide {
        approved: bool,
        reason: String,
        /// The digest the approver was shown.
        seen: Option<String>,
        /// The card answered (a surface's external id), when a surface asks.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        card: Option<String>,
    },
    Edit {
        content: Option<String>,
        subject: Option<String>,
        channel_id: Option<String>,
        seen: Option<String>,
    },
    /// Hand the requester's own answers to person `to` until `until` (unix
    /// seconds; 0 takes them back). No approval id.
    Delegate { to: String, until: u64 },
    /// Move the deadline later (never a decision): by `seconds`, or the
    /// bridge's `approval.snooze` when absent.
    Snooze {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seconds: Option<u64>,
        #[serde(default)]
        reason: String,
        /// The card answered, when a surface asks.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        card: Option<String>,
    },
}

/// One request, as written to the stream (one JSON field).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// Pairs the reply with the request.
    pub nonce: String,
    pub approval_id: String,
    /// Whom it acts as (checked against the stream it was read from).
    pub identity: String,
    #[serde(flatten)]
    pub action: Action,
}

/// The outbox's answer to a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    Decided,
    Counted {
        have: usize,
        need: usize,
        again: bool,
    },
    NotAllowed,
    EditorNotCounted,
    SharedProofCounted,
    Late {
        state: approval::Late,
    },
    Unknown,
    Edited {
        old_digest: String,
        new_digest: String,
        revision: u32,
    },
    /// A delegation recorded (`until = 0`: ended).
    Delegated {
        from: String,
        to: String,
        until: u64,
    },
    /// The deadline moved to `until`: snooze `count` of at most `max`.
    Snoozed {
        until: u64,
        count: u32,
        max: u32,
    },
    /// Not applied, and why (refused edits, lapsed requests, wrong streams).
    Refused {
        message: String,
    },
    /// Not applied because the outbox failed (its config, a broken
    /// invariant), not because of anything the operator asked.
    Failed {
        message: String,
    },
}

impl From<Outcome> for Reply {
    fn from(o: Outcome) -> Reply {
        match o {
            Outcome::Decided => Reply::Decided,
            Outcome::Counted { have, need, again } => Reply::Counted { have, need, again },
            Outcome::NotAllowed => Reply::NotAllowed,
            Outcome::EditorNotCounted => Reply::EditorNotCounted,
            Outcome::SharedProofCounted => Reply::SharedProofCounted,
            Outcome::Late(state) => Reply::Late { state },
            Outcome::Unknown | Outcome::Submitted => Reply::Unknown,
        }
    }
}

impl Reply {
    fn into_outcome(self) -> Result<Outcome> {
        match self {
            Reply::Decided => Ok(Outcome::Decided),
            Reply::Counted { have, need, again } => Ok(Outcome::Counted { have, need, again }),
            Reply::NotAllowed => Ok(Outcome::NotAllowed),
            Reply::EditorNotCounted => Ok(Outcome::EditorNotCounted),
            Reply::SharedProofCounted => Ok(Outcome::SharedProofCounted),
            Reply::Late { state } => Ok(Outcome::Late(state)),
            Reply::Unknown => Ok(Outcome::Unknown),
            Reply::Refused { message } => Err(Error::refused(message)),
            Reply::Failed { message } => Err(Error::internal(format!("the outbox: {message}"))),
            Reply::Edited { .. } | Reply::Delegated { .. } | Reply::Snoozed { .. } => {
                Err(Error::internal("another request's reply to a decision"))
            }
        }
    }

    fn into_edited(self) -> Result<Edited> {
        match self {
            Reply::Edited {
                old_digest,
                new_digest,
                revision,
            } => Ok(Edited {
                old_digest,
                new_digest,
                revision,
            }),
            Reply::Refused { message } => Err(Error::refused(message)),
            Reply::Failed { message } => Err(Error::internal(format!("the outbox: {message}"))),
            other => Err(Error::internal(format!(
                "unexpected reply to an edit: {other:?}"
            ))),
        }
    }
}

/// The bridge whose outbox applies requests for approval `id` (its requester).
async fn bridge_of(store: &mut Store, id: &str) -> Result<Option<String>> {
    Ok(Approvals::on(store)
        .load(id)
        .await?
        .map(|r| r.source().to_string()))
}

/// Decides approval `id` as `identity` through the requesting bridge's outbox.
pub async fn decide(
    store: &mut Store,
    requester: &Requester,
    id: &str,
    answer: Answer<'_>,
) -> Result<Outcome> {
    let Some(bridge) = bridge_of(store, id).await? else {
        return Ok(Outcome::Late(approval::Late::Missing));
    };
    let action = Action::Decide {
        approved: answer.verdict == Verdict::Approved,
        reason: answer.reason.to_string(),
        seen: answer.seen.map(str::to_string),
        card: None,
    };
    submit(store, requester, &bridge, id, answer.approver, action)
        .await?
        .into_outcome()
}

/// A surface's answer to card `card` of approval `id` of `bridge`, handed to
/// that bridge's outbox without waiting (see [`Requester::Surface`]).
pub async fn answer_card(
    store: &mut Store,
    requester: &Requester,
    bridge: &str,
    id: &str,
    card: &str,
    answer: &Answer<'_>,
) -> Result<()> {
    let action = Action::Decide {
        approved: answer.verdict == Verdict::Approved,
        reason: answer.reason.to_string(),
        seen: answer.seen.map(str::to_string),
        card: Some(card.to_string()),
    };
    hand_on(store, requester, bridge, id, answer.approver, action).await
}

/// Writes a surface's request without waiting for its reply (a human acted
/// on a card; nobody waits on the platform).
async fn hand_on(
    store: &mut Store,
    requester: &Requester,
    bridge: &str,
    id: &str,
    identity: &str,
    action: Action,
) -> Result<()> {
    let request = Request {
        nonce: uuid::Uuid::new_v4().simple().to_string(),
        approval_id: id.to_string(),
        identity: identity.to_string(),
        action,
    };
    let requests = keys::requests(bridge, &requester.suffix());
    write(store, &requests, &request).await?;
    Ok(())
}

/// Snoozes approval `id` as `identity` through the requesting bridge's
/// outbox: the deadline moves by `seconds` (the bridge's default when
/// `None`); nothing is decided.
pub async fn snooze(
    store: &mut Store,
    requester: &Requester,
    id: &str,
    identity: &str,
    seconds: Option<u64>,
    reason: &str,
) -> Result<approval::snooze::Snoozed> {
    let Some(bridge) = bridge_of(store, id).await? else {
        return Err(Error::refused(format!("no approval {id}")));
    };
    let action = Action::Snooze {
        seconds,
        reason: reason.to_string(),
        card: None,
    };
    match submit(store, requester, &bridge, id, identity, action).await? {
        Reply::Snoozed { until, count, max } => Ok(approval::snooze::Snoozed { until, count, max }),
        Reply::Late { state } => Err(Error::refused(format!(
            "approval {id} is {state}: nothing to snooze"
        ))),
        Reply::Refused { message } => Err(Error::refused(message)),
        Reply::Failed { message } => Err(Error::internal(format!("the outbox: {message}"))),
        other => Err(Error::internal(format!(
            "unexpected reply to a snooze: {other:?}"
        ))),
    }
}

/// A surface's "later" on card `card` of `record`'s approval, handed
/// to that bridge's outbox without waiting (see [`answer_card`]).
pub async fn snooze_card(
    store: &mut Store,
    requester: &Requester,
    record: &approval::Record,
    card: &str,
    identity: &str,
    seconds: Option<u64>,
    reason: &str,
) -> Result<()> {
    let action = Action::Snooze {
        seconds,
        reason: reason.to_string(),
        card: Some(card.to_string()),
    };
    let (bridge, id) = (record.source(), record.id.as_str());
    hand_on(store, requester, bridge, id, identity, action).await
}

/// Appends one request to its stream; returns the entry's id.
async fn write(store: &mut Store, requests: &str, request: &Request) -> Result<String> {
    let json = serde_json::to_string(request).map_err(|e| Error::internal(e.to_string()))?;
    redis::cmd("XADD")
        .arg(requests)
        .arg("MAXLEN")
        .arg("~")
        .arg(KEPT)
        .arg("*")
        .arg("request")
        .arg(&json)
        .query_async(&mut store.conn)
        .await
        .map_err(|e| Error::from_redis(&format!("XADD {requests}"), e))
}

/// Edits approval `id` as `identity` through the requesting bridge's outbox.
pub async fn edit(
    store: &mut Store,
    requester: &Requester,
    id: &str,
    change: &Change,
    identity: &str,
) -> Result<Edited> {
    let Some(bridge) = bridge_of(store, id).await? else {
        return Err(Error::refused(format!("no approval {id}")));
    };
    let action = Action::Edit {
        content: change.content.clone(),
        subject: change.subject.clone(),
        channel_id: change.channel_id.clone(),
        seen: change.seen.clone(),
    };
    submit(store, requester, &bridge, id, identity, action)
        .await?
        .into_edited()
}

/// Writes one request and waits (at most [`WAIT`]) for its reply, on a
/// connection of its own (the wait blocks it).
async fn submit(
    store: &mut Store,
    requester: &Requester,
    bridge: &str,
    id: &str,
    identity: &str,
    action: Action,
) -> Result<Reply> {
    let suffix = requester.suffix();
    let (requests, replies) = (
        keys::requests(bridge, &suffix),
        keys::replies(bridge, &suffix),
    );
    let request = Request {
        nonce: uuid::Uuid::new_v4().simple().to_string(),
        approval_id: id.to_string(),
        identity: identity.to_string(),
        action,
    };
    let mut conn = store.blocking().await?;
    // Replies after this one are candidates: read the stream's end first.
    let last: Vec<(String, Vec<(String, String)>)> = redis::cmd("XREVRANGE")
        .arg(&replies)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1)
        .query_async(&mut conn)
        .await
        .map_err(|e| Error::from_redis(&format!("XREVRANGE {replies}"), e))?;
    let mut after = last
        .into_iter()
        .next()
        .map(|(id, _)| id)
        .unwrap_or_else(|| "0-0".into());
    write(store, &requests, &request).await?;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Err(Error::platform(
                true,
                format!(
                    "no answer from the outbox service of bridge `{bridge}` within {} s \
                 (is it running?); the request lapses unread after {} s, so nothing is \
                 decided by it then: look with `cowboy approvals show {id}`",
                    WAIT.as_secs(),
                    LAPSE.as_secs()
                ),
            ));
        }
        let read: redis::streams::StreamReadReply = redis::cmd("XREAD")
            .arg("COUNT")
            .arg(100)
            .arg("BLOCK")
            .arg(left.as_millis().max(1) as u64)
            .arg("STREAMS")
            .arg(&replies)
            .arg(&after)
            .query_async(&mut conn)
            .await
            .map_err(|e| Error::from_redis(&format!("XREAD {replies}"), e))?;
        for key in read.keys {
            for entry in key.ids {
                after = entry.id.clone();
                let nonce: Option<String> = entry.get("nonce");
                if nonce.as_deref() != Some(request.nonce.as_str()) {
                    continue;
                }
                let reply: String = entry.get("reply").unwrap_or_default();
                return serde_json::from_str(&reply)
                    .map_err(|e| Error::internal(format!("unreadable reply on {replies}: {e}")));
            }
        }
    }
}

/// The consumer group the outbox workers of `bridge` read requests in.
fn group(bridge: &str) -> String {
    format!("{bridge}-requests")
}

/// Serves the requests of every declared requester for `bridge`'s approvals
/// until shutdown, as `worker`. Runs beside the outbox service of a bridge that
/// parks. Returns on shutdown, or with an error only a restart can fix.
pub async fn serve(
    mut store: Store,
    config: Arc<Config>,
    bridge: String,
    worker: String,
    shutdown: Shutdown,
    clock: Clock,
) -> Result<()> {
    let requesters = Requester::all(&config, &bridge)?;
    if requesters.is_empty() {
        return Ok(());
    }
    let streams: Vec<String> = requesters
        .iter()
        .map(|r| keys::requests(&bridge, &r.suffix()))
        .collect();
    let group = group(&bridge);
    recreate_groups(&mut store, &streams, &group).await?;
    // This worker's own unacknowledged requests first (a crash mid-request).
    let mut backlog = true;
    let mut failures = 0u32;
    let mut conn = None;
    while !shutdown.is_set() {
        let reader = match &mut conn {
            Some(c) => c,
            None => match store.blocking().await {
                Ok(c) => conn.insert(c),
                Err(e) => {
                    failures += 1;
                    tracing::warn!(error = %e, "connecting for decision requests failed; retrying");
                    if !shutdown
                        .sleep(crate::retry::backoff(failures.min(10)))
                        .await
                    {
                        break;
                    }
                    continue;
                }
            },
        };
        let step = serve_once(
            reader,
            &mut store,
            &config,
            &clock,
            &bridge,
            &worker,
            &requesters,
            &streams,
            &group,
            backlog,
            &shutdown,
        )
        .await;
        // A request stream deleted under the read (an administrator clearing
        // it), or groups a failover lost (UNBLOCKED: the server became a
        // replica under the read): they come back. Recreating them may meet
        // the old master before the store follows the new one; that failure
        // is handled like a failed read below.
        let step = match step {
            Err(Error::Redis(e)) if matches!(e.code(), Some("NOGROUP" | "UNBLOCKED")) => {
                tracing::warn!("a request stream lost its group; creating it again");
                conn = None;
                backlog = true;
                recreate_groups(&mut store, &streams, &group)
                    .await
                    .map(|()| true)
            }
            other => other,
        };
        match step {
            Ok(more) => {
                failures = 0;
                backlog = more && backlog;
            }
            Err(e) if e.is_retriable() => {
                failures += 1;
                tracing::warn!(error = %e, "reading decision requests failed; retrying");
                backlog = true;
                conn = None;
                if !shutdown
                    .sleep(crate::retry::backoff(failures.min(10)))
                    .await
                {
                    break;
                }
            }
            Err(e) => {
                tracing::error!(error = %e, bridge = %bridge, "cannot serve decision requests");
                return Err(e);
            }
        }
    }
    Ok(())
}

/// Creates the request streams' group wherever it is missing (at start, and
/// after Redis lost them).
async fn recreate_groups(store: &mut Store, streams: &[String], group: &str) -> Result<()> {
    for s in streams {
        store.ensure_group(s, group).await?;
    }
    Ok(())
}

/// One read and what it brought. With `backlog`, reads this worker's pending
/// requests (without blocking); returns whether there may be more of them.
#[allow(clippy::too_many_arguments)]
async fn serve_once(
    conn: &mut crate::store::Blocking,
    store: &mut Store,
    config: &Config,
    clock: &Clock,
    bridge: &str,
    worker: &str,
    requesters: &[Requester],
    streams: &[String],
    group: &str,
    backlog: bool,
    shutdown: &Shutdown,
) -> Result<bool> {
    let ids = vec![if backlog { "0" } else { ">" }; streams.len()];
    let block = (!backlog).then_some(Duration::from_millis(BLOCK_MS));
    // A shutdown ends the wait at once: entries a read handed over meanwhile
    // stay pending for this worker and are read first on the next start.
    let read = tokio::select! {
        _ = shutdown.wait() => return Ok(false),
        read = conn.read_group(group, worker, streams, &ids, 50, block) => read?,
    };
    if read.iter().all(|(_, entries)| entries.is_empty()) {
        return Ok(false);
    }
    let mut any = false;
    for (stream, entries) in read {
        // The clock that dated the stream's ids: on a cluster, its node's.
        let now_ms = match entries.is_empty() {
            true => 0,
            false => store.conn.millis_at(&stream).await?,
        };
        let Some(requester) = streams
            .iter()
            .position(|s| *s == stream)
            .map(|i| &requesters[i])
        else {
            continue;
        };
        for (id, fields) in entries {
            any = true;
            let written_ms = id
                .split('-')
                .next()
                .and_then(|ms| ms.parse::<u64>().ok())
                .unwrap_or(0);
            let json: Option<String> = fields.as_ref().and_then(|f| {
                f.iter()
                    .find(|(k, _)| k == "request")
                    .and_then(|(_, v)| String::from_utf8(v.clone()).ok())
            });
            let (nonce, reply) = match json.as_deref().map(serde_json::from_str::<Request>) {
                Some(Ok(request)) => {
                    let lapsed = now_ms.saturating_sub(written_ms) > LAPSE.as_millis() as u64
                        && !matches!(requester, Requester::Surface { .. });
                    // The id is the writer's to choose: one dated ahead would never lapse.
                    let ahead = written_ms > now_ms + 1000;
                    let reply = if ahead {
                        Reply::Refused {
                            message: "the request's stream id is dated ahead of the server's clock: write it with `*`; nothing was applied".into(),
                        }
                    } else if lapsed {
                        Reply::Refused {
                            message: format!(
                                "the request waited more than {} s unread and lapsed: nothing was applied",
                                LAPSE.as_secs()
                            ),
                        }
                    } else {
                        apply(store, config, clock, bridge, requester, &request).await?
                    };
                    (request.nonce, reply)
                }
                _ => (
                    String::new(),
                    Reply::Refused {
                        message: "unreadable request".into(),
                    },
                ),
            };
            let replies = keys::replies(bridge, &requester.suffix());
            let reply =
                serde_json::to_string(&reply).map_err(|e| Error::internal(e.to_string()))?;
            let _: String = redis::cmd("XADD")
                .arg(&replies)
                .arg("MAXLEN")
                .arg("~")
                .arg(KEPT)
                .arg("*")
                .arg("nonce")
                .arg(&nonce)
                .arg("reply")
                .arg(&reply)
                .query_async(&mut store.conn)
                .await
                .map_err(|e| Error::from_redis(&format!("XADD {replies}"), e))?;
            store.ack(&stream, group, &[id.as_str()]).await?;
        }
    }
    Ok(any)
}

/// Applies one request of `requester` under the rules every surface follows.
/// Errors that waiting may cure are returned (the request stays pending);
/// every other failure is the reply.
async fn apply(
    store: &mut Store,
    config: &Config,
    clock: &Clock,
    bridge: &str,
    requester: &Requester,
    request: &Request,
) -> Result<Reply> {
    if let Action::Delegate { .. } = &request.action {
        return delegate_here(store, config, clock, bridge, requester, request).await;
    }
    let id = request.approval_id.as_str();
    // Anything but this bridge's own ids is out of this service's reach:
    // refused unread, never a permission error that would stop the outbox.
    if !approval::is_id_of(id, bridge) {
        return Ok(Reply::Refused {
            message: format!("`{id}` is not an approval of bridge `{bridge}`"),
        });
    }
    let record = Approvals::on(store).load(id).await?;
    let Some(record) = record else {
        return Ok(Reply::Late {
            state: approval::Late::Missing,
        });
    };
    if record.source() != bridge {
        return Ok(Reply::Refused {
            message: format!("approval {id} is not bridge `{bridge}`'s"),
        });
    }
    if !requester.may_act_as(&request.identity) {
        tracing::warn!(
            approval = id,
            identity = %request.identity,
            stream = %requester.suffix(),
            "a request claimed an identity its stream does not prove; refused"
        );
        let event = audit::Event::new(bridge, audit::Kind::Ignored, id, clock.now_secs_f64())
            .with(
                audit::field::BY,
                request.identity.chars().take(200).collect::<String>(),
            )
            .with(
                audit::field::WHY,
                format!(
                    "claimed by a request on requests:{} that cannot act as it",
                    requester.suffix()
                ),
            );
        audit::append(store, config, &[event]).await?;
        return Ok(Reply::Refused {
            message: format!(
                "a request from {} cannot act as {}",
                requester.suffix(),
                request.identity
            ),
        });
    }
    // A step's surface acts on nothing before its step.
    if let Requester::Surface { name, .. } = requester {
        if let Some(refused) = before_its_step(config, &record, name) {
            return Ok(refused);
        }
    }
    let result = match &request.action {
        Action::Decide {
            approved,
            reason,
            seen,
            card,
        } => {
            let verdict = if *approved {
                Verdict::Approved
            } else {
                Verdict::Rejected
            };
            // Bound to the version the requester showed, always: applied later
            // than it was asked, a request must not approve an edit made since.
            let Some(seen) = seen.as_deref().filter(|s| !s.is_empty()) else {
                return Ok(Reply::Refused {
                    message:
                        "a decision request must name the digest of the version it decides (`seen`)"
                            .into(),
                });
            };
            let mut answer = Answer::new(clock, verdict, &request.identity, reason).seeing(seen);
            match requester {
                Requester::Web => answer.proof = Some("page"),
                Requester::Surface { name, .. } => {
                    let card = card.as_deref().unwrap_or("");
                    let current = record.message_sha256.as_str();
                    return classify(
                        surface_answer(store, config, id, name, card, current, answer).await,
                    );
                }
                Requester::Operator(_) => {}
            }
            approval::decide(store, config, id, answer)
                .await
                .map(Reply::from)
        }
        // A surface reports answers to its cards; it never writes a message.
        Action::Edit { .. } if matches!(requester, Requester::Surface { .. }) => {
            return Ok(Reply::Refused {
                message: "a surface answers cards; only operators and the page edit".into(),
            });
        }
        Action::Edit {
            content,
            subject,
            channel_id,
            seen,
        } => {
            let change = Change {
                content: content.clone(),
                subject: subject.clone(),
                channel_id: channel_id.clone(),
                seen: seen.clone(),
            };
            edit::edit(store, config, clock, id, &change, &request.identity)
                .await
                .map(|e| Reply::Edited {
                    old_digest: e.old_digest,
                    new_digest: e.new_digest,
                    revision: e.revision,
                })
        }
        Action::Delegate { .. } => Err(Error::internal("a delegation reached the approval path")),
        Action::Snooze {
            seconds,
            reason,
            card,
        } => {
            // A surface snoozes from a live card of this approval only.
            if let Requester::Surface { name, .. } = requester {
                let card = card.as_deref().unwrap_or("");
                let mapped = match Approvals::on(store).map_get(name, card).await {
                    Ok(m) => m,
                    Err(e) => return classify(Err(e)),
                };
                if card.is_empty() || mapped.as_deref() != Some(id) {
                    return Ok(Reply::Refused {
                        message: format!(
                            "`{card}` is not a live card of approval {id} on `{name}`"
                        ),
                    });
                }
            }
            let later = approval::snooze::Later {
                seconds: *seconds,
                reason,
                request: &request.nonce,
            };
            approval::snooze::snooze(store, config, clock, id, &request.identity, later)
                .await
                .map(|s| Reply::Snoozed {
                    until: s.until,
                    count: s.count,
                    max: s.max,
                })
        }
    };
    classify(result)
}

/// Applies a delegation request: only an operator, for their own person
/// (see [`approval::delegation`]); recorded in the bridge's trail.
async fn delegate_here(
    store: &mut Store,
    config: &Config,
    clock: &Clock,
    bridge: &str,
    requester: &Requester,
    request: &Request,
) -> Result<Reply> {
    let refused = |message: String| Ok(Reply::Refused { message });
    let Action::Delegate { to, until } = &request.action else {
        return refused("not a delegation".into());
    };
    let (to, until) = (to.as_str(), *until);
    if !matches!(requester, Requester::Operator(_)) {
        return refused("only an operator delegates, from their own CLI user".into());
    }
    if !requester.may_act_as(&request.identity) {
        return refused(format!(
            "a request from {} cannot act as {}",
            requester.suffix(),
            request.identity
        ));
    }
    let now = clock.now_secs();
    let set =
        approval::delegation::set(store, config, bridge, &request.identity, to, until, now).await;
    let d = match set {
        Ok(Ok(d)) => d,
        Ok(Err(why)) => return refused(why),
        Err(e) => return classify(Err(e)),
    };
    let from = config
        .person_of(&request.identity)
        .unwrap_or_default()
        .to_string();
    let (to, until) = match &d {
        Some(d) => (d.to.clone(), d.until),
        None => (String::new(), 0),
    };
    tracing::info!(bridge, %from, %to, until, "delegation recorded");
    let event = audit::Event::new(bridge, audit::Kind::Delegated, "", clock.now_secs_f64())
        .with(audit::field::BY, request.identity.as_str())
        .with(audit::field::FOR, from.as_str())
        .with(audit::field::DELEGATE, to.as_str())
        .with(audit::field::UNTIL, until.to_string());
    audit::append(store, config, &[event]).await?;
    Ok(Reply::Delegated { from, to, until })
}

/// Hands operator `requester`'s answers on `bridge` to person `to` until
/// `until` (0: takes them back), through the bridge's outbox.
pub async fn delegate(
    store: &mut Store,
    requester: &Requester,
    bridge: &str,
    identity: &str,
    to: &str,
    until: u64,
) -> Result<(String, String, u64)> {
    let action = Action::Delegate {
        to: to.to_string(),
        until,
    };
    match submit(store, requester, bridge, "", identity, action).await? {
        Reply::Delegated { from, to, until } => Ok((from, to, until)),
        Reply::Refused { message } => Err(Error::refused(message)),
        Reply::Failed { message } => Err(Error::internal(format!("the outbox: {message}"))),
        other => Err(Error::internal(format!(
            "unexpected reply to a delegation: {other:?}"
        ))),
    }
}

/// A request's result as its reply: an error that waiting may cure is passed
/// on (the request stays pending); any other is the reply, never a reason to
/// stop serving: a refusal when the operator's request cannot be met, a
/// failure when the outbox itself failed (the CLI exits 70, not 1).
fn classify(result: Result<Reply>) -> Result<Reply> {
    match result {
        Ok(reply) => Ok(reply),
        Err(e) if e.is_retriable() => Err(e),
        Err(Error::Operator { message, .. }) => Ok(Reply::Refused { message }),
        Err(e) => Ok(Reply::Failed {
            message: e.to_string(),
        }),
    }
}

/// The refusal for surface `name` acting on `record` before the escalation
/// step that asks it was taken (a surface only a step asks holds the
/// records' rights from the start, to show its card when the step comes);
/// `None` for every other surface, and once the step is taken.
fn before_its_step(config: &Config, record: &approval::Record, name: &str) -> Option<Reply> {
    let step = config.step_of(record.source(), name)?;
    (record.escalated as usize <= step).then(|| Reply::Refused {
        message: format!("`{name}` is asked only from escalation step {}", step + 1),
    })
}

/// Surface `name`'s answer to its card `card` of approval `id`: only a card
/// its map gives for that approval, counted once per surface password under
/// a quorum; the card is disarmed when the answer settles it. `current`: the
/// digest of the version the record holds, as read for this request.
async fn surface_answer(
    store: &mut Store,
    config: &Config,
    id: &str,
    name: &str,
    card: &str,
    current: &str,
    mut answer: Answer<'_>,
) -> Result<Reply> {
    let mapped = Approvals::on(store).map_shown(name, card).await?;
    let shown = match mapped {
        Some((mapped, shown)) if !card.is_empty() && mapped == id => shown,
        _ => {
            return Ok(Reply::Refused {
                message: format!("`{card}` is not a live card of approval {id} on `{name}`"),
            })
        }
    };
    let proof = format!("ingest:{name}");
    answer.proof = Some(&proof);
    answer.card = Some(card);
    // The card answers for the version it shows, as its surface recorded
    // it (the record's card fields can be wiped by another surface, its map
    // entry cannot), and for the one the request names (a button carries
    // it): when they differ, whichever is not the current version decides
    // the answer is late.
    let seen = match (answer.seen, shown.as_deref()) {
        (Some(asked), Some(card)) if asked != card && asked == current => Some(card),
        (Some(asked), _) => Some(asked),
        (None, card) => card,
    };
    let answer = approval::Answer { seen, ..answer };
    let outcome = approval::decide(store, config, id, answer).await?;
    if approval::disarms(&outcome) {
        Approvals::on(store).map_delete(name, card).await?;
    }
    Ok(Reply::from(outcome))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_proves_only_its_own_identity() {
        let ann = Requester::Operator("ann".into());
        assert!(ann.may_act_as("cli:ann"));
        for other in ["cli:bob", "cli:ann2", "web:ann", "cli:", "discord:1"] {
            assert!(!ann.may_act_as(other), "{other}");
        }
        assert!(Requester::Web.may_act_as("web:boss"));
        for other in ["web:", "cli:boss", "console:boss", "email:boss@example.org"] {
            assert!(!Requester::Web.may_act_as(other), "{other}");
        }
    }

    #[test]
    fn requests_and_replies_round_trip_as_json() {
        let r = Request {
            nonce: "n".into(),
            approval_id: "id".into(),
            identity: "cli:ann".into(),
            action: Action::Decide {
                approved: true,
                reason: String::new(),
                seen: Some("d".into()),
                card: None,
            },
        };
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<Request>(&json).unwrap(), r);
        let reply = Reply::Counted {
            have: 1,
            need: 2,
            again: false,
        };
        let json = serde_json::to_string(&reply).unwrap();
        assert_eq!(serde_json::from_str::<Reply>(&json).unwrap(), reply);
    }
}
