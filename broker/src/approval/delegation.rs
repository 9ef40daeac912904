//! Delegation: while an approver is away, the answers of the person they named
//! count for them, until a time they set.
//!
//! One hash per requesting bridge, `{bridge}:delegations` (field: the
//! delegator's person; value: a [`Delegation`] as JSON), written only by that
//! bridge's outbox, asked by an operator through its request stream
//! ([`crate::request`]).
//!
//! Invariants:
//! - Only the delegator makes a delegation: the request stream proves the
//!   operator (`cli:NAME`), and NAME's person is the delegator. Nobody
//!   delegates someone else's approvals.
//! - The delegator is a person on the bridge's approvers; the delegate is a
//!   person of `[people]` other than the delegator; a delegation ends at
//!   `until`, at most [`MAX_SECONDS`] ahead, and `until = 0` ends it now.
//! - It is sealed with the bridge's key: one written by anyone else (a
//!   service password, a forger) counts for nobody.
//! - A delegate's answer counts as the delegator's person, so under a quorum
//!   delegator and delegate together count once. A person who approves on
//!   the bridge in their own right is never a delegate there (whichever of
//!   their identities answers), and a person is the delegate of one
//!   delegator at a time: one human never counts for two.
//! - A delegation covers the approvals parked after it was made (`at`,
//!   sealed): a reaction left on an older card before it existed, which a
//!   platform's catch-up may replay, never counts for the delegator.

use serde::{Deserialize, Serialize};

use super::IdKey;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::keys;
use crate::store::Store;

/// Longest a delegation may last (90 days).
pub const MAX_SECONDS: u64 = 90 * 24 * 3600;

/// One delegation, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delegation {
    /// The delegator's person.
    pub from: String,
    /// The delegate's person.
    pub to: String,
    /// Unix seconds it ends at.
    pub until: u64,
    /// The identity that asked (`cli:NAME`).
    pub by: String,
    /// When it was made.
    pub at: u64,
    /// [`IdKey::seal_delegation`] over from, to, until and at.
    pub seal: String,
}

/// Whether any identity of person `name` is on bridge `bridge`'s approvers:
/// from the start, or (`ever`) at some step of its escalation ladder. Only
/// the first may delegate (a step's approvers answer once it is taken, and
/// a delegation does not bring that forward); nobody of the second may be a
/// delegate (after the step they would count again, as themself).
fn approves(config: &Config, bridge: &str, name: &str, ever: bool) -> bool {
    let Some(person) = config.people.get(name) else {
        return false;
    };
    config.bridges.get(bridge).is_some_and(|b| {
        person.identities.iter().any(|i| match ever {
            true => b.approval.allows_ever(i),
            false => b.approval.allows(i),
        })
    })
}

/// Records (or, with `until = 0`, ends) the delegation asked by `identity`
/// on `bridge`: refused with the reason when the rules above forbid it.
pub async fn set(
    store: &mut Store,
    config: &Config,
    bridge: &str,
    identity: &str,
    to: &str,
    until: u64,
    now: u64,
) -> Result<std::result::Result<Option<Delegation>, String>> {
    let Some(from) = config.person_of(identity) else {
        return Ok(Err(format!(
            "`{identity}` is no person of [people]: only a person delegates, and only their own approvals"
        )));
    };
    let key = keys::delegations(bridge);
    if until == 0 {
        let _: i64 = redis::cmd("HDEL")
            .arg(&key)
            .arg(from)
            .query_async(&mut store.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("HDEL {key}"), e))?;
        return Ok(Ok(None));
    }
    if !approves(config, bridge, from, false) {
        return Ok(Err(format!(
            "{from} is not on bridge `{bridge}`'s approvers: nothing to delegate"
        )));
    }
    if !config.people.contains_key(to) {
        return Ok(Err(format!(
            "`{to}` is no person of [people]: a delegate must be someone the config knows"
        )));
    }
    if to == from {
        return Ok(Err(format!("{from} cannot delegate to themself")));
    }
    if approves(config, bridge, to, true) {
        return Ok(Err(format!(
            "{to} approves on bridge `{bridge}` in their own right: their answers count for themself only"
        )));
    }
    if let Some(other) = list(store, bridge)
        .await?
        .into_iter()
        .find(|d| d.to == to && d.from != from && d.until > now)
    {
        return Ok(Err(format!(
            "{to} answers for {} until {} already: one delegate answers for one person at a time",
            other.from, other.until
        )));
    }
    if until <= now || until > now + MAX_SECONDS {
        return Ok(Err(format!(
            "`until` must be in the future and at most {} days ahead",
            MAX_SECONDS / 86_400
        )));
    }
    let Some(id_key) = IdKey::existing(store, bridge).await? else {
        return Ok(Err(format!(
            "bridge `{bridge}` has no key yet (its outbox never ran)"
        )));
    };
    let d = Delegation {
        from: from.to_string(),
        to: to.to_string(),
        until,
        by: identity.to_string(),
        at: now,
        seal: id_key.seal_delegation(from, to, until, now),
    };
    let json = serde_json::to_string(&d).map_err(|e| Error::internal(e.to_string()))?;
    let _: i64 = redis::cmd("HSET")
        .arg(&key)
        .arg(from)
        .arg(&json)
        .query_async(&mut store.conn)
        .await
        .map_err(|e| Error::from_redis(&format!("HSET {key}"), e))?;
    Ok(Ok(Some(d)))
}

/// The delegations `identity` could answer for on `bridge` at time `at`, on
/// an approval parked at `parked_at`, seals not checked: running, naming its
/// person, made in a second before the approval was parked, from a delegator who
/// approves there; none for a person who approves there in their own right.
async fn candidates(
    store: &mut Store,
    config: &Config,
    bridge: &str,
    identity: &str,
    at: f64,
    parked_at: u64,
) -> Result<Vec<Delegation>> {
    let Some(person) = config.person_of(identity) else {
        return Ok(Vec::new());
    };
    if approves(config, bridge, person, true) {
        return Ok(Vec::new());
    }
    Ok(list(store, bridge)
        .await?
        .into_iter()
        .filter(|d| {
            d.to == person
                && (d.until as f64) > at
                // Strictly after: `at` and `parked_at` are whole seconds, and
                // one parked in the delegation's own second may predate it.
                && d.at < parked_at
                && approves(config, bridge, &d.from, false)
        })
        .collect())
}

/// The delegation `identity` answers under on `bridge` at time `at`, on an
/// approval parked at `parked_at`: the one sealed, running delegation to its
/// person (see the module invariants). `None` for everyone else, and when
/// more than one would do (which [`set`] never records): no guessing whom an
/// answer counts for.
pub async fn acting_for(
    store: &mut Store,
    config: &Config,
    bridge: &str,
    identity: &str,
    at: f64,
    parked_at: u64,
) -> Result<Option<Delegation>> {
    let found = candidates(store, config, bridge, identity, at, parked_at).await?;
    if found.is_empty() {
        return Ok(None);
    }
    let Some(id_key) = IdKey::existing(store, bridge).await? else {
        return Ok(None);
    };
    let mut sealed: Vec<Delegation> = found
        .into_iter()
        .filter(|d| {
            super::same_secret(
                &id_key.seal_delegation(&d.from, &d.to, d.until, d.at),
                &d.seal,
            )
        })
        .collect();
    match sealed.len() {
        1 => Ok(sealed.pop()),
        _ => Ok(None),
    }
}

/// Whether a surface should hand `identity`'s answer on as a delegate's: a
/// running delegation names it (the surface cannot check seals; the asking
/// bridge's outbox does).
pub async fn may_be_delegate(
    store: &mut Store,
    config: &Config,
    bridge: &str,
    identity: &str,
    at: f64,
    parked_at: u64,
) -> Result<bool> {
    Ok(!candidates(store, config, bridge, identity, at, parked_at)
        .await?
        .is_empty())
}

/// The delegations recorded on `record`'s bridge that cover it at `now`
/// (running, and made in a second before it was parked), as lines for
/// approvers ("dep answers for boss until …"). As recorded: the outbox
/// checks each one's seal before an answer counts.
pub async fn covering(store: &mut Store, record: &super::Record, now: u64) -> Result<Vec<String>> {
    let all = list(store, record.source()).await?;
    Ok(all
        .into_iter()
        .filter(|d| d.until > now && d.at < record.created_at)
        .map(|d| {
            format!(
                "{} answers for {} until {}",
                d.to,
                d.from,
                crate::clock::utc(d.until as f64)
            )
        })
        .collect())
}

/// Every delegation recorded on `bridge` (running or not), by delegator; one
/// filed under another person's field than its own is left out.
pub async fn list(store: &mut Store, bridge: &str) -> Result<Vec<Delegation>> {
    let key = keys::delegations(bridge);
    let raw: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(&key)
        .query_async(&mut store.conn)
        .await
        .map_err(|e| Error::from_redis(&format!("HGETALL {key}"), e))?;
    let mut all: Vec<Delegation> = raw
        .into_iter()
        .filter_map(|(field, v)| {
            serde_json::from_str::<Delegation>(&v)
                .ok()
                .filter(|d| d.from == field)
        })
        .collect();
    all.sort_by(|a, b| a.from.cmp(&b.from));
    Ok(all)
}
