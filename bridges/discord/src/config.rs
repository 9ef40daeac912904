//! `[bridges.NAME]` settings of a Discord bridge (beside the common keys).

use std::path::PathBuf;

use broker::error::ConfigError;
use serde::Deserialize;

/// The Discord bridge's own keys; any other key fails the start-up.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiscordSettings {
    /// File holding the bot token.
    pub token_file: PathBuf,
    /// Channel ids the ingest listens in (messages become inbox entries).
    #[serde(default)]
    pub channels: Vec<String>,
    /// Also carry direct messages to the bot.
    #[serde(default)]
    pub dms: bool,
    /// Reactions that approve (skin tones and presentation selectors ignored).
    #[serde(default = "default_approve")]
    pub approve_emoji: Vec<String>,
    /// Reactions that reject.
    #[serde(default = "default_reject")]
    pub reject_emoji: Vec<String>,
    /// Another Discord-compatible REST endpoint (tests, proxies), e.g.
    /// `http://127.0.0.1:8080`. Requests go there instead of discord.com, and the
    /// client-side rate limiter is disabled, since with serenity 0.12.5 it would
    /// still ask discord.com; the endpoint answers 429s itself.
    #[serde(default)]
    pub api_base: Option<String>,
    /// Another gateway websocket URL (tests), e.g. `ws://127.0.0.1:8081`.
    #[serde(default)]
    pub gateway_url: Option<String>,
    /// What agent messages may ping: any of `users`, `roles`, `everyone` (which
    /// also covers `@here`). Approval cards never ping anyone, whatever this says.
    #[serde(default = "default_mentions")]
    pub mentions: Vec<String>,
}

/// The values `mentions` accepts.
pub const MENTION_KINDS: &[&str] = &["users", "roles", "everyone"];

fn default_mentions() -> Vec<String> {
    vec!["users".to_string()]
}

fn default_approve() -> Vec<String> {
    vec!["✅".to_string()]
}

fn default_reject() -> Vec<String> {
    vec!["❌".to_string()]
}

impl DiscordSettings {
    /// Checks what serde cannot, naming the key.
    pub fn validate(&self, bridge: &str) -> Result<(), ConfigError> {
        for (i, c) in self.channels.iter().enumerate() {
            if c.parse::<u64>().map_or(true, |n| n == 0) {
                return Err(ConfigError::Invalid {
                    key: format!("bridges.{bridge}.channels[{i}]"),
                    message: format!("`{c}` is not a Discord channel id"),
                });
            }
        }
        for (key, value) in [
            ("api_base", &self.api_base),
            ("gateway_url", &self.gateway_url),
        ] {
            if let Some(v) = value {
                let ok = ["http://", "https://", "ws://", "wss://"]
                    .iter()
                    .any(|p| v.starts_with(p));
                if !ok {
                    return Err(ConfigError::Invalid {
                        key: format!("bridges.{bridge}.{key}"),
                        message: format!("`{v}` is not a URL"),
                    });
                }
            }
        }
        for (i, m) in self.mentions.iter().enumerate() {
            if !MENTION_KINDS.contains(&m.as_str()) {
                return Err(ConfigError::Invalid {
                    key: format!("bridges.{bridge}.mentions[{i}]"),
                    message: format!("`{m}` is not one of {}", MENTION_KINDS.join(", ")),
                });
            }
        }
        if self.approve_emoji.is_empty() || self.reject_emoji.is_empty() {
            return Err(ConfigError::Invalid {
                key: format!("bridges.{bridge}.approve_emoji"),
                message: "approve_emoji and reject_emoji need at least one emoji each".into(),
            });
        }
        Ok(())
    }
}
