//! SMTP that knows how far a message got.
//!
//! lettre's pooled transport reports a lost connection the same way whether
//! it broke while connecting or after the message's last line was sent, so
//! every broken connection had to be called "the server may have accepted
//! it". Here lettre's connection is driven step by step (connect, TLS, EHLO,
//! AUTH, MAIL, RCPT, DATA, then the message), and a failure says which side of
//! the hand-over it came from.
//!
//! Invariants:
//! - Until the message itself is written, the server holds nothing it could
//!   deliver: such a failure is [`Failure::before`] the hand-over, and trying
//!   again cannot send twice.
//! - Certificates are checked as configured ([`crate::send::transport`] builds
//!   the TLS parameters); STARTTLS that the server does not offer is a refusal,
//!   never a plain-text fallback.
//! - Connections are reused (a few kept idle); one that broke while idle is
//!   replaced at once, before anything was handed over on it.

use std::sync::Mutex;
use std::time::Duration;

use lettre::address::Envelope;
use lettre::transport::smtp::authentication::{Credentials, DEFAULT_MECHANISMS};
use lettre::transport::smtp::client::{AsyncSmtpConnection, TlsParameters};
use lettre::transport::smtp::commands::{Data, Mail, Rcpt};
use lettre::transport::smtp::extension::{ClientId, Extension, MailBodyParameter, MailParameter};
use lettre::transport::smtp::Error;

use crate::config::Tls;

/// Connections kept open for the next messages.
const IDLE_KEPT: usize = 4;

/// What went wrong.
#[derive(Debug)]
pub enum SmtpError {
    /// lettre's error: a reply, a connection or TLS failure, a refusal of its own.
    Smtp(Error),
    /// The message needs an extension the server does not offer (`SMTPUTF8`
    /// for non-ASCII addresses, `8BITMIME` for non-ASCII content).
    Lacks(&'static str),
}

impl std::fmt::Display for SmtpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SmtpError::Smtp(e) => write!(f, "{e}"),
            SmtpError::Lacks(ext) => write!(
                f,
                "the server does not offer {ext}, which this message needs"
            ),
        }
    }
}

/// A failed send, and whether the message had been handed over when it failed.
#[derive(Debug)]
pub struct Failure {
    pub error: SmtpError,
    /// The whole message had been written: the server may have accepted it.
    pub handed_over: bool,
}

impl Failure {
    fn before(error: Error) -> Failure {
        Failure {
            error: SmtpError::Smtp(error),
            handed_over: false,
        }
    }

    fn lacks(extension: &'static str) -> Failure {
        Failure {
            error: SmtpError::Lacks(extension),
            handed_over: false,
        }
    }

    /// Whether trying again on a fresh connection may work (not a refusal).
    fn worth_a_fresh_connection(&self) -> bool {
        !self.handed_over
            && matches!(&self.error, SmtpError::Smtp(e) if !e.is_permanent() && !e.is_client())
    }
}

/// Where and how to connect.
pub struct Server {
    pub host: String,
    pub port: u16,
    pub mode: Tls,
    /// Certificate checks for `starttls` and `implicit` (none for `none`).
    pub tls: Option<TlsParameters>,
    pub credentials: Option<Credentials>,
    /// For connecting and for each reply.
    pub timeout: Duration,
}

/// One SMTP server, with the connections kept open to it.
pub struct Smtp {
    server: Server,
    idle: Mutex<Vec<AsyncSmtpConnection>>,
}

impl Smtp {
    pub fn new(server: Server) -> Smtp {
        Smtp {
            server,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// A new connection: TLS as configured, EHLO, and the login if any.
    async fn connect(&self) -> Result<AsyncSmtpConnection, Error> {
        let s = &self.server;
        let hello = ClientId::default();
        let wrapper = match s.mode {
            Tls::Implicit => s.tls.clone(),
            _ => None,
        };
        let mut conn = AsyncSmtpConnection::connect_tokio1(
            (s.host.as_str(), s.port),
            Some(s.timeout),
            &hello,
            wrapper,
            None,
        )
        .await?;
        if let (Tls::Starttls, Some(tls)) = (&s.mode, &s.tls) {
            // lettre refuses with a client error when STARTTLS is not offered.
            conn.starttls(tls.clone(), &hello).await?;
        }
        if let Some(credentials) = &s.credentials {
            conn.auth(DEFAULT_MECHANISMS, credentials).await?;
        }
        Ok(conn)
    }

    /// An idle connection, or a new one.
    async fn connection(&self) -> Result<(AsyncSmtpConnection, bool), Error> {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match idle {
            Some(conn) if !conn.has_broken() => Ok((conn, true)),
            _ => Ok((self.connect().await?, false)),
        }
    }

    /// Sends one message.
    pub async fn send(&self, envelope: &Envelope, email: &[u8]) -> Result<(), Failure> {
        let (mut conn, reused) = self.connection().await.map_err(Failure::before)?;
        let mut result = self.transaction(&mut conn, envelope, email).await;
        if reused
            && result
                .as_ref()
                .is_err_and(Failure::worth_a_fresh_connection)
        {
            // The server closed it while idle: nothing was handed over, so a
            // fresh connection tries at once.
            conn.abort().await;
            conn = self.connect().await.map_err(Failure::before)?;
            result = self.transaction(&mut conn, envelope, email).await;
        }
        match &result {
            Ok(()) => {
                let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
                if idle.len() < IDLE_KEPT {
                    idle.push(conn);
                }
            }
            Err(_) => conn.abort().await,
        }
        result
    }

    /// MAIL, RCPT, DATA and the message on `conn`.
    async fn transaction(
        &self,
        conn: &mut AsyncSmtpConnection,
        envelope: &Envelope,
        email: &[u8],
    ) -> Result<(), Failure> {
        let mut options = Vec::new();
        let non_ascii = envelope
            .from()
            .into_iter()
            .chain(envelope.to())
            .any(|a: &lettre::Address| !AsRef::<str>::as_ref(a).is_ascii());
        if non_ascii {
            // Refused by the server's RCPT otherwise; lettre checks the
            // extension the same way.
            if !conn.server_info().supports_feature(Extension::SmtpUtfEight) {
                return Err(Failure::lacks("SMTPUTF8"));
            }
            options.push(MailParameter::SmtpUtfEight);
        }
        if !email.is_ascii() {
            if !conn.server_info().supports_feature(Extension::EightBitMime) {
                return Err(Failure::lacks("8BITMIME"));
            }
            options.push(MailParameter::Body(MailBodyParameter::EightBitMime));
        }
        conn.command(Mail::new(envelope.from().cloned(), options))
            .await
            .map_err(Failure::before)?;
        for to in envelope.to() {
            conn.command(Rcpt::new(to.clone(), vec![]))
                .await
                .map_err(Failure::before)?;
        }
        conn.command(Data).await.map_err(Failure::before)?;
        conn.message(email).await.map_err(|error| Failure {
            // A reply (4xx, 5xx) means the server did not take it; anything
            // else (a lost connection, a timeout) may have come after it did.
            handed_over: !(error.is_transient() || error.is_permanent()),
            error: SmtpError::Smtp(error),
        })?;
        Ok(())
    }

    /// EHLO (and the login) on a fresh connection, then QUIT: the ping's check.
    pub async fn check(&self) -> Result<(), Error> {
        let mut conn = self.connect().await?;
        let _ = conn.quit().await;
        Ok(())
    }
}
