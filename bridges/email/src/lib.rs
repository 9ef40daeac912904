//! `email`: delivers agent messages over SMTP, ingests mail over IMAP IDLE, and
//! lets approvers decide by replying to the approval email.
//!
//! # Layout
//!
//! - [`config`]: the bridge's own keys (`from`, `smtp`, `imap`, anti-spoofing).
//! - [`send`]: the [`broker::Sender`] over SMTP and the approval email.
//! - [`ingest`]: the IMAP follower, answers and inbound mail.
//! - [`tls`]: the crypto provider, private CAs, loopback-only plaintext.
//! - [`verdict`]: pure logic: verdicts, `Authentication-Results`, Message-IDs.

pub mod answer;
pub mod authres;
pub mod body;
pub mod config;
pub mod dkim;
pub mod ingest;
pub mod send;
pub mod smtp;
pub mod tls;
pub mod verdict;

use std::sync::Arc;

use broker::bridge::Bridge;
use broker::ingest::Ingest;
use broker::{Config, Result, Shutdown};

use crate::config::EmailSettings;
use crate::send::EmailSender;

/// An email bridge: its validated settings.
pub struct Email {
    settings: EmailSettings,
}

/// The bridge's settings, validated.
pub fn settings(config: &Config, name: &str) -> Result<EmailSettings> {
    let s: EmailSettings = config.bridge(name)?.settings(name)?;
    s.validate(name)?;
    Ok(s)
}

impl Bridge for Email {
    const TYPE: &'static str = "email";
    type Sender = EmailSender;

    fn load(config: &Config, name: &str) -> Result<Self> {
        // Before any TLS is set up: no path may ask rustls for a default it lacks.
        tls::install_provider();
        Ok(Email {
            settings: settings(config, name)?,
        })
    }

    fn sender(&self, name: &str) -> Result<EmailSender> {
        EmailSender::new(self.settings.clone(), name)
    }

    /// The IMAP follower; its "not understood" replies go out over SMTP.
    async fn ingest(self, ingest: Ingest, shutdown: Shutdown) -> Result<()> {
        let s = self.settings;
        let name = ingest.name().to_string();
        let reply = EmailSender::new(s.clone(), &name)?;
        let verifier = match s.verify {
            Some(config::Verify::Dkim) => {
                let resolver = s.resolver.as_deref().and_then(|r| r.parse().ok());
                Some(dkim::Verifier::new(resolver).map_err(|e| {
                    broker::Error::Config(broker::error::ConfigError::Invalid {
                        key: format!("bridges.{name}.resolver"),
                        message: e,
                    })
                })?)
            }
            None => None,
        };
        ingest::EmailIngest {
            ingest,
            settings: s,
            bridge: name,
            reply,
            verifier,
        }
        .run(shutdown)
        .await
    }

    /// SMTP and IMAP.
    fn probe(&self, name: &str) -> Result<Option<broker::ping::Probe>> {
        let smtp = Arc::new(EmailSender::new(self.settings.clone(), name)?);
        let imap = self.settings.imap.clone();
        let bridge = name.to_string();
        Ok(Some(Box::new(move || {
            let smtp = smtp.clone();
            let imap = imap.clone();
            let bridge = bridge.clone();
            Box::pin(async move {
                smtp.check().await?;
                ingest::check(&imap, &bridge).await
            })
        })))
    }
}
