//! `slack`: delivers agent messages to Slack channels, carries inbound
//! messages to the inbox, and is an approval surface: a Block Kit card per
//! approval with Approve / Reject buttons, decided by a press, a reaction or
//! a thread reply. Events arrive over Socket Mode, so no public endpoint is
//! needed.
//!
//! # Layout
//!
//! - [`config`]: the bridge's own keys (tokens, workspace, channels, reactions).
//! - [`render`]: pure logic: agent text as rich text, the card, the modal.
//! - [`api`]: every Web API call, under Slack's rate limits ([`limits`]).
//! - [`send`]: the [`broker::bridge::Sender`].
//! - [`ingest`]: the Socket Mode event handler.

pub mod api;
pub mod config;
pub mod ingest;
pub mod limits;
pub mod render;
pub mod send;

use std::sync::Arc;

use broker::bridge::{Bridge, SendError};
use broker::config::read_secret;
use broker::error::ConfigError;
use broker::ingest::Ingest;
use broker::{Config, Error, Result, Shutdown};
use slack_morphism::prelude::*;

use crate::api::Api;
use crate::config::SlackSettings;
use crate::send::SlackSender;

/// A Slack bridge: its validated settings and tokens.
pub struct Slack {
    settings: SlackSettings,
    name: String,
    bot_token: String,
    app_token: String,
}

/// The bridge's settings, validated.
pub fn settings(config: &Config, name: &str) -> Result<SlackSettings> {
    let s: SlackSettings = config.bridge(name)?.settings(name)?;
    s.validate(name)?;
    Ok(s)
}

impl Slack {
    fn api(&self) -> Result<Api> {
        let client = api::client(self.settings.api_base.as_deref())
            .map_err(|e| Error::platform(false, format!("Slack client: {e}")))?;
        Ok(Api::new(client, &self.bot_token))
    }

    fn key(&self, key: &str) -> String {
        format!("bridges.{}.{key}", self.name)
    }
}

impl Bridge for Slack {
    const TYPE: &'static str = "slack";
    type Sender = SlackSender;

    fn load(config: &Config, name: &str) -> Result<Self> {
        let settings = settings(config, name)?;
        let bot_token = read_secret(
            &format!("bridges.{name}.bot_token_file"),
            &settings.bot_token_file,
        )?;
        let app_token = read_secret(
            &format!("bridges.{name}.app_token_file"),
            &settings.app_token_file,
        )?;
        Ok(Slack {
            settings,
            name: name.to_string(),
            bot_token,
            app_token,
        })
    }

    fn sender(&self, _name: &str) -> Result<SlackSender> {
        Ok(SlackSender::new(
            self.api()?,
            self.settings.mentions.clone(),
        ))
    }

    /// Socket Mode.
    async fn ingest(self, ingest: Ingest, shutdown: Shutdown) -> Result<()> {
        let api = self.api()?;
        // Who the bot is, and that its token belongs to the configured
        // workspace: a refusal here is the config's to fix (exit 78).
        let me = match api.whoami().await {
            Ok(me) => me,
            Err(SendError::Credentials(e)) => {
                return Err(ConfigError::invalid(self.key("bot_token_file"), e).into())
            }
            Err(e) => return Err(Error::platform(true, e.to_string())),
        };
        if me.team_id.0 != self.settings.team_id {
            return Err(ConfigError::invalid(
                self.key("team_id"),
                format!(
                    "the bot token belongs to workspace {}, not {}",
                    me.team_id.0, self.settings.team_id
                ),
            )
            .into());
        }
        let beats = ingest.keep_alive(shutdown.clone());
        let handler = Arc::new(ingest::Handler::new(
            ingest,
            self.settings.clone(),
            api.clone(),
            me.user_id.0.clone(),
            me.bot_id.map(|b| b.0),
        ));
        let environment = Arc::new(
            SlackClientEventsListenerEnvironment::new(api.client.clone())
                .with_error_handler(|err, _client, _state| {
                    // Not acknowledged: Slack sends the event again.
                    tracing::warn!(error = %err, "a Slack event was not handled; left unacknowledged");
                    HttpStatusCode::INTERNAL_SERVER_ERROR
                })
                .with_user_state(handler),
        );
        let config = SlackClientSocketModeConfig::new()
            .with_max_connections_count(1)
            .with_reconnect_timeout_in_seconds(5);
        let listener =
            SlackClientSocketModeListener::new(&config, environment, ingest::callbacks());
        let app_token = SlackApiToken::new(SlackApiTokenValue(self.app_token.clone()));
        // The app token is tried once here, so a wrong one stops the start
        // naming its key (the listener would only log and retry forever).
        let refused = |e| match api::classify("apps.connections.open", e) {
            SendError::Credentials(e) => ConfigError::invalid(self.key("app_token_file"), e).into(),
            SendError::Transient(e) => Error::platform(true, e),
            e => Error::platform(false, e.to_string()),
        };
        api.client
            .open_session(&app_token)
            .apps_connections_open(&SlackApiAppsConnectionOpenRequest::new())
            .await
            .map_err(refused)?;
        listener.listen_for(&app_token).await.map_err(refused)?;
        listener.start().await;
        tokio::select! {
            _ = shutdown.wait() => {}
            _ = beats => {}
        }
        listener.shutdown().await;
        Ok(())
    }

    /// `auth.test`.
    fn probe(&self, _name: &str) -> Result<Option<broker::ping::Probe>> {
        let sender = Arc::new(SlackSender::new(self.api()?, Vec::new()));
        Ok(Some(Box::new(move || {
            let sender = sender.clone();
            Box::pin(async move { sender.check().await })
        })))
    }
}
