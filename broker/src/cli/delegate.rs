//! `cowboy approvals delegate` and `delegations`: an approver hands their
//! answers to another person while away, through each requesting bridge's
//! outbox (see [`crate::approval::delegation`] for the rules).

use crate::approval::delegation;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::identity::Identity;
use crate::request::{self, Requester};
use crate::store::Store;

/// What `delegate` is asked.
pub struct DelegateArgs {
    /// Given only to be checked: it must be the operator's own person.
    pub from: Option<String>,
    pub to: Option<String>,
    /// Unix seconds, or a time from now (`90m`, `8h`, `3d`).
    pub until: Option<String>,
    /// Take the delegation back.
    pub end: bool,
    pub bridge: Option<String>,
}

/// `until` as unix seconds: an absolute time, or `N` followed by s, m, h or d
/// from `now`.
pub fn parse_until(text: &str, now: u64) -> Result<u64> {
    let bad = || {
        Error::usage(format!(
            "--until `{text}`: give unix seconds or a time from now such as 90m, 8h or 3d"
        ))
    };
    let text = text.trim();
    if let Ok(unix) = text.parse::<u64>() {
        return Ok(unix);
    }
    crate::text::duration_secs(text)
        .and_then(|s| s.checked_add(now))
        .ok_or_else(bad)
}

/// Asks every requesting bridge the operator approves on (or `--bridge`) to
/// record the delegation; one line per bridge.
pub async fn delegate(
    store: &mut Store,
    config: &Config,
    operator: &str,
    a: &DelegateArgs,
    now: u64,
) -> Result<String> {
    if config.operators.is_empty() {
        return Err(Error::usage(
            "delegation needs [operators]: the delegator is proven by their own Redis user",
        ));
    }
    let identity = Identity::cli(operator).to_string();
    let Some(me) = config.person_of(&identity) else {
        return Err(Error::usage(format!(
            "`{identity}` is no person of [people]: only a person delegates"
        )));
    };
    if let Some(from) = a.from.as_deref().filter(|f| *f != me) {
        return Err(Error::usage(format!(
            "you are {me}: nobody delegates {from}'s approvals but {from}"
        )));
    }
    let (to, until) = match (a.end, &a.to, &a.until) {
        (true, _, _) => (String::new(), 0),
        (false, Some(to), Some(until)) => (to.clone(), parse_until(until, now)?),
        _ => return Err(Error::usage("give --to PERSON and --until TIME, or --end")),
    };
    let bridges: Vec<&str> = config
        .bridges
        .iter()
        .filter(|(name, b)| {
            b.approval.required && a.bridge.as_deref().is_none_or(|only| only == name.as_str())
        })
        .map(|(name, _)| name.as_str())
        .collect();
    if bridges.is_empty() {
        return Err(Error::usage("no bridge that asks for approval matches"));
    }
    let requester = Requester::Operator(operator.to_string());
    let mut out = String::new();
    let mut done = 0;
    for bridge in bridges {
        let line = match request::delegate(store, &requester, bridge, &identity, &to, until).await {
            Ok((from, _, 0)) => {
                done += 1;
                format!("{bridge}: {from}'s answers are their own again\n")
            }
            Ok((from, to, until)) => {
                done += 1;
                format!(
                    "{bridge}: {to}'s answers count for {from} until {until} (in {})\n",
                    human(until.saturating_sub(now))
                )
            }
            Err(Error::Operator {
                kind: crate::error::Operator::Refused,
                message,
            }) if a.bridge.is_none() => format!("{bridge}: not delegated: {message}\n"),
            Err(e) => return Err(e),
        };
        out.push_str(&line);
    }
    match done {
        0 => Err(Error::refused(out.trim_end().to_string())),
        _ => Ok(out),
    }
}

/// `cowboy approvals delegations`: every recorded delegation, by bridge.
pub async fn delegations(store: &mut Store, config: &Config, now: u64) -> Result<String> {
    let mut out = String::new();
    for (bridge, b) in &config.bridges {
        if !b.approval.required {
            continue;
        }
        for d in delegation::list(store, bridge).await? {
            let state = match d.until > now {
                true => format!("until {} (in {})", d.until, human(d.until - now)),
                false => format!("ended {}", d.until),
            };
            out.push_str(&format!(
                "{bridge}: {} answers for {} {state}, set by {}\n",
                d.to, d.from, d.by
            ));
        }
    }
    if out.is_empty() {
        out.push_str("no delegations\n");
    }
    Ok(out)
}

fn human(secs: u64) -> String {
    match secs {
        s if s >= 86_400 => format!("{}d {}h", s / 86_400, s % 86_400 / 3600),
        s if s >= 3600 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        s => format!("{}m {}s", s / 60, s % 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn until_is_absolute_or_from_now() {
        assert_eq!(parse_until("1900000000", 5).unwrap(), 1_900_000_000);
        assert_eq!(parse_until("90m", 100).unwrap(), 100 + 5400);
        assert_eq!(parse_until("3d", 0).unwrap(), 3 * 86_400);
        assert!(parse_until("soon", 0).is_err());
        assert!(parse_until("5w", 0).is_err());
        assert!(parse_until("99999999999999999d", 0).is_err());
    }
}
