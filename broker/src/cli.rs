//! The operator commands behind the `cowboy` binary. Each returns the text to
//! print, so the binary stays a thin argument parser.
//!
//! The CLI is an approval surface like any other: its decisions go through
//! [`approval::decide`] with the approver `cli:{operator}`, which must be on the
//! requesting bridge's `approval.approvers`. With `[operators]` declared, the
//! operator's Redis user can write no record: its decisions and edits are
//! requests the requesting bridge's outbox applies ([`crate::request`]).

use std::collections::HashMap;
use std::fmt::Write as _;

use redis::AsyncCommands;

use crate::approval::{self, field, Answer, Approvals, Outcome, State, Verdict};
use crate::audit;
use crate::clock::Clock;
use crate::config::Config;
use crate::deliveries;
use crate::entry::Message;
use crate::error::{ConfigError, Error, Result};
use crate::identity::Identity;
use crate::keys;
use crate::store::Store;

/// `cowboy approvals list`: one line per approval, id first. Settled-but-not-yet-
/// deleted records are skipped; pass `all` to list decided and expired ones too.
pub async fn approvals_list(store: &mut Store, config: &Config, all: bool) -> Result<String> {
    let now = crate::now_secs_f64();
    let mut out = String::new();
    let ids = approval::pending_ids(store, config).await?;
    // Only what a line shows: a list of many approvals moves little.
    let shown = [
        field::STATUS,
        field::EXPIRES_AT,
        field::SETTLED_AT,
        field::DECIDED_AT,
        field::CONTENT_PREVIEW,
        field::SOURCE,
        field::CHANNEL_ID,
        field::AGENT,
    ];
    let records = Approvals::on(store).load_fields_many(&ids, &shown).await?;
    for (id, r) in ids.iter().zip(records) {
        let Some(r) = r else {
            continue;
        };
        let state = r.state(now);
        if r.is_settled() || (!all && state != State::Pending) {
            continue;
        }
        let preview: String = r.content_preview.chars().take(60).collect();
        let preview = approval::display_safe(&preview);
        let _ = writeln!(
            out,
            "{id}  {state:<8}  {src} -> {dest}  agent={agent}  expires={exp}  {preview:?}",
            state = state.as_str(),
            src = r.source(),
            dest = approval::display_safe(&r.channel_id),
            agent = r.agent().unwrap_or("-"),
            exp = match r.expires_at {
                0 => "never".to_string(),
                t => t.to_string(),
            },
        );
    }
    Ok(out)
}

/// `cowboy approvals show ID`: the frame every surface shows (every field the
/// sender will use, the whole content), whether the entry still matches what
/// the approval binds, then every record field.
pub async fn approvals_show(store: &mut Store, config: &Config, prefix: &str) -> Result<String> {
    let id = approval::find_by_prefix(store, config, prefix).await?;
    let Some(r) = Approvals::on(store).load(&id).await? else {
        // Settled and gone: its history is all that is left.
        let filter = audit::Filter {
            approval: Some(id.clone()),
            ..audit::Filter::default()
        };
        let history = audit::query(store, config, &filter).await?;
        if history.is_empty() {
            return Err(Error::refused(format!("no approval {id}")));
        }
        return Ok(format!(
            "approval {id}\nstate: settled (the record is gone)\n\nhistory:\n{}",
            audit::render(&history, false)
        ));
    };
    let mut out = format!(
        "approval {id}\nstate: {}\n",
        r.state(crate::now_secs_f64()).as_str()
    );
    if let Some(progress) = r.progress() {
        let _ = writeln!(out, "approvals: {progress}");
    }
    out.push('\n');
    let view = approval::View::load(store, config, r).await?;
    let r = &view.record;
    match &view.shown {
        // A declared action: what the approval binds (the exact argv at that
        // commit) is in the card, not in the agent's request.
        approval::Shown::Card(card) => {
            match card {
                Some(card) => out.push_str(card),
                None => out.push_str("the card approvers were shown is no longer kept: reject this and ask the agent again\n"),
            }
            out.push_str(
                "\n\nThe bridge derives the command from its config and the repository again before it runs, and runs nothing if that differs from what was approved.\n",
            );
        }
        // The version that will be sent: an approver's edit, if any.
        approval::Shown::Message { message, matches } => {
            let how = format!("run `cowboy approvals approve {id}` or `cowboy approvals reject {id} --reason ...`");
            out.push_str(&approval::render_notification(
                r,
                &message.content,
                &how,
                None,
            ));
            let _ = writeln!(
                out,
                "\n\nThe entry's digest {} {}",
                message.sha256(),
                match matches {
                    true => "matches the approval.",
                    false => "DIFFERS FROM THE APPROVAL: it will not be sent.",
                }
            );
        }
        approval::Shown::Unreadable(why) => {
            let _ = writeln!(
                out,
                "the entry no longer reads as a message ({why}): it will not be sent"
            );
        }
        approval::Shown::Gone => {
            out.push_str("the entry is no longer in its stream: it will not be sent\n")
        }
    }
    out.push_str("\nrecord:\n");
    for (k, v) in r.to_pairs() {
        if k != field::CONTENT_PREVIEW && k != field::EDITED_MESSAGE {
            // One line per field whatever the value holds (a record written by
            // an older version may hold line breaks), so no value poses as a field.
            let shown = approval::display_safe(&v)
                .replace('\n', "\\n")
                .replace('\t', "\\t");
            let _ = writeln!(out, "  {k}: {shown}");
        }
    }
    let history = audit::history(store, r.source(), &id, Some(r.created_at as f64)).await?;
    let _ = write!(out, "\nhistory:\n{}", audit::render(&history, false));
    Ok(out)
}

/// `cowboy audit`: the trail, filtered.
pub async fn audit(
    store: &mut Store,
    config: &Config,
    filter: &audit::Filter,
    json: bool,
) -> Result<String> {
    let entries = audit::query(store, config, filter).await?;
    Ok(audit::render(&entries, json))
}

/// `--since`: unix seconds, or how long ago (`90s`, `15m`, `2h`, `7d`).
pub fn parse_since(text: &str, now: f64) -> Result<f64> {
    let bad = || {
        Error::usage(format!(
            "--since `{text}`: give unix seconds or an age like 2h or 7d"
        ))
    };
    if let Ok(t) = text.parse::<f64>() {
        return Ok(t);
    }
    let split = text.len().checked_sub(1).ok_or_else(bad)?;
    if !text.is_char_boundary(split) {
        return Err(bad());
    }
    let (n, unit) = text.split_at(split);
    let n: f64 = n.parse().map_err(|_| bad())?;
    let scale = match unit {
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        _ => return Err(bad()),
    };
    Ok(now - n * scale)
}

/// `cowboy deliveries list`.
pub async fn deliveries_list(store: &mut Store, config: &Config) -> Result<String> {
    let all = deliveries::list(store, config).await?;
    Ok(deliveries::render(&all))
}

/// `cowboy deliveries reconcile ID --outcome … --evidence …`.
pub async fn deliveries_reconcile(
    store: &mut Store,
    config: &Config,
    id: &str,
    outcome: &str,
    evidence: &str,
    operator: &str,
) -> Result<String> {
    let finding = deliveries::Finding::parse(outcome).ok_or_else(|| {
        Error::usage(format!(
            "--outcome `{outcome}`: give delivered or not-delivered"
        ))
    })?;
    let by = Identity::cli(operator);
    let clock = Clock::system();
    match deliveries::reconcile(store, config, &clock, id, finding, evidence, &by).await? {
        None => Ok(format!("{id} reconciled as delivered by {by}; nothing sent\n")),
        Some(entry) => Ok(format!(
            "{id} reconciled as not delivered by {by}; the message is back on its stream as {entry}, to be decided (or delivered) afresh\n"
        )),
    }
}

/// The connection a CLI decision is made on. Without `[operators]`, `cli:NAME`
/// is a label and the CLI connects as `[redis]`. With operators declared, NAME
/// must be one of them, and everything is done over a connection as Redis user
/// NAME with its password (confirmed with `ACL WHOAMI`); the administrator's
/// password is never read.
pub async fn decision_store(config: &Config, operator: &str) -> Result<Store> {
    if config.operators.is_empty() {
        return Store::connect(&config.redis).await;
    }
    let op = config.operators.get(operator).ok_or_else(|| {
        Error::usage(format!(
            "`{operator}` is not declared in [operators]; pass --as NAME (COWBOY_OPERATOR) with your operator name"
        ))
    })?;
    let redis = crate::config::RedisConfig {
        username: Some(operator.to_string()),
        password_file: Some(op.password_file.clone()),
        ..config.redis.clone()
    };
    let mut store = Store::connect(&redis).await?;
    let whoami: String = redis::cmd("ACL")
        .arg("WHOAMI")
        .query_async(&mut store.conn)
        .await
        .map_err(|e| Error::from_redis("ACL WHOAMI", e))?;
    if whoami != operator {
        return Err(Error::Config(ConfigError::invalid(
            "operators",
            format!(
                "connected as Redis user `{whoami}`, not `{operator}`: is the Redis ACL loaded?"
            ),
        )));
    }
    Ok(store)
}

/// The connection `approvals list` and `show` read over: as the operator when
/// NAME is a declared one, else as `[redis]`.
pub async fn reading_store(config: &Config, operator: &str) -> Result<Store> {
    if config.operators.contains_key(operator) {
        decision_store(config, operator).await
    } else {
        Store::connect(&config.redis).await
    }
}

/// `cowboy approvals approve|reject ID`.
pub async fn approvals_decide(
    store: &mut Store,
    config: &Config,
    prefix: &str,
    verdict: Verdict,
    operator: &str,
    reason: &str,
    seen: Option<&str>,
) -> Result<String> {
    let id = approval::find_by_prefix(store, config, prefix).await?;
    let approver = Identity::cli(operator);
    let record = Approvals::on(store).load(&id).await?;
    if seen.is_none() && verdict == Verdict::Approved {
        // A blind approval counts for whatever version exists when it lands:
        // under a quorum a colleague's edit would be approved unseen.
        if let Some(r) = &record {
            let why = if r.quorum() > 1 {
                Some("it needs a quorum of approvals")
            } else if r.original_sha256.is_some() {
                Some("it was edited")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(Error::usage(format!(
                    "{id}: {why}, so an approval must name the version it approves: \
                     pass --digest SHA256 as `cowboy approvals show {id}` prints it (nothing decided)"
                )));
            }
        }
    }
    // Always bound: to the digest given, or to the version read just now, so a
    // decision applied later (by the outbox) never lands on an edit made since.
    let digest = seen
        .map(str::to_string)
        .or_else(|| record.as_ref().map(|r| r.message_sha256.clone()));
    let mut answer = Answer::new(&Clock::system(), verdict, &approver, reason);
    if let Some(digest) = &digest {
        answer = answer.seeing(digest);
    }
    let outcome = if config.operators.is_empty() {
        approval::decide(store, config, &id, answer).await?
    } else {
        let requester = crate::request::Requester::Operator(operator.to_string());
        crate::request::decide(store, &requester, &id, answer).await?
    };
    match outcome {
        Outcome::Decided => Ok(format!("{id} {} by {approver}\n", verdict.as_str())),
        Outcome::Counted {
            have,
            need,
            again: false,
        } => Ok(format!(
            "{id}: approval by {approver} counted, {have} of {need}; not sent until {need} approvers approve\n"
        )),
        Outcome::Counted { have, need, .. } => Err(Error::refused(format!(
            "{approver} has approved {id} already ({have} of {need}): each approver counts once"
        ))),
        Outcome::NotAllowed => Err(Error::refused(format!(
            "{approver} is not on the approvers list of the requesting bridge"
        ))),
        Outcome::Late(approval::Late::Superseded) => Err(Error::refused(format!(
            "{id} was edited since it was shown: nothing decided; look at it again"
        ))),
        Outcome::SharedProofCounted => Err(Error::refused(format!(
            "{id}: another approval came through the same shared proof; not counted"
        ))),
        Outcome::EditorNotCounted => Err(Error::refused(format!(
            "{approver} edited {id}: under a quorum the editor's approval does not count; the other approvers decide"
        ))),
        Outcome::Late(approval::Late::Busy) => Err(Error::Operator {
            kind: crate::error::Operator::Busy,
            message: format!("{id}: other answers keep landing at the same moment; try again"),
        }),
        Outcome::Late(state) => Err(Error::refused(format!("{id} is already {state}"))),
        Outcome::Unknown | Outcome::Submitted => {
            Err(Error::refused(format!("no approval {id}")))
        }
    }
}

/// `cowboy approvals edit`: replaces the message of a pending (or approved,
/// not yet sent) approval as approver `cli:{operator}`; it is asked again.
pub async fn approvals_edit(
    store: &mut Store,
    config: &Config,
    prefix: &str,
    change: &approval::edit::Change,
    operator: &str,
) -> Result<String> {
    let id = approval::find_by_prefix(store, config, prefix).await?;
    let editor = Identity::cli(operator);
    let e = if config.operators.is_empty() {
        approval::edit::edit(store, config, &Clock::system(), &id, change, &editor).await?
    } else {
        let requester = crate::request::Requester::Operator(operator.to_string());
        crate::request::edit(store, &requester, &id, change, &editor).await?
    };
    Ok(format!(
        "{id} edited by {editor} (edit {}): sha256 {} -> {}; any decision is revoked and approvers are asked again\n",
        e.revision, e.old_digest, e.new_digest
    ))
}

/// The content an approval would send now (the agent's, or the last edit's),
/// for an editor to start from, and the digest of that version.
pub async fn approval_content(
    store: &mut Store,
    config: &Config,
    prefix: &str,
) -> Result<(String, String)> {
    let id = approval::find_by_prefix(store, config, prefix).await?;
    let r = Approvals::on(store)
        .load(&id)
        .await?
        .ok_or_else(|| Error::refused(format!("no approval {id}")))?;
    let entry = store
        .entry(&r.stream, &r.entry_id)
        .await?
        .ok_or_else(|| Error::refused(format!("{id}: the entry is gone from its stream")))?;
    let m = Message::from_entry(&entry, config.bridge(r.source())?)
        .and_then(|m| approval::edit::apply(m, &r))
        .map_err(Error::refused)?;
    Ok((m.content, r.message_sha256))
}

fn terminal(e: std::io::Error) -> Error {
    Error::platform(false, format!("terminal: {e}"))
}

/// One line of input with its end, or `None` at the end of the input.
fn raw_line(input: &mut dyn std::io::BufRead) -> Result<Option<String>> {
    let mut line = String::new();
    match input.read_line(&mut line).map_err(terminal)? {
        0 => Ok(None),
        _ => Ok(Some(line)),
    }
}

/// Prompts and reads one answer, trimmed.
fn ask(
    input: &mut dyn std::io::BufRead,
    output: &mut dyn std::io::Write,
    prompt: &str,
) -> Result<Option<String>> {
    write!(output, "{prompt}").map_err(terminal)?;
    output.flush().map_err(terminal)?;
    Ok(raw_line(input)?.map(|l| l.trim().to_string()))
}

/// Which approvals `cowboy approvals review` walks.
#[derive(Debug, Clone, Default)]
pub struct ReviewFilter {
    pub bridge: Option<String>,
    pub agent: Option<String>,
}

/// `cowboy approvals review`: the pending approvals one at a time, oldest
/// first, each shown in full, each asked about: approve, reject (with a
/// reason), skip or quit. Only a line that says so decides: the end of the
/// input, or anything unrecognised, decides nothing. There is no "all".
pub async fn approvals_review(
    store: &mut Store,
    config: &Config,
    filter: &ReviewFilter,
    operator: &str,
    input: &mut dyn std::io::BufRead,
    output: &mut dyn std::io::Write,
) -> Result<String> {
    let io = terminal;
    let ids = approval::pending_ids(store, config).await?;
    let records = Approvals::on(store).load_many(&ids).await?;
    let now = crate::now_secs_f64();
    let mut queue: Vec<approval::Record> = records
        .into_iter()
        .flatten()
        .filter(|r| !r.is_settled() && r.state(now) == State::Pending)
        .filter(|r| filter.bridge.as_ref().is_none_or(|b| b == r.source()))
        .filter(|r| {
            filter
                .agent
                .as_ref()
                .is_none_or(|a| Some(a.as_str()) == r.agent())
        })
        .collect();
    // Within a second, in the order the agents wrote them.
    let order = |r: &approval::Record| {
        let (ms, seq) = r.entry_id.split_once('-').unwrap_or((&r.entry_id, "0"));
        let n = |t: &str| t.parse::<u64>().unwrap_or(u64::MAX);
        (r.created_at, n(ms), n(seq))
    };
    queue.sort_by_key(order);
    let total = queue.len();
    let (mut approved, mut rejected, mut skipped, mut edited) = (0, 0, 0, 0);
    let mut stopped = "all reviewed";
    'queue: for (n, r) in queue.iter().enumerate() {
        let shown = match approvals_show(store, config, &r.id).await {
            Ok(text) => text,
            Err(e) => {
                writeln!(output, "{}: {e}; skipped", r.id).map_err(io)?;
                continue;
            }
        };
        writeln!(output, "\n=== {} of {total} ===\n{shown}", n + 1).map_err(io)?;
        loop {
            let Some(answer) = ask(
                input,
                output,
                "[a]pprove, [r]eject, [e]dit, [s]kip, [q]uit? ",
            )?
            else {
                stopped = "end of input: nothing more decided";
                break 'queue;
            };
            let (verdict, reason) = match answer.to_lowercase().as_str() {
                "e" | "edit" => {
                    let prompt = "new content; end with a line holding only `.`:\n";
                    write!(output, "{prompt}").map_err(io)?;
                    let mut content = Vec::new();
                    loop {
                        let Some(line) = raw_line(input)? else {
                            stopped = "end of input: nothing more decided";
                            break 'queue;
                        };
                        let line = line.trim_end_matches(['\n', '\r']);
                        if line == "." {
                            break;
                        }
                        content.push(line.to_string());
                    }
                    let change = approval::edit::Change {
                        content: Some(content.join("\n")),
                        seen: Some(r.message_sha256.clone()),
                        ..Default::default()
                    };
                    match approvals_edit(store, config, &r.id, &change, operator).await {
                        Ok(text) => {
                            write!(output, "{text}").map_err(io)?;
                            edited += 1;
                        }
                        Err(e) => writeln!(output, "not edited: {e}").map_err(io)?,
                    }
                    continue 'queue;
                }
                "a" | "approve" => (Verdict::Approved, String::new()),
                "r" | "reject" => match ask(input, output, "reason (the agent sees it): ")? {
                    Some(reason) => (Verdict::Rejected, reason),
                    None => {
                        stopped = "end of input: nothing more decided";
                        break 'queue;
                    }
                },
                "s" | "skip" => {
                    skipped += 1;
                    continue 'queue;
                }
                "q" | "quit" => {
                    stopped = "quit";
                    break 'queue;
                }
                _ => {
                    writeln!(output, "answer a, r, e, s or q").map_err(io)?;
                    continue;
                }
            };
            // Bound to the version shown: an edit meanwhile makes this late.
            let seen = Some(r.message_sha256.as_str());
            match approvals_decide(store, config, &r.id, verdict, operator, &reason, seen).await {
                Ok(text) => {
                    write!(output, "{text}").map_err(io)?;
                    match verdict {
                        Verdict::Approved => approved += 1,
                        Verdict::Rejected => rejected += 1,
                    }
                }
                // Decided elsewhere meanwhile, or not this operator's to decide.
                Err(e) => writeln!(output, "not decided: {e}").map_err(io)?,
            }
            continue 'queue;
        }
    }
    Ok(format!(
        "{stopped}. {total} pending: {approved} approved, {rejected} rejected, {edited} edited, {skipped} skipped\n"
    ))
}

/// What `cowboy send` writes.
#[derive(Debug, Default)]
pub struct SendArgs {
    pub bridge: String,
    pub agent: Option<String>,
    pub channel: String,
    pub content: String,
    pub subject: Option<String>,
    pub reply_to: Option<String>,
    pub request_id: Option<String>,
}

/// `cowboy send`: XADD an outbox entry as an agent would. Returns the entry id.
pub async fn send(store: &mut Store, config: &Config, a: &SendArgs) -> Result<String> {
    config.bridge(&a.bridge)?;
    if let Some(agent) = &a.agent {
        if !config.agents.contains_key(agent) {
            return Err(Error::usage(format!("no agent `{agent}` in the config")));
        }
    }
    let mut fields: Vec<(&str, &[u8])> = vec![
        ("channel_id", a.channel.as_bytes()),
        ("content", a.content.as_bytes()),
    ];
    for (k, v) in [
        ("subject", &a.subject),
        ("reply_to", &a.reply_to),
        ("request_id", &a.request_id),
    ] {
        if let Some(v) = v {
            fields.push((k, v.as_bytes()));
        }
    }
    let stream = keys::outbox_for(a.agent.as_deref(), &a.bridge);
    let id = store.xadd(&stream, &fields).await?;
    Ok(format!("{stream} {id}\n"))
}

/// `cowboy status`: per bridge, its streams, pending and parked counts, dead
/// letters and the age of each service's heartbeat.
pub async fn status(store: &mut Store, config: &Config) -> Result<String> {
    let now = crate::now_secs();
    let mut parked: HashMap<String, usize> = HashMap::new();
    for name in config.bridges.keys() {
        let n = Approvals::on(store).pending_count(name).await?;
        parked.insert(name.clone(), n);
    }
    let mut out = String::new();
    for (name, bridge) in &config.bridges {
        let _ = writeln!(out, "bridge {name} ({})", bridge.kind);
        let mut streams = vec![(keys::outbox(name), Some(keys::outbox_group(name)))];
        streams.push((keys::inbox(name), Some(keys::ping_group(name))));
        for agent in config.agent_names() {
            streams.push((
                keys::agent_outbox(agent, name),
                Some(keys::outbox_group(name)),
            ));
            streams.push((keys::agent_inbox(agent, name), Some(keys::ping_group(name))));
        }
        streams.push((keys::dead(name), None));
        for (stream, group) in streams {
            let len: u64 = store
                .conn
                .xlen(&stream)
                .await
                .map_err(|e| Error::from_redis("XLEN", e))?;
            let pending = match group {
                Some(g) => group_pending(store, &stream, &g).await?,
                None => None,
            };
            let _ = writeln!(
                out,
                "  {stream:<32} length {len:>6}{}",
                pending
                    .map(|(g, p, lag)| format!("  group {g}: pending {p}, lag {lag}"))
                    .unwrap_or_default()
            );
        }
        let _ = writeln!(
            out,
            "  parked approvals: {}",
            parked.get(name).copied().unwrap_or(0)
        );
        let beats: HashMap<String, String> = store
            .conn
            .hgetall(keys::heartbeat(name))
            .await
            .map_err(|e| Error::from_redis("HGETALL heartbeat", e))?;
        for service in ["ingest", "outbox", "ping"] {
            let line = match beats.get(service).and_then(|t| t.parse::<u64>().ok()) {
                Some(t) => format!("alive ({}s ago)", now.saturating_sub(t)),
                None => "down (no heartbeat)".to_string(),
            };
            let _ = writeln!(out, "  {service:<7} {line}");
        }
        if let Some(platform) = beats.get("platform") {
            let _ = writeln!(out, "  platform {platform}");
        }
    }
    Ok(out)
}

/// (group, pending, lag) of a group on a stream, when both exist.
async fn group_pending(
    store: &mut Store,
    stream: &str,
    group: &str,
) -> Result<Option<(String, u64, String)>> {
    let reply: redis::RedisResult<Vec<HashMap<String, redis::Value>>> = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(stream)
        .query_async(&mut store.conn)
        .await;
    let Ok(groups) = reply else {
        return Ok(None); // no such stream yet
    };
    for g in groups {
        let name = g
            .get("name")
            .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok());
        if name.as_deref() == Some(group) {
            let pending = g
                .get("pending")
                .and_then(|v| redis::from_redis_value::<u64>(v.clone()).ok());
            let lag = g
                .get("lag")
                .and_then(|v| redis::from_redis_value::<u64>(v.clone()).ok())
                .map(|l| l.to_string())
                .unwrap_or_else(|| "?".into());
            return Ok(Some((group.to_string(), pending.unwrap_or(0), lag)));
        }
    }
    Ok(None)
}
