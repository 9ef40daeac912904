//! What became of one request, from the notices on the agent's inboxes.
//!
//! Pure: the notices are read elsewhere ([`crate::gate`]). The agent reads no
//! approval record (its ACL forbids `approval:*`), so everything here comes
//! from notices, which the broker writes for entries sent with `notices =
//! all` (as `cowboy mcp` sends them): `parked`, then one outcome.
//!
//! Invariants:
//! - An outcome notice, once seen, decides the state; a later outcome (an
//!   entry sent twice under one request id) replaces an earlier one.
//! - Without any notice the state is `queued` when this server wrote the
//!   request, else `unknown`: the agent cannot read its outbox to tell.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

/// One notice's fields, as written by the broker (see `broker::entry::Notice`).
pub type Fields = HashMap<String, String>;

/// The state words `status` and `wait` answer with.
pub mod state {
    pub const QUEUED: &str = "queued";
    pub const AWAITING_APPROVAL: &str = "awaiting_approval";
    pub const DELIVERED: &str = "delivered";
    pub const UNKNOWN: &str = "unknown";
}

/// The status of `request_id` given the notices about it, oldest first;
/// `written` says whether this server wrote it (see the module invariants).
pub fn status(request_id: &str, notices: &[Fields], written: bool) -> Value {
    let mut out = Map::new();
    out.insert("request_id".into(), json!(request_id));
    let mut parked: Option<&Fields> = None;
    // The latest count told; a `parked` notice without one (a card asked
    // for again) does not reset it.
    let mut counted: u64 = 0;
    let mut outcome: Option<&Fields> = None;
    let mut edited: Option<&Fields> = None;
    for n in notices {
        match n.get("status").map(String::as_str) {
            Some("parked") => {
                parked = Some(n);
                if let Some(c) = n.get("approvals").and_then(|a| a.parse().ok()) {
                    counted = c;
                }
            }
            Some("edited") => edited = Some(n),
            Some(_) => outcome = Some(n),
            None => {}
        }
    }
    let copy = |out: &mut Map<String, Value>, n: &Fields, names: &[&str]| {
        for name in names {
            if let Some(v) = n.get(*name).filter(|v| !v.is_empty()) {
                out.insert((*name).to_string(), json!(v));
            }
        }
    };
    // An edit is told beside its delivery; alone (a broker that wrote only
    // `edited`) it still means sent.
    let outcome = outcome.or(edited);
    match outcome {
        Some(n) => {
            let word = match n.get("status").map(String::as_str) {
                Some("edited") => state::DELIVERED,
                Some(other) => other,
                None => state::UNKNOWN,
            };
            out.insert("state".into(), json!(word));
            copy(
                &mut out,
                n,
                &[
                    "reason",
                    "external_id",
                    "approval_id",
                    "approver",
                    "exit_code",
                    "output",
                ],
            );
            if let Some(e) = edited {
                let mut edit = Map::new();
                copy(
                    &mut edit,
                    e,
                    &["original_sha256", "sent_sha256", "approver", "reason"],
                );
                out.insert("edited".into(), Value::Object(edit));
            }
        }
        None => match parked {
            Some(p) => {
                out.insert("state".into(), json!(state::AWAITING_APPROVAL));
                copy(&mut out, p, &["approval_id"]);
                let number = |name: &str| p.get(name).and_then(|v| v.parse::<u64>().ok());
                if let Some(since) = number("parked_at") {
                    out.insert("since".into(), json!(since));
                }
                // 0 is "no deadline".
                let deadline = number("expires_at").filter(|&d| d > 0);
                out.insert("deadline".into(), json!(deadline));
                if let Some(q) = number("quorum") {
                    out.insert("approvals_needed".into(), json!(q));
                }
                out.insert("approvals_so_far".into(), json!(counted));
            }
            None => {
                let word = if written {
                    state::QUEUED
                } else {
                    state::UNKNOWN
                };
                out.insert("state".into(), json!(word));
                if !written {
                    out.insert(
                        "reason".into(),
                        json!("no notice about this request id yet, and this server did not write it (an earlier session may have: it is queued then)"),
                    );
                }
            }
        },
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(pairs: &[(&str, &str)]) -> Fields {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn each_stage_of_a_request() {
        assert_eq!(status("r", &[], true)["state"], "queued");
        assert_eq!(status("r", &[], false)["state"], "unknown");
        let parked = notice(&[
            ("status", "parked"),
            ("approval_id", "a"),
            ("parked_at", "100"),
            ("expires_at", "0"),
            ("quorum", "2"),
        ]);
        let s = status("r", std::slice::from_ref(&parked), true);
        assert_eq!(s["state"], "awaiting_approval");
        assert_eq!(s["since"], 100);
        assert_eq!(s["deadline"], Value::Null);
        assert_eq!(
            (s["approvals_needed"].clone(), s["approvals_so_far"].clone()),
            (json!(2), json!(0))
        );
        let one = notice(&[("status", "parked"), ("quorum", "2"), ("approvals", "1")]);
        let s = status("r", &[parked.clone(), one.clone()], true);
        assert_eq!(s["approvals_so_far"], 1);
        let s = status("r", &[parked.clone(), one, parked.clone()], true);
        assert_eq!(
            s["approvals_so_far"], 1,
            "a card asked for again resets no count"
        );
        let delivered = notice(&[("status", "delivered"), ("external_id", "x-1")]);
        let s = status("r", &[parked.clone(), delivered], true);
        assert_eq!(s["state"], "delivered");
        assert_eq!(s["external_id"], "x-1");
        let rejected = notice(&[("status", "rejected"), ("reason", "no")]);
        let s = status("r", &[parked, rejected], true);
        assert_eq!(
            (s["state"].as_str(), s["reason"].as_str()),
            (Some("rejected"), Some("no"))
        );
    }

    #[test]
    fn an_edit_is_told_with_its_delivery() {
        let edited = notice(&[
            ("status", "edited"),
            ("original_sha256", "o"),
            ("sent_sha256", "s"),
        ]);
        let delivered = notice(&[("status", "delivered"), ("external_id", "x")]);
        let s = status("r", &[edited.clone(), delivered], true);
        assert_eq!(s["state"], "delivered");
        assert_eq!(s["edited"]["sent_sha256"], "s");
        assert_eq!(status("r", &[edited], true)["state"], "delivered");
    }
}
