//! An agent's request to run a declared action, validated against the config
//! and the repository, and turned into what an approval binds.
//!
//! Invariants:
//! - An entry carries `action`, `sha`, optionally `params` (a JSON object of
//!   strings) and `request_id`, nothing else. The sha is a full object id (40
//!   or 64 hex digits) naming a commit in the action's repository; every
//!   declared param is given and matches its pattern; no other param is.
//! - What is bound ([`Request::content`]) is a canonical JSON of the action,
//!   repository, commit, the exact argv after substitution and the params: the
//!   approver decides on that, and the run re-derives it and must get the same.
//! - The sha is resolved as an object id of the repository's own hash length,
//!   never as a ref name (which could be moved after the approval).
//! - Param values are printable ASCII and never start with `-`.
//! - What approvers are also shown ([`context`]) is read from git, labelled as
//!   not bound: the commit's author, date and subject, the remotes, and against
//!   the action's target what it adds and what it would drop, each list capped
//!   with a note saying how many lines are hidden.

use std::collections::BTreeMap;
use std::path::Path;

use broker::entry::Message;
use broker::store::Entry;
use serde::{Deserialize, Serialize};

use crate::config::{anchored, Action, EffectsSettings};

/// Fields an agent may write on an effects bridge.
pub const FIELDS: &[&str] = &["action", "sha", "params", "request_id"];

/// Lines of `git log` and of `git diff --stat` shown to approvers.
const LOG_LINES: usize = 30;
const STAT_LINES: usize = 60;

/// What an approval of an effects entry binds, in this order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bound {
    pub action: String,
    pub repository: String,
    pub commit: String,
    pub argv: Vec<String>,
    pub params: BTreeMap<String, String>,
}

impl Bound {
    /// The canonical text an approval binds (and the run reads back).
    pub fn content(&self) -> String {
        serde_json::to_string_pretty(self).expect("strings serialize")
    }

    pub fn parse(content: &str) -> Result<Bound, String> {
        serde_json::from_str(content).map_err(|e| format!("not an effects request: {e}"))
    }
}

fn text<'a>(entry: &'a Entry, name: &str) -> Result<Option<&'a str>, String> {
    match entry.get(name) {
        None => Ok(None),
        Some(bytes) => std::str::from_utf8(bytes)
            .map(Some)
            .map_err(|_| format!("field `{name}` is not valid UTF-8")),
    }
}

/// Refuses any field but `allowed`, and any field given twice. `kind` names
/// the entry in the reason (`an effects`, `a rebuild`).
pub(crate) fn check_fields(entry: &Entry, allowed: &[&str], kind: &str) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for (name, _) in &entry.fields {
        if !allowed.contains(&name.as_str()) {
            return Err(format!(
                "unknown field `{}` ({kind} entry carries {})",
                name.escape_debug(),
                allowed.join(", ")
            ));
        }
        if !seen.insert(name.as_str()) {
            return Err(format!("field `{name}` appears twice"));
        }
    }
    // Shown to approvers among the request's fields: one short line, so it
    // cannot pose as other fields.
    if let Some(id) = entry.get("request_id") {
        let id = String::from_utf8_lossy(id);
        if id.len() > 200 || id.chars().any(char::is_control) {
            return Err("request_id must be one line of at most 200 bytes".into());
        }
    }
    Ok(())
}

/// The entry's `sha`: a full object id, lower-cased (whether it is a commit of
/// the repository is [`commit_exists`]'s to say).
pub(crate) fn sha_field(entry: &Entry) -> Result<String, String> {
    let sha = text(entry, "sha")?.ok_or("missing field `sha`")?;
    if !full_sha(sha) {
        return Err(format!(
            "`{}` is not a full commit id (40 or 64 hex digits)",
            sha.escape_debug()
        ));
    }
    Ok(sha.to_ascii_lowercase())
}

/// What `spec` resolves to as one object (`rev-parse --verify`), if anything.
async fn resolve(repo: &Path, spec: &str) -> Option<String> {
    git(
        repo,
        &["rev-parse", "--verify", "--quiet", "--end-of-options", spec],
    )
    .await
    .ok()
    .map(|s| s.trim().to_string())
}

/// Whether `sha` is a full object id.
fn full_sha(sha: &str) -> bool {
    (sha.len() == 40 || sha.len() == 64) && sha.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Validates an entry into what an approval binds, reading the repository.
pub async fn parse(settings: &EffectsSettings, entry: &Entry) -> Result<Message, String> {
    check_fields(entry, FIELDS, "an effects")?;
    let name = text(entry, "action")?.ok_or("missing field `action`")?;
    let action = settings
        .actions
        .get(name)
        .ok_or_else(|| format!("unknown action `{}`", name.escape_debug()))?;
    let sha = sha_field(entry)?;
    let params = params(action, text(entry, "params")?)?;
    crate::guard::check(&action.repo)?;
    commit_exists(&action.repo, &sha).await?;
    let bound = Bound {
        action: name.to_string(),
        repository: action.repo.display().to_string(),
        commit: sha.clone(),
        argv: action.argv(&sha, &params),
        params,
    };
    Ok(Message {
        channel_id: bound.action.clone(),
        content: bound.content(),
        request_id: text(entry, "request_id")?.map(str::to_string),
        context: Some(context(action, &sha).await),
        ..Message::default()
    })
}

/// The params an entry gives, checked against the action's declaration.
fn params(action: &Action, raw: Option<&str>) -> Result<BTreeMap<String, String>, String> {
    let given: BTreeMap<String, serde_json::Value> = match raw {
        None | Some("") => BTreeMap::new(),
        Some(raw) => {
            serde_json::from_str(raw).map_err(|e| format!("`params` is not a JSON object: {e}"))?
        }
    };
    let mut out = BTreeMap::new();
    for (name, value) in given {
        let Some(pattern) = action.params.get(&name) else {
            return Err(format!("param `{}` is not declared", name.escape_debug()));
        };
        let Some(value) = value.as_str() else {
            return Err(format!("param `{name}` is not a string"));
        };
        // Printable ASCII, and not an option: a value is one argument's text.
        if value.bytes().any(|b| !(0x20..0x7f).contains(&b)) {
            return Err(format!(
                "param `{name}` holds characters other than printable ASCII"
            ));
        }
        if value.starts_with('-') {
            return Err(format!("param `{name}` may not start with `-`"));
        }
        let re = anchored(pattern).map_err(|e| e.to_string())?;
        if !re.is_match(value) {
            return Err(format!(
                "param `{name}` = `{}` does not match its pattern",
                value.escape_debug()
            ));
        }
        out.insert(name, value.to_string());
    }
    if let Some(missing) = action.params.keys().find(|p| !out.contains_key(*p)) {
        return Err(format!("param `{missing}` is missing"));
    }
    Ok(out)
}

/// Longest one git call made to inspect a request may take.
const GIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Runs git in `repo` to inspect it: stdout on success. Nothing configured
/// outside the repository applies, replace refs are ignored (so what is shown
/// is the object that would be pushed), no signature program, external diff or
/// text conversion runs, and the call is killed after [`GIT_TIMEOUT`]. The
/// repository's own config is trusted only because [`crate::guard`] checked
/// that nobody but this service can write it.
pub async fn git(repo: &Path, args: &[&str]) -> Result<String, String> {
    git_within(repo, args, GIT_TIMEOUT).await
}

/// [`git`] with its own time limit (a checkout of a large tree takes longer).
pub async fn git_within(
    repo: &Path,
    args: &[&str],
    limit: std::time::Duration,
) -> Result<String, String> {
    let mut cmd = tokio::process::Command::new("git");
    cmd.arg("-C")
        .arg(repo)
        .args([
            "-c",
            "log.showSignature=false",
            "-c",
            "core.fsmonitor=false",
        ])
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_NO_REPLACE_OBJECTS", "1")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_OPTIONAL_LOCKS", "0")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(limit, cmd.output())
        .await
        .map_err(|_| {
            format!(
                "git {} took more than {} s",
                args.join(" "),
                limit.as_secs()
            )
        })?
        .map_err(|e| format!("cannot run git: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// Whether `sha` is, exactly, the id of a commit object in `repo`: resolved as
/// an object id of the repository's own hash length (a 64-hex string in a
/// SHA-1 repository would otherwise be looked up as a ref name, which can move).
pub async fn commit_exists(repo: &Path, sha: &str) -> Result<(), String> {
    let format = git(repo, &["rev-parse", "--show-object-format"])
        .await
        .map_err(|e| format!("{} is not a git repository: {e}", repo.display()))?;
    let len = match format.trim() {
        "sha1" => 40,
        "sha256" => 64,
        other => return Err(format!("unknown object format `{other}`")),
    };
    if sha.len() != len {
        return Err(format!(
            "`{sha}` is not a {} commit id ({len} hex digits)",
            format.trim()
        ));
    }
    let kind = git(repo, &["cat-file", "-t", sha])
        .await
        .map_err(|_| format!("`{sha}` is not an object in {}", repo.display()))?;
    if kind.trim() != "commit" {
        return Err(format!("`{sha}` is a {}, not a commit", kind.trim()));
    }
    // Resolved as an object id, never as a ref of that name.
    let spec = format!("{sha}^{{commit}}");
    if resolve(repo, &spec).await.as_deref() != Some(sha) {
        return Err(format!("`{sha}` does not resolve to itself as a commit"));
    }
    Ok(())
}

/// At most `max` lines of `text`, then a note of how many were left out.
pub(crate) fn capped(text: &str, max: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = lines[..lines.len().min(max)].join("\n");
    if lines.len() > max {
        out.push_str(&format!("\n({} more lines hidden)", lines.len() - max));
    }
    out
}

/// One labelled section of git output for approvers.
async fn section(out: &mut String, title: &str, repo: &Path, args: &[&str], max: usize) {
    out.push_str(&format!("\n\n{title}:\n"));
    out.push_str(&match git(repo, args).await {
        Ok(text) if text.trim().is_empty() => "(none)".to_string(),
        Ok(text) => capped(text.trim_end(), max),
        Err(e) => format!("(unavailable: {e})"),
    });
}

/// What approvers see about the commit, read from git (not bound: it is the
/// bridge's reading, labelled as such).
pub(crate) async fn context(action: &Action, sha: &str) -> String {
    let repo = &action.repo;
    let mut out =
        String::from("Read from git by the bridge (shown, not part of what is approved):\n");
    out.push_str(
        git(
            repo,
            &[
                "show",
                "-s",
                "--no-show-signature",
                "--format=author:  %an <%ae>%ndate:    %aI%nsubject: %s",
                sha,
            ],
        )
        .await
        .unwrap_or_else(|e| format!("(commit details unavailable: {e})"))
        .trim_end(),
    );
    section(&mut out, "remotes", repo, &["remote", "-v"], 10).await;
    match &action.target {
        Some(target) => {
            let resolved = resolve(repo, target)
                .await
                .unwrap_or_else(|| "(does not resolve)".into());
            out.push_str(&format!("\n\n{target} is {resolved}"));
            let ahead = format!("{target}..{sha}");
            let behind = format!("{sha}..{target}");
            section(
                &mut out,
                &format!("commits this adds to {target}"),
                repo,
                &[
                    "log",
                    "--oneline",
                    "--no-decorate",
                    "--no-show-signature",
                    &ahead,
                ],
                LOG_LINES,
            )
            .await;
            section(&mut out, &format!("commits in {target} that this does not contain (put in its place, they would be dropped)"), repo, &["log", "--oneline", "--no-decorate", "--no-show-signature", &behind], LOG_LINES).await;
            section(
                &mut out,
                &format!("files it changes against {target}"),
                repo,
                &["diff", "--stat", "--no-ext-diff", "--no-textconv", &ahead],
                STAT_LINES,
            )
            .await;
        }
        None => {
            section(
                &mut out,
                "files this commit changes",
                repo,
                &[
                    "show",
                    "--stat",
                    "--format=",
                    "--no-ext-diff",
                    "--no-textconv",
                    "--no-show-signature",
                    sha,
                ],
                STAT_LINES,
            )
            .await;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_full_object_ids_pass() {
        assert!(full_sha(&"a".repeat(40)));
        assert!(full_sha(&"0".repeat(64)));
        assert!(!full_sha("abc1234"));
        assert!(!full_sha(&"g".repeat(40)));
    }

    #[test]
    fn lists_say_how_much_is_hidden() {
        let text = (1..=5)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(capped(&text, 3), "1\n2\n3\n(2 more lines hidden)");
        assert_eq!(capped(&text, 5), text);
    }

    #[test]
    fn the_bound_text_reads_back() {
        let b = Bound {
            action: "push".into(),
            repository: "/srv/site".into(),
            commit: "a".repeat(40),
            argv: vec!["git".into(), "push".into()],
            params: BTreeMap::new(),
        };
        assert_eq!(Bound::parse(&b.content()).unwrap(), b);
    }
}
