//! `cowboy approvals list|show|approve|reject|edit`.

use std::fmt::Write as _;

use crate::approval::{self, field, Answer, Approvals, Outcome, State, Verdict};
use crate::audit;
use crate::clock::Clock;
use crate::config::Config;
use crate::entry::Message;
use crate::error::{Error, Result};
use crate::identity::Identity;
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
    // About a line's length each: the text is not copied again as it grows.
    out.reserve(ids.len() * 160);
    let line = |id: &str, r: Option<approval::Record>| {
        let Some(r) = r else {
            return;
        };
        let state = r.state(now);
        if r.is_settled() || (!all && state != State::Pending) {
            return;
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
    };
    Approvals::on(store)
        .fields_of_each(&ids, &shown, line)
        .await?;
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
    if let Some(later) = r.snoozed(|t| crate::clock::utc(t as f64)) {
        let _ = writeln!(out, "later: {later}");
    }
    let surfaces: Vec<String> = r.cards().into_iter().map(|c| c.bridge).collect();
    let _ = writeln!(out, "asked on: {}", surfaces.join(", "));
    if let Some(step) = r.escalation() {
        let _ = writeln!(out, "escalation: {step}");
    }
    for d in approval::delegation::covering(store, &r, crate::now_secs()).await? {
        let _ = writeln!(out, "delegation: {d}");
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
            // Headed by what the entry says, not the record's copies.
            out.push_str(&approval::render_notification(
                &view.header(),
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

/// `cowboy approvals approve|reject ID`.
/// `cowboy approvals later`: moves the deadline of the approval `prefix`
/// names, as operator `operator` (through the requesting bridge's outbox
/// when operators are declared).
pub async fn approvals_later(
    store: &mut Store,
    config: &Config,
    prefix: &str,
    operator: &str,
    seconds: Option<u64>,
    reason: &str,
) -> Result<String> {
    let id = approval::find_by_prefix(store, config, prefix).await?;
    let who = Identity::cli(operator).to_string();
    let s = if config.operators.is_empty() {
        let clock = Clock::system();
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let later = approval::snooze::Later {
            seconds,
            reason,
            request: &nonce,
        };
        approval::snooze::snooze(store, config, &clock, &id, &who, later).await?
    } else {
        let requester = crate::request::Requester::Operator(operator.to_string());
        crate::request::snooze(store, &requester, &id, &who, seconds, reason).await?
    };
    Ok(format!(
        "{id} snoozed by {who} until {} (snooze {} of {})\n",
        crate::clock::utc(s.until as f64),
        s.count,
        s.max
    ))
}

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
        approval::decide_on(store, config, &id, record, answer).await?
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
