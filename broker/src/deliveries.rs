//! Uncertain deliveries: sends that may have gone out (the platform never
//! answered), kept in `{bridge}:uncertain` ([`keys::uncertain`]) until an
//! operator says what happened.
//!
//! Invariants:
//! - An uncertain delivery is never retried by the outbox. Only
//!   [`reconcile`] with `not-delivered` puts it back, and then as a copy of the
//!   agent's entry on its own stream: it is parked for a fresh approval (or, on
//!   a bridge that needs none, delivered) like anything the agent writes.
//!   Reconciling never sends by itself.
//! - One reconciliation per delivery: removing it from the hash is the step
//!   that decides who reconciles; a second operator finds nothing.
//! - Each recording and each reconciliation is in the bridge's audit trail.

use serde::{Deserialize, Serialize};

use crate::audit;
use crate::clock::Clock;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::keys;
use crate::store::Store;

/// One uncertain delivery, as kept in the hash (JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Uncertain {
    /// `{stream}/{entry id}`: the delivery's key.
    pub id: String,
    pub bridge: String,
    pub stream: String,
    pub entry_id: String,
    #[serde(default)]
    pub agent: Option<String>,
    #[serde(default)]
    pub approval_id: Option<String>,
    pub destination: String,
    /// The whole-message digest of what was being sent.
    pub digest: String,
    pub reason: String,
    pub at: f64,
    /// The agent's entry, field by field, so it can be put back.
    pub fields: Vec<(String, String)>,
    /// What was being sent (an approver's edit included): what is put back,
    /// so a correction is not lost. Absent on deliveries recorded by older
    /// versions, whose agent's fields are put back as they are.
    #[serde(default)]
    pub sent: Option<crate::approval::edit::EditedMessage>,
}

impl Uncertain {
    /// The entry to put back: the agent's fields, with the destination,
    /// subject and content of the version that was being sent.
    fn entry_to_put_back(&self) -> Vec<(String, String)> {
        // A re-send's own seal is for the approval it re-sent: sealed afresh.
        let agents = self
            .fields
            .iter()
            .filter(|(k, _)| k != crate::approval::RESEND_OF && k != crate::approval::RESEND_SEAL);
        let Some(sent) = &self.sent else {
            return agents.cloned().collect();
        };
        let mut fields: Vec<(String, String)> = agents
            .filter(|(k, _)| !matches!(k.as_str(), "channel_id" | "subject" | "content"))
            .cloned()
            .collect();
        fields.push(("channel_id".into(), sent.channel_id.clone()));
        if let Some(subject) = &sent.subject {
            fields.push(("subject".into(), subject.clone()));
        }
        fields.push(("content".into(), sent.content.clone()));
        fields
    }
}

impl Uncertain {
    /// The audit event saying this delivery became uncertain.
    fn event(&self) -> audit::Event {
        let approval = self.approval_id.as_deref().unwrap_or("");
        audit::Event::new(&self.bridge, audit::Kind::Uncertain, approval, self.at)
            .with(audit::field::DELIVERY, &self.id)
            .with_opt(audit::field::AGENT, self.agent.as_deref())
            .with(audit::field::DESTINATION, &self.destination)
            .with(audit::field::DIGEST, &self.digest)
            .with(audit::field::REASON, &self.reason)
    }
}

/// Keeps an uncertain delivery until it is reconciled, and audits it.
pub async fn record(store: &mut Store, config: &Config, u: &Uncertain) -> Result<()> {
    let json = serde_json::to_string(u).map_err(|e| Error::internal(e.to_string()))?;
    let mut pipe = redis::pipe();
    pipe.hset(keys::uncertain(&u.bridge), &u.id, json).ignore();
    audit::prepare(&mut pipe);
    u.event().add_to(&mut pipe, config.audit.retention_days);
    pipe.query_async::<()>(&mut store.conn)
        .await
        .map_err(|e| Error::from_redis("HSET uncertain", e))
}

/// Every uncertain delivery of every bridge, oldest first.
pub async fn list(store: &mut Store, config: &Config) -> Result<Vec<Uncertain>> {
    let mut all = Vec::new();
    for bridge in config.bridges.keys() {
        let key = keys::uncertain(bridge);
        let map: std::collections::HashMap<String, String> =
            redis::AsyncCommands::hgetall(&mut store.conn, &key)
                .await
                .map_err(|e| Error::from_redis(&format!("HGETALL {key}"), e))?;
        for (id, json) in map {
            match serde_json::from_str::<Uncertain>(&json) {
                Ok(u) => all.push(u),
                Err(e) => tracing::warn!(key, id, error = %e, "unreadable uncertain delivery"),
            }
        }
    }
    all.sort_by(|a, b| a.at.total_cmp(&b.at).then_with(|| a.id.cmp(&b.id)));
    Ok(all)
}

/// What the operator found out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finding {
    /// It arrived: close it, send nothing.
    Delivered,
    /// It did not: put the agent's entry back for a fresh decision.
    NotDelivered,
}

impl Finding {
    pub fn parse(s: &str) -> Option<Finding> {
        match s {
            "delivered" => Some(Finding::Delivered),
            "not-delivered" => Some(Finding::NotDelivered),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Finding::Delivered => "delivered",
            Finding::NotDelivered => "not-delivered",
        }
    }
}

/// Settles an uncertain delivery. `by` is the operator's identity (`cli:NAME`):
/// on a bridge that asks for approval it must be one of its approvers, since
/// `not-delivered` puts the message back in front of them. Returns the new
/// entry id when the entry was put back.
pub async fn reconcile(
    store: &mut Store,
    config: &Config,
    clock: &Clock,
    id: &str,
    finding: Finding,
    evidence: &str,
    by: &str,
) -> Result<Option<String>> {
    if evidence.trim().is_empty() {
        return Err(Error::usage(
            "--evidence is required: say how you know (a message id, a log line, the recipient)",
        ));
    }
    let (bridge, u) = find(store, config, id).await?;
    let approval = &config.bridge(&bridge)?.approval;
    if approval.required && !approval.allows(by) {
        return Err(Error::refused(format!(
            "{by} is not on the approvers list of bridge `{bridge}`"
        )));
    }
    let key = keys::uncertain(&bridge);
    let removed: i64 = redis::AsyncCommands::hdel(&mut store.conn, &key, &u.id)
        .await
        .map_err(|e| Error::from_redis(&format!("HDEL {key}"), e))?;
    if removed == 0 {
        return Err(Error::refused(format!("{id} was reconciled meanwhile")));
    }
    let put_back = match finding {
        Finding::Delivered => None,
        Finding::NotDelivered => {
            // The approvers' version, when they had edited it: asked afresh,
            // never silently reverted to what the agent first wrote.
            let mut back = u.entry_to_put_back();
            // On a bridge that asks, the new card says what it re-sends: sealed
            // with the bridge's key, which agents cannot read.
            if let (true, Some(of)) = (approval.required, &u.approval_id) {
                let key = crate::approval::IdKey::load(store, &bridge).await?;
                let seal = key.seal_resend(
                    of,
                    &u.stream,
                    back.iter().map(|(k, v)| (k.as_str(), v.as_bytes())),
                );
                back.push((crate::approval::RESEND_OF.into(), of.clone()));
                back.push((crate::approval::RESEND_SEAL.into(), seal));
            }
            let fields: Vec<(&str, &[u8])> = back
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_bytes()))
                .collect();
            match store.xadd(&u.stream, &fields).await {
                Ok(new_id) => Some(new_id),
                Err(e) => {
                    // Not put back: it stays listed.
                    let json = serde_json::to_string(&u).unwrap_or_default();
                    let _: redis::RedisResult<i64> =
                        redis::AsyncCommands::hset(&mut store.conn, &key, &u.id, json).await;
                    return Err(e);
                }
            }
        }
    };
    // Put back on a bridge that asks: the approval it will be asked as, so the
    // trail leads from this one to the next.
    let next = match (&put_back, approval.required) {
        (Some(entry), true) => Some(
            crate::approval::IdKey::load(store, &bridge)
                .await?
                .id_for(&u.stream, entry),
        ),
        _ => None,
    };
    let event = audit::Event::new(
        &bridge,
        audit::Kind::Reconciled,
        u.approval_id.as_deref().unwrap_or(""),
        clock.now_secs_f64(),
    )
    .with(audit::field::DELIVERY, &u.id)
    .with(audit::field::OUTCOME, finding.as_str())
    .with(audit::field::EVIDENCE, evidence)
    .with(audit::field::BY, by)
    .with_opt(audit::field::ENTRY_ID, put_back.as_deref())
    .with_opt(audit::field::NEXT_APPROVAL, next.as_deref());
    audit::append(store, config, &[event]).await?;
    Ok(put_back)
}

/// The uncertain delivery `id` (or the one whose id ends with or starts with it).
async fn find(store: &mut Store, config: &Config, id: &str) -> Result<(String, Uncertain)> {
    let all = list(store, config).await?;
    let matching: Vec<&Uncertain> = match all.iter().find(|u| u.id == id) {
        Some(u) => vec![u],
        None => all
            .iter()
            .filter(|u| !id.is_empty() && (u.id.starts_with(id) || u.id.ends_with(id)))
            .collect(),
    };
    match matching.as_slice() {
        [one] => Ok((one.bridge.clone(), (*one).clone())),
        [] => Err(Error::refused(format!("no uncertain delivery `{id}`"))),
        many => Err(Error::refused(format!(
            "`{id}` matches {} uncertain deliveries; give the whole id",
            many.len()
        ))),
    }
}

/// `cowboy deliveries list`: one line per uncertain delivery.
pub fn render(all: &[Uncertain]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for u in all {
        let _ = writeln!(
            out,
            "{}  {}  bridge={} to={:?} agent={} approval={} reason={:?}",
            u.id,
            crate::clock::utc(u.at),
            u.bridge,
            crate::approval::display_safe(&u.destination),
            u.agent.as_deref().unwrap_or("-"),
            u.approval_id.as_deref().unwrap_or("-"),
            crate::approval::display_safe(&u.reason),
        );
    }
    out
}
