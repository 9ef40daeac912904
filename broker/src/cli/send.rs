//! `cowboy send`: an entry written as an agent would.

use crate::config::Config;
use crate::error::{Error, Result};
use crate::keys;
use crate::store::Store;

/// What `cowboy send` writes.
#[derive(Debug, Default, clap::Args)]
pub struct SendArgs {
    /// The bridge whose outbox it goes to.
    #[arg(long)]
    pub bridge: String,
    /// Write to the agent's own stream `{agent}:{bridge}:outbox`.
    #[arg(long)]
    pub agent: Option<String>,
    /// The destination (`channel_id`).
    #[arg(long)]
    pub channel: String,
    #[arg(long)]
    pub content: String,
    #[arg(long)]
    pub subject: Option<String>,
    #[arg(long)]
    pub reply_to: Option<String>,
    #[arg(long)]
    pub request_id: Option<String>,
}

/// `cowboy send`: XADD an outbox entry as an agent would. Returns the entry id.
pub async fn send(store: &mut Store, config: &Config, a: &SendArgs) -> Result<String> {
    config.bridge(&a.bridge)?;
    if let Some(agent) = &a.agent {
        if !config.agents.contains_key(agent) {
            return Err(Error::usage(format!("no agent `{agent}` in the config")));
        }
    }
    let mut fields: Vec<(&str, &[u8])> = vec![
        ("channel_id", a.channel.as_bytes()),
        ("content", a.content.as_bytes()),
    ];
    for (k, v) in [
        ("subject", &a.subject),
        ("reply_to", &a.reply_to),
        ("request_id", &a.request_id),
    ] {
        if let Some(v) = v {
            fields.push((k, v.as_bytes()));
        }
    }
    let stream = keys::outbox_for(a.agent.as_deref(), &a.bridge);
    let id = store.xadd(&stream, &fields).await?;
    Ok(format!("{stream} {id}\n"))
}
