//! `cowboy approvals review`: one approval at a time, answered at the terminal.

use crate::approval::{self, Approvals, State, Verdict};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::store::Store;

use super::*;

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
