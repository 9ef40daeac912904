//! `cowboy deliveries list|reconcile`.

use crate::clock::Clock;
use crate::config::Config;
use crate::deliveries;
use crate::error::{Error, Result};
use crate::identity::Identity;
use crate::store::Store;

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
