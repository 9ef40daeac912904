//! `discord`: delivers agent messages to Discord channels, carries inbound
//! messages to the inbox, and is an approval surface: a card per approval,
//! decided by a reaction or a reply.
//!
//! # Layout
//!
//! - [`config`]: the bridge's own keys (`token_file`, `channels`, emoji, endpoints).
//! - [`render`]: pure logic: splitting, nonces, the card, verdicts.
//! - [`rest`]: every REST call, under Discord's rate limits.
//! - [`send`]: the [`broker::Sender`] over Discord's REST API.
//! - [`ingest`]: the gateway event handler.
//! - [`perms`]: what the bot may do where, so refused calls are not made.

pub mod config;
pub mod ingest;
pub mod perms;
pub mod render;
pub mod rest;
pub mod send;

use std::sync::Arc;

use broker::bridge::Bridge;
use broker::config::read_secret;
use broker::ingest::Ingest;
use broker::{Config, Error, Result, Shutdown};
use serenity::http::{Http, HttpBuilder};

use crate::config::DiscordSettings;
use crate::send::DiscordSender;

/// A Discord bridge: its validated settings and bot token.
pub struct Discord {
    settings: DiscordSettings,
    token: String,
}

/// The bridge's settings, validated.
pub fn settings(config: &Config, name: &str) -> Result<DiscordSettings> {
    let s: DiscordSettings = config.bridge(name)?.settings(name)?;
    s.validate(name)?;
    Ok(s)
}

/// The REST client: discord.com, or `api_base`. serenity's limiter is off
/// (0.12.5's would still call discord.com with `api_base`); [`rest::Rest`]
/// keeps the limits on every path instead.
pub fn rest(s: &DiscordSettings, token: &str) -> Result<rest::Rest> {
    // A client that cannot be built (no TLS backend) fails the start-up:
    // a default client would quietly lack what the bridge asked for.
    let client = reqwest::Client::builder()
        .use_rustls_tls()
        .build()
        .map_err(|e| Error::internal(format!("Discord HTTP client: {e}")))?;
    Ok(rest::Rest::new(Arc::new(http(s, token, &client)), client))
}

/// serenity's HTTP client on `client`, for the REST calls and the gateway's
/// own start-up calls alike.
fn http(s: &DiscordSettings, token: &str, client: &reqwest::Client) -> Http {
    let mut builder = HttpBuilder::new(token)
        .client(client.clone())
        .ratelimiter_disabled(true);
    if let Some(base) = &s.api_base {
        builder = builder.proxy(base.clone());
    }
    builder.build()
}

impl Bridge for Discord {
    const TYPE: &'static str = "discord";
    type Sender = DiscordSender;

    fn load(config: &Config, name: &str) -> Result<Self> {
        let settings = settings(config, name)?;
        let token = read_secret(&format!("bridges.{name}.token_file"), &settings.token_file)?;
        Ok(Discord { settings, token })
    }

    fn sender(&self, _name: &str) -> Result<DiscordSender> {
        Ok(DiscordSender::new(
            Arc::new(rest(&self.settings, &self.token)?),
            self.settings.mentions.clone(),
        ))
    }

    /// The gateway connection.
    async fn ingest(self, ingest: Ingest, shutdown: Shutdown) -> Result<()> {
        let s = self.settings;
        let rest = rest(&s, &self.token)?;
        let http = http(&s, &self.token, rest.client());
        let beats = ingest.keep_alive(shutdown.clone());
        let name = ingest.name().to_string();
        let handler = ingest::Handler::new(ingest, s.clone(), rest, shutdown.clone());
        let client = serenity::client::ClientBuilder::new_with_http(http, ingest::intents(s.dms))
            .event_handler(handler)
            .await
            .map_err(|e| Error::platform(true, format!("Discord client: {e}")))?;
        if let Some(url) = &s.gateway_url {
            *client.ws_url.lock().await = url.clone();
        }
        ingest::run(client, beats, name, shutdown).await
    }

    /// `users/@me`.
    fn probe(&self, _name: &str) -> Result<Option<broker::ping::Probe>> {
        let sender = Arc::new(DiscordSender::new(
            Arc::new(rest(&self.settings, &self.token)?),
            Vec::new(),
        ));
        Ok(Some(Box::new(move || {
            let sender = sender.clone();
            Box::pin(async move { sender.check().await })
        })))
    }
}
