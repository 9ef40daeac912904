//! `[bridges.NAME]` settings of a Slack bridge (beside the common keys).

use std::path::PathBuf;

use broker::error::ConfigError;
use serde::Deserialize;

/// The Slack bridge's own keys; any other key fails the start-up.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlackSettings {
    /// File holding the bot token (`xoxb-…`): the Web API.
    pub bot_token_file: PathBuf,
    /// File holding the app-level token (`xapp-…`, scope
    /// `connections:write`): Socket Mode, so no public endpoint is needed.
    pub app_token_file: PathBuf,
    /// The workspace (`T…`) the app is installed in; the bot token must
    /// belong to it. Events and presses Slack delivers for another workspace
    /// are ignored, and a press or a modal from a person of another
    /// workspace decides nothing. In a Slack Connect channel shared with
    /// another workspace its people's messages are still carried (Slack
    /// delivers them as this workspace's events), and only configured
    /// approvers can decide.
    pub team_id: String,
    /// Channel ids (`C…`, `G…`) the ingest listens in: messages there become
    /// inbox entries.
    #[serde(default)]
    pub channels: Vec<String>,
    /// Also carry direct messages to the bot.
    #[serde(default)]
    pub dms: bool,
    /// Reaction names that approve (skin tones ignored).
    #[serde(default = "default_approve")]
    pub approve_emoji: Vec<String>,
    /// Reaction names that reject.
    #[serde(default = "default_reject")]
    pub reject_emoji: Vec<String>,
    /// Another Slack-compatible Web API endpoint (tests, proxies), e.g.
    /// `http://127.0.0.1:8080/api`. Plain `http://` only to a loopback
    /// address: the bot token travels with every request.
    #[serde(default)]
    pub api_base: Option<String>,
    /// What agent messages may ping: any of `users` (`<@U…>`), `groups`
    /// (`<!subteam^S…>`) and `everyone` (`<!channel>`, `<!here>`,
    /// `<!everyone>`). Anything else is shown as written. Approval cards never
    /// ping anyone, whatever this says.
    #[serde(default = "default_mentions")]
    pub mentions: Vec<String>,
}

/// The values `mentions` accepts.
pub const MENTION_KINDS: &[&str] = &["users", "groups", "everyone"];

fn default_mentions() -> Vec<String> {
    vec!["users".to_string()]
}

fn default_approve() -> Vec<String> {
    vec![
        "white_check_mark".to_string(),
        "heavy_check_mark".to_string(),
    ]
}

fn default_reject() -> Vec<String> {
    vec!["x".to_string()]
}

/// Whether `id` is a Slack id with one of `prefixes`: the prefix letter,
/// then upper-case letters and digits only (how Slack spells every id).
pub fn is_slack_id(id: &str, prefixes: &[char]) -> bool {
    let mut chars = id.chars();
    chars.next().is_some_and(|c| prefixes.contains(&c))
        && id.len() >= 3
        && id.len() <= 24
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
}

/// Whether `url` is plain http to this machine: its host (no user part,
/// which would make what follows `@` the host) is a loopback address.
pub fn is_loopback_http(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('@') {
        return false;
    }
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.split(':').next().unwrap_or(""),
    };
    matches!(host, "127.0.0.1" | "localhost" | "::1")
}

impl SlackSettings {
    /// Checks what serde cannot, naming the key.
    pub fn validate(&self, bridge: &str) -> Result<(), ConfigError> {
        let invalid = |key: String, message: String| Err(ConfigError::Invalid { key, message });
        if !is_slack_id(&self.team_id, &['T', 'E']) {
            return invalid(
                format!("bridges.{bridge}.team_id"),
                format!("`{}` is not a Slack workspace id (T…)", self.team_id),
            );
        }
        for (i, c) in self.channels.iter().enumerate() {
            if !is_slack_id(c, &['C', 'G']) {
                return invalid(
                    format!("bridges.{bridge}.channels[{i}]"),
                    format!("`{c}` is not a Slack channel id (C… or G…, not a #name)"),
                );
            }
        }
        if let Some(v) = &self.api_base {
            if !(v.starts_with("https://") || is_loopback_http(v)) {
                return invalid(
                    format!("bridges.{bridge}.api_base"),
                    format!("`{v}` is not an https:// URL (plain http only to loopback: the token travels with each request)"),
                );
            }
        }
        for (i, m) in self.mentions.iter().enumerate() {
            if !MENTION_KINDS.contains(&m.as_str()) {
                return invalid(
                    format!("bridges.{bridge}.mentions[{i}]"),
                    format!("`{m}` is not one of {}", MENTION_KINDS.join(", ")),
                );
            }
        }
        if self.approve_emoji.is_empty() || self.reject_emoji.is_empty() {
            return invalid(
                format!("bridges.{bridge}.approve_emoji"),
                "approve_emoji and reject_emoji need at least one reaction name each".into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_one_spelling() {
        assert!(is_slack_id("C0123ABCD", &['C', 'G']));
        for bad in [
            "#general",
            "c0123abcd",
            "C0123 ABC",
            "D0123ABCD",
            "C",
            "C0123ABCD\n",
        ] {
            assert!(!is_slack_id(bad, &['C', 'G']), "{bad}");
        }
    }

    #[test]
    fn plain_http_only_to_this_machine() {
        for ok in [
            "http://127.0.0.1:8080/api",
            "http://localhost/api",
            "http://[::1]:9/api",
        ] {
            assert!(is_loopback_http(ok), "{ok}");
        }
        for bad in [
            "http://127.0.0.1:@proxy.example.net/api",
            "http://127.0.0.1.example.net/api",
            "http://localhost@evil/api",
            "https://127.0.0.1/api",
            "http://example.org/api",
        ] {
            assert!(!is_loopback_http(bad), "{bad}");
        }
    }
}
