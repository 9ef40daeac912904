//! Ingest: IMAP IDLE on the configured mailbox (polling where the server lacks
//! IDLE), turning replies to approval emails into decisions and every other mail
//! into an inbox entry.
//!
//! Invariants:
//! - Position is `UIDVALIDITY:last-UID` in Redis (`{bridge}:ingest:cursor`),
//!   written in one transaction with the inbox entry of the mail it passes
//!   (after an answer is handed on, for answers); the mail is flagged `\Seen`
//!   (or moved) after that, so a crash or a server restart between the steps
//!   carries nothing twice.
//!   A restart reads only UIDs above it; a changed UIDVALIDITY falls back to the
//!   unseen mail, so nothing handled is read twice and nothing unread is skipped.
//! - A mail whose `In-Reply-To` / `References` names one of our approval
//!   Message-IDs is an answer and never reaches the agent. It decides only when
//!   the sender is an approver (`email:{address}`), the Message-ID is still in
//!   `approval:{bridge}_map`, the verdict parses, and, with
//!   `require_authentication`, our server's topmost `Authentication-Results`
//!   passes DKIM or DMARC for the sender's domain. Anything else decides nothing.
//! - A lost connection is retried with backoff; a refused login stops the service.

use std::time::Duration;

use async_imap::Session;
use broker::approval::Outcome;
use broker::config::read_secret;
use broker::error::ConfigError;
use broker::ingest::Ingest;
use broker::retry::backoff;
use broker::{Error, Result, Shutdown};
use mail_parser::MessageParser;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::answer::{self, Answer};
use crate::config::{EmailSettings, ImapSettings, Tls};
use crate::send::EmailSender;
use crate::verdict;

/// Longest single IDLE before it is renewed (heartbeats and the watchdog run between).
const IDLE_FOR: Duration = Duration::from_secs(20);

/// Any byte stream the IMAP client can run over (plain TCP or TLS).
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send + std::fmt::Debug {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + std::fmt::Debug> Io for T {}

type ImapSession = Session<Box<dyn Io>>;

/// A failed exchange with the IMAP server: worth trying again later.
fn imap_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::platform(true, format!("IMAP {what}: {e}"))
}

/// The TLS handshake with the IMAP server; every failure names the host.
async fn tls_connect(
    imap: &ImapSettings,
    bridge: &str,
    tcp: tokio::net::TcpStream,
) -> Result<Box<dyn Io>> {
    let roots = match &imap.ca_file {
        Some(path) => crate::tls::read_ca_file(&format!("bridges.{bridge}.imap.ca_file"), path)?,
        None => Vec::new(),
    };
    let bad =
        |key: &str, e: String| ConfigError::invalid(format!("bridges.{bridge}.imap.{key}"), e);
    // Building the TLS setup reads the system's roots: worth trying again.
    let config = crate::tls::client_config(roots).map_err(|e| imap_err("TLS setup", e))?;
    let name = tokio_rustls::rustls::pki_types::ServerName::try_from(imap.host.clone())
        .map_err(|e| bad("host", format!("not a TLS server name: {e}")))?;
    let stream = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| {
            imap_err(
                "TLS",
                format!("handshake with {}:{} failed: {e}", imap.host, imap.port),
            )
        })?;
    Ok(Box::new(stream))
}

/// Connects and logs in. A refused login is a configuration error (not retried).
pub async fn login(imap: &ImapSettings, bridge: &str) -> Result<ImapSession> {
    let password = read_secret(
        &format!("bridges.{bridge}.imap.password_file"),
        &imap.password_file,
    )?;
    let tcp = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::net::TcpStream::connect((imap.host.as_str(), imap.port)),
    )
    .await
    .map_err(|_| imap_err("connect", "timed out"))??;
    let stream: Box<dyn Io> = match imap.tls {
        Tls::Implicit => tls_connect(imap, bridge, tcp).await?,
        Tls::None => Box::new(tcp),
        Tls::Starttls => {
            let mut plain = async_imap::Client::new(tcp);
            plain
                .read_response()
                .await?
                .ok_or_else(|| imap_err("greeting", "connection closed"))?;
            plain
                .run_command_and_check_ok("STARTTLS", None)
                .await
                .map_err(|e| imap_err("STARTTLS", e))?;
            tls_connect(imap, bridge, plain.into_inner()).await?
        }
    };
    let mut client = async_imap::Client::new(stream);
    // There is no second greeting after STARTTLS.
    if imap.tls != Tls::Starttls {
        client
            .read_response()
            .await?
            .ok_or_else(|| imap_err("greeting", "connection closed"))?;
    }
    client
        .login(&imap.username, &password)
        .await
        .map_err(|(e, _)| match e {
            // The server said no: the credentials are wrong, and only the
            // config can fix them. Anything else (a dropped connection) passes.
            async_imap::error::Error::No(_) | async_imap::error::Error::Bad(_) => {
                ConfigError::invalid(
                    format!("bridges.{bridge}.imap.password_file"),
                    format!(
                        "the IMAP server refused the login as {}: {e}",
                        imap.username
                    ),
                )
                .into()
            }
            e => imap_err("LOGIN", e),
        })
}

/// The ingest of one email bridge.
pub struct EmailIngest {
    pub ingest: Ingest,
    pub settings: EmailSettings,
    pub bridge: String,
    pub reply: EmailSender,
    /// With `verify = "dkim"`: checks each answer's signature in-process.
    pub verifier: Option<crate::dkim::Verifier>,
}

impl EmailIngest {
    /// Runs until shutdown, reconnecting after lost connections.
    pub async fn run(mut self, shutdown: Shutdown) -> Result<()> {
        let mut attempt = 0;
        let mut ready = false;
        loop {
            match self.session(&shutdown, &mut ready).await {
                Ok(()) => return Ok(()),
                Err(e @ (Error::Permission { .. } | Error::Config(_))) => return Err(e),
                Err(e) => {
                    attempt += 1;
                    tracing::warn!(error = %e, attempt, "IMAP session ended; reconnecting");
                    if !shutdown.sleep(backoff(attempt.min(6))).await {
                        return Ok(());
                    }
                }
            }
        }
    }

    async fn session(&mut self, shutdown: &Shutdown, ready: &mut bool) -> Result<()> {
        let mut session = login(&self.settings.imap, &self.bridge).await?;
        if let Some(folder) = &self.settings.imap.move_to {
            // UID MOVE into a missing folder fails; create it (an existing one is fine).
            if let Err(e) = session.create(folder).await {
                tracing::debug!(folder, error = %e, "CREATE of the move_to folder (it may exist)");
            }
        }
        let mailbox = session
            .select(&self.settings.imap.mailbox)
            .await
            .map_err(|e| imap_err("SELECT", e))?;
        let validity = mailbox.uid_validity.unwrap_or(0);
        let idle = session
            .capabilities()
            .await
            .map_err(|e| imap_err("CAPABILITY", e))?
            .has_str("IDLE");
        tracing::info!(mailbox = %self.settings.imap.mailbox, validity, idle, "IMAP session open");
        if !*ready {
            broker::systemd::ready();
            *ready = true;
        }
        loop {
            self.ingest.tick().await?;
            self.fetch_new(&mut session, validity).await?;
            if shutdown.is_set() {
                let _ = session.logout().await;
                return Ok(());
            }
            // Back in time for the next beat (not less than a second: each
            // IDLE costs a round trip).
            let wait = self
                .ingest
                .tick_within()
                .max(Duration::from_secs(1))
                .min(IDLE_FOR);
            if idle {
                let mut handle = session.idle();
                handle.init().await.map_err(|e| imap_err("IDLE", e))?;
                let stopped = {
                    let (fut, _stop) = handle.wait_with_timeout(wait);
                    tokio::select! {
                        r = fut => { r.map_err(|e| imap_err("IDLE", e))?; false }
                        _ = shutdown.wait() => true,
                    }
                };
                session = handle.done().await.map_err(|e| imap_err("DONE", e))?;
                if stopped {
                    let _ = session.logout().await;
                    return Ok(());
                }
            } else {
                let poll = Duration::from_secs(self.settings.imap.poll_seconds).min(wait);
                if !shutdown.sleep(poll).await {
                    let _ = session.logout().await;
                    return Ok(());
                }
                session.noop().await.map_err(|e| imap_err("NOOP", e))?;
            }
        }
    }

    async fn cursor(&mut self, validity: u32) -> Result<Option<u32>> {
        let saved = self.ingest.cursor().await?;
        Ok(saved.and_then(|s| {
            let (v, uid) = s.split_once(':')?;
            (v.parse::<u32>().ok()? == validity).then(|| uid.parse().ok())?
        }))
    }

    /// Handles every mail above the cursor (or every unseen one without a cursor).
    async fn fetch_new(&mut self, session: &mut ImapSession, validity: u32) -> Result<()> {
        let last = self.cursor(validity).await?;
        let query = match last {
            Some(uid) => format!("UID {}:*", uid + 1),
            None => "UNSEEN".to_string(),
        };
        let mut uids: Vec<u32> = session
            .uid_search(&query)
            .await
            .map_err(|e| imap_err("UID SEARCH", e))?
            .into_iter()
            // `n:*` always matches the newest message, even below n.
            .filter(|u| last.is_none_or(|l| *u > l))
            .collect();
        uids.sort_unstable();
        for uid in uids {
            let raw = {
                use futures::TryStreamExt;
                let fetches: Vec<_> = session
                    .uid_fetch(uid.to_string(), "BODY.PEEK[]")
                    .await
                    .map_err(|e| imap_err("UID FETCH", e))?
                    .try_collect()
                    .await
                    .map_err(|e| imap_err("UID FETCH", e))?;
                fetches.iter().find_map(|f| f.body().map(<[u8]>::to_vec))
            };
            let position = format!("{validity}:{uid}");
            if let Some(raw) = raw {
                self.handle(&raw, &position).await?;
            }
            // An inbound message moved the position with its inbox entry; an
            // answer (whose repeat decides nothing) or an unreadable mail moves it now.
            self.ingest.save_cursor(&position).await?;
            // Flagged after: a flag lost to a restart of the server leaves a
            // mail unseen, never carried twice.
            self.mark_handled(session, uid).await?;
        }
        Ok(())
    }

    async fn mark_handled(&mut self, session: &mut ImapSession, uid: u32) -> Result<()> {
        use futures::TryStreamExt;
        match &self.settings.imap.move_to {
            Some(folder) => session
                .uid_mv(uid.to_string(), folder)
                .await
                .map_err(|e| imap_err("UID MOVE", e)),
            None => {
                let _: Vec<_> = session
                    .uid_store(uid.to_string(), "+FLAGS (\\Seen)")
                    .await
                    .map_err(|e| imap_err("UID STORE", e))?
                    .try_collect()
                    .await
                    .map_err(|e| imap_err("UID STORE", e))?;
                Ok(())
            }
        }
    }

    /// One mail: an answer to a notification, or an inbound message (written
    /// with `position`, the cursor after it, in one transaction).
    pub async fn handle(&mut self, raw: &[u8], position: &str) -> Result<()> {
        let Some(mail) = MessageParser::default().parse(raw) else {
            tracing::warn!("unparseable mail skipped");
            return Ok(());
        };
        let from = mail
            .from()
            .and_then(|a| a.first())
            .and_then(|a| a.address())
            .unwrap_or("")
            .to_ascii_lowercase();
        let mut refs: Vec<String> = Vec::new();
        for h in [mail.in_reply_to(), mail.references()] {
            if let Some(list) = h.as_text_list() {
                refs.extend(list.iter().map(|s| s.trim_matches(['<', '>']).to_string()));
            }
        }
        // As its writer saw it: flowed lines joined, HTML as lines of text.
        let body = crate::body::text_of(&mail);
        let message_id = mail.message_id().unwrap_or("").to_string();
        if refs.iter().any(|r| verdict::is_approval_id(r)) {
            if !self.ingest.is_approval_surface() {
                tracing::warn!(
                    from,
                    "reply to an approval email on a bridge that carries none; ignored"
                );
                return Ok(());
            }
            if verdict::is_automatic(mail.headers_raw()) {
                tracing::info!(from, "automatic reply to an approval email ignored (it decides nothing and is not answered)");
                return Ok(());
            }
            let auth: Vec<String> = mail
                .header_values("Authentication-Results")
                .filter_map(|v| v.as_text().map(str::to_string))
                .collect();
            let subject = mail.subject().unwrap_or("").to_string();
            let reply = Reply {
                from: &from,
                refs: &refs,
                body: &body,
                auth: &auth,
                message_id: &message_id,
                subject: &subject,
                raw,
            };
            return self.answer(reply).await;
        }
        let in_reply_to = mail.in_reply_to().as_text().unwrap_or("").to_string();
        let to = mail
            .to()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.address())
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        let date = mail.date().map(|d| d.to_rfc3339()).unwrap_or_default();
        let subject = mail.subject().unwrap_or("").to_string();
        let fields: Vec<(&str, &[u8])> = vec![
            ("channel_id", from.as_bytes()),
            ("from", from.as_bytes()),
            ("to", to.as_bytes()),
            ("subject", subject.as_bytes()),
            ("message_id", message_id.as_bytes()),
            ("in_reply_to", in_reply_to.as_bytes()),
            ("date", date.as_bytes()),
            ("content", body.as_bytes()),
        ];
        let id = self.ingest.inbound_at(None, &fields, position).await?;
        tracing::info!(from, entry = %id, "mail delivered to the inbox");
        Ok(())
    }

    async fn answer(&mut self, reply: Reply<'_>) -> Result<()> {
        let Reply {
            from,
            refs,
            body,
            auth,
            message_id,
            subject,
            raw,
        } = reply;
        let mut target = None;
        for r in refs.iter().filter(|r| verdict::is_approval_id(r)) {
            if let Some(id) = self.ingest.approvals().map_get(&self.bridge, r).await? {
                target = Some((r.clone(), id));
                break;
            }
        }
        let Some((external_id, approval_id)) = target else {
            tracing::info!(from, "answer to an unknown or settled approval ignored");
            return Ok(());
        };
        let allowed = match self.ingest.approvals().load(&approval_id).await? {
            Some(record) => {
                let identity = broker::identity::Identity::on("email", from);
                self.ingest.may_answer(&record, &identity).await?
            }
            None => false,
        };
        if !allowed {
            tracing::warn!(from, approval = %approval_id, "answer from someone not on approval.approvers ignored");
            return self
                .ingest
                .refused_answer(&approval_id, from, "not an approver")
                .await;
        }
        if let Some(verifier) = &self.verifier {
            let domain = from.rsplit('@').next().unwrap_or("");
            if let Err(why) = verifier.verify(raw, domain).await {
                tracing::warn!(from, approval = %approval_id, why, "answer whose DKIM signature does not verify ignored");
                let why = format!("its DKIM signature does not verify: {why}");
                return self.ingest.refused_answer(&approval_id, from, &why).await;
            }
        }
        if self.settings.require_authentication {
            let domain = from.rsplit('@').next().unwrap_or("");
            let authserv = self.settings.authserv_id.as_deref().unwrap_or("");
            if !crate::authres::authenticated(auth.iter().map(String::as_str), authserv, domain) {
                tracing::warn!(from, approval = %approval_id, "answer without passing DKIM/DMARC from our server ignored");
                let why = "not authenticated: no DKIM or DMARC pass from the receiving server";
                return self.ingest.refused_answer(&approval_id, from, why).await;
            }
        }
        match answer::parse(body, &self.settings.vocabulary()) {
            Answer::Decided(verdict, reason) => {
                let outcome = self
                    .ingest
                    .answer(&external_id, verdict, from, &reason)
                    .await?;
                if let Outcome::Late(state) = outcome {
                    tracing::info!(from, approval = %approval_id, state = %state, "late answer ignored");
                }
            }
            Answer::Later(seconds, reason) => {
                self.ingest
                    .snooze(&external_id, from, seconds, &reason)
                    .await?;
            }
            Answer::NotUnderstood { read, why } => {
                let read: String = match read.is_empty() {
                    true => "> (nothing outside the quote)\n".to_string(),
                    false => read
                        .chars()
                        .take(500)
                        .collect::<String>()
                        .lines()
                        .map(|l| format!("> {l}\n"))
                        .collect(),
                };
                let text = format!(
                    "Your answer to approval {approval_id} was not understood, so nothing was decided: {why}.\n\nWhat was read:\n\n{read}\n\
                     Reply to this email, or to the approval email, with one word on the first line: APPROVE to send the message as it is, or REJECT and a reason to drop it. An answer with a condition (but, if, after, not before, unless, wait) or with both words decides nothing.\n"
                );
                let id = format!(
                    "cowboy-reply.{}@{}",
                    uuid::Uuid::new_v4().simple(),
                    self.settings.domain()
                );
                let subject = format!("Re: {}", subject.trim_start_matches("Re: "));
                // Threaded under the approval email too, so a reply to this mail
                // still names the approval and decides it.
                let mut thread = vec![external_id.as_str()];
                if !message_id.is_empty() {
                    thread.push(message_id);
                }
                if let Err(e) = self
                    .reply
                    .send_text(from, &subject, text, id, &thread, Some("auto-replied"))
                    .await
                {
                    tracing::warn!(error = %e, "could not send the not-understood reply");
                }
            }
        }
        Ok(())
    }
}

/// A mail that answers one of our approval emails, as read.
struct Reply<'a> {
    /// The From address, lower case.
    from: &'a str,
    /// Message-IDs from In-Reply-To and References.
    refs: &'a [String],
    body: &'a str,
    /// `Authentication-Results` values, topmost first.
    auth: &'a [String],
    message_id: &'a str,
    subject: &'a str,
    /// The whole mail, for in-process DKIM verification.
    raw: &'a [u8],
}

/// IMAP login and NOOP with the configured credentials (the ping's liveness check).
pub async fn check(imap: &ImapSettings, bridge: &str) -> std::result::Result<(), String> {
    let mut session = login(imap, bridge).await.map_err(|e| e.to_string())?;
    session
        .noop()
        .await
        .map_err(|e| format!("IMAP NOOP: {e}"))?;
    let _ = session.logout().await;
    Ok(())
}
