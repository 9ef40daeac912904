//! `cowboy audit`.

use crate::audit;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::store::Store;

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
