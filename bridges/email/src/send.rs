//! Delivery over SMTP, and the approval email.
//!
//! Invariants: the Message-ID is generated here, derived from the stream entry
//! (or, for a notification, from the approval's random nonce); every header value
//! is typed by lettre or cleaned of control characters, so no field of an entry
//! can inject a header; recipients are parsed before sending.
//!
//! SMTP cannot deduplicate, so a delivery is never sent twice blindly: a send
//! the outbox marks as a retry (an earlier attempt may have been accepted) is
//! reported `uncertain` with its Message-ID instead, and a connection lost or
//! timed out after the message was written whole is uncertain too. Any failure
//! before that (connecting, TLS, the envelope, a 4xx reply) is retried, since
//! then the server has certainly not taken the message ([`crate::smtp`]).
//! Approval emails are the exception: a duplicate one is harmless (same
//! Message-ID, same nonce).

use std::time::Duration;

use broker::approval::{self, Record};
use broker::bridge::{CardUpdate, Outgoing, SendError, Sender, Sent};
use broker::config::read_secret;
use lettre::message::{header::ContentType, Mailbox};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::TlsParameters;
use lettre::Message;

use crate::config::{EmailSettings, SmtpSettings, Tls};
use crate::smtp::{Failure, Server, Smtp, SmtpError};
use crate::verdict;

/// Builds the SMTP client described by `smtp`.
pub fn transport(smtp: &SmtpSettings, bridge: &str) -> broker::Result<Smtp> {
    let tls = |host: &str| {
        let mut params = TlsParameters::builder(host.to_string());
        if let Some(path) = &smtp.ca_file {
            let key = format!("bridges.{bridge}.smtp.ca_file");
            let pem = std::fs::read(path).map_err(|e| {
                broker::Error::Config(broker::error::ConfigError::Invalid {
                    key: key.clone(),
                    message: format!("cannot read `{}`: {e}", path.display()),
                })
            })?;
            let cert =
                lettre::transport::smtp::client::Certificate::from_pem(&pem).map_err(|e| {
                    broker::Error::Config(broker::error::ConfigError::Invalid {
                        key,
                        message: format!("`{}`: {e}", path.display()),
                    })
                })?;
            params = params.add_root_certificate(cert);
        }
        params.build().map_err(|e| {
            broker::Error::Config(broker::error::ConfigError::invalid(
                format!("bridges.{bridge}.smtp.tls"),
                e.to_string(),
            ))
        })
    };
    let params = match smtp.tls {
        Tls::Starttls | Tls::Implicit => Some(tls(&smtp.host)?),
        Tls::None => None,
    };
    let credentials = match (&smtp.username, &smtp.password_file) {
        (Some(user), Some(file)) => {
            let password = read_secret(&format!("bridges.{bridge}.smtp.password_file"), file)?;
            Some(Credentials::new(user.clone(), password))
        }
        _ => None,
    };
    Ok(Smtp::new(Server {
        host: smtp.host.clone(),
        port: smtp.port,
        mode: smtp.tls,
        tls: params,
        credentials,
        timeout: Duration::from_secs(30),
    }))
}

/// Sends the bridge's mail.
pub struct EmailSender {
    settings: EmailSettings,
    from: Mailbox,
    smtp: Smtp,
}

impl EmailSender {
    pub fn new(settings: EmailSettings, bridge: &str) -> broker::Result<EmailSender> {
        let from: Mailbox = settings
            .from
            .parse()
            .map_err(|e: lettre::address::AddressError| {
                broker::Error::Config(broker::error::ConfigError::invalid(
                    format!("bridges.{bridge}.from"),
                    e.to_string(),
                ))
            })?;
        let smtp = transport(&settings.smtp, bridge)?;
        Ok(EmailSender {
            settings,
            from,
            smtp,
        })
    }

    /// EHLO (and STARTTLS and the login, as configured) on a fresh connection:
    /// the ping's liveness check.
    pub async fn check(&self) -> Result<(), String> {
        self.smtp.check().await.map_err(|e| {
            format!(
                "SMTP {}:{}: {e}",
                self.settings.smtp.host, self.settings.smtp.port
            )
        })
    }

    /// Sends one text/plain message; returns its Message-ID (without brackets).
    /// `thread` is the Message-IDs it answers, oldest first: all go into
    /// `References`, the last into `In-Reply-To`. `auto` marks mail the bridge
    /// writes by itself (RFC 3834 `Auto-Submitted`), so vacation responders leave
    /// it alone.
    pub async fn send_text(
        &self,
        to: &str,
        subject: &str,
        body: String,
        message_id: String,
        thread: &[&str],
        auto: Option<&str>,
    ) -> Result<String, SendError> {
        let to: Mailbox = to
            .parse()
            .map_err(|e| SendError::Permanent(format!("invalid recipient address `{to}`: {e}")))?;
        let mut builder = Message::builder()
            .from(self.from.clone())
            .to(to)
            .subject(verdict::clean_header(subject))
            .message_id(Some(format!("<{message_id}>")))
            .header(ContentType::TEXT_PLAIN);
        let mut ids = Vec::new();
        for raw in thread {
            let id = verdict::clean_message_id(raw).ok_or_else(|| {
                SendError::Permanent(format!("reply_to `{raw}` is not a Message-ID"))
            })?;
            ids.push(format!("<{id}>"));
        }
        if let Some(last) = ids.last() {
            builder = builder.in_reply_to(last.clone()).references(ids.join(" "));
        }
        if let Some(auto) = auto {
            builder = builder
                .header(AutoSubmitted(auto.to_string()))
                .header(AutoResponseSuppress);
        }
        let email = builder
            .body(body)
            .map_err(|e| SendError::Permanent(format!("cannot build the message: {e}")))?;
        match self.smtp.send(email.envelope(), &email.formatted()).await {
            Ok(()) => Ok(message_id),
            Err(e) => Err(classify(
                &e,
                &format!(
                    "SMTP {}:{}",
                    self.settings.smtp.host, self.settings.smtp.port
                ),
                &message_id,
            )),
        }
    }
}

/// Classifies an SMTP failure (`server` names the host in every message): a
/// 5xx reply will never work; lettre's client errors (no STARTTLS offered, no
/// usable AUTH mechanism) and an extension the message needs but the server
/// lacks come before `MAIL FROM`, so the message was certainly not handed over
/// and retrying the same server cannot help; any other failure before the
/// message was written whole (connecting, TLS, a 4xx reply, a connection lost
/// mid-envelope) is retried, as nothing was handed over; only a failure after
/// it that is not a reply (a lost connection, a timeout) may have come after
/// the server accepted it.
fn classify(failure: &Failure, server: &str, message_id: &str) -> SendError {
    let e = match &failure.error {
        SmtpError::Lacks(_) => {
            return SendError::Permanent(format!(
                "{server}: {} (nothing was handed over)",
                failure.error
            ))
        }
        SmtpError::Smtp(e) => e,
    };
    // 535: the login was refused; 530: the server wants one we did not give.
    let login = e.status().map(|c| c.to_string());
    if matches!(login.as_deref(), Some("535" | "530")) {
        return SendError::Credentials(format!("{server}: {e}"));
    }
    if e.is_permanent() {
        return SendError::Permanent(format!("{server} refused it: {e}"));
    }
    if e.is_client() {
        return SendError::Permanent(format!("{server}: {e} (nothing was handed over)"));
    }
    if !failure.handed_over {
        return SendError::Transient(format!("{server}: {e} (nothing was handed over)"));
    }
    SendError::Uncertain(format!(
        "{server}: {e}; the server may have accepted Message-ID <{message_id}>"
    ))
}

/// `Auto-Submitted` (RFC 3834): `auto-generated` or `auto-replied`.
#[derive(Clone)]
struct AutoSubmitted(String);

impl lettre::message::header::Header for AutoSubmitted {
    fn name() -> lettre::message::header::HeaderName {
        lettre::message::header::HeaderName::new_from_ascii_str("Auto-Submitted")
    }
    fn parse(s: &str) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Ok(AutoSubmitted(s.to_string()))
    }
    fn display(&self) -> lettre::message::header::HeaderValue {
        lettre::message::header::HeaderValue::new(Self::name(), self.0.clone())
    }
}

/// `X-Auto-Response-Suppress: All`: Exchange's own way of saying the same.
#[derive(Clone)]
struct AutoResponseSuppress;

impl lettre::message::header::Header for AutoResponseSuppress {
    fn name() -> lettre::message::header::HeaderName {
        lettre::message::header::HeaderName::new_from_ascii_str("X-Auto-Response-Suppress")
    }
    fn parse(_: &str) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Ok(AutoResponseSuppress)
    }
    fn display(&self) -> lettre::message::header::HeaderValue {
        lettre::message::header::HeaderValue::new(Self::name(), "All".to_string())
    }
}

/// How to answer, in the approval email.
pub const HOW_TO_ANSWER: &str =
    "reply to this email with APPROVE on the first line to send it, or REJECT and a reason to drop it";

/// The approval email: the broker's frame, every content line marked.
pub fn approval_body(record: &Record, content: &str) -> String {
    let mut body = approval::render_notification(record, content, HOW_TO_ANSWER, None);
    body.push('\n');
    body
}

/// The mailbox a destination names, as the SMTP envelope will carry it
/// (`local@domain`, the domain in lower case, any display name dropped), or
/// why it is refused: what a mail system may read differently from how an
/// allow-list glob or an approver reads it. Refused: quoted local parts (lettre
/// unquotes `"approvals"@x` into `approvals@x`), `%` and `!` (source routing
/// that relays such as Postfix's `allow_percent_hack` and `swap_bangpath`
/// forward elsewhere), comments, address literals, and, unless
/// `allow_unicode` is set, any non-ASCII character (Cyrillic `о` looks like `o`).
pub fn canonical_address(raw: &str, allow_unicode: bool) -> Result<String, String> {
    let raw = raw.trim();
    // The addr-spec part, as written: inside the last <...> when there is one.
    let spec = match (raw.rfind('<'), raw.rfind('>')) {
        (Some(i), Some(j)) if i < j => &raw[i + 1..j],
        _ => raw,
    };
    for (c, why) in [
        ('"', "a quoted local part"),
        ('%', "`%` routing"),
        ('!', "`!` (bang path) routing"),
        ('(', "a comment"),
        ('\\', "an escaped character"),
        ('[', "an address literal"),
    ] {
        if spec.contains(c) {
            return Err(format!(
                "holds {why}, which a mail system may deliver elsewhere than it reads"
            ));
        }
    }
    if !allow_unicode && !raw.is_ascii() {
        return Err(
            "holds non-ASCII characters (look-alike letters); set allow_unicode_addresses to allow them"
                .into(),
        );
    }
    let mailbox: Mailbox = raw
        .parse()
        .map_err(|e| format!("not an email address: {e}"))?;
    let user = mailbox.email.user();
    let domain = mailbox.email.domain().to_lowercase();
    Ok(format!("{user}@{domain}"))
}

impl Sender for EmailSender {
    const DEDUPLICATES: bool = false;
    /// One delivery is one mail.
    const SPLITS: bool = false;

    fn canonical_destination(&self, raw: &str) -> Result<String, String> {
        canonical_address(raw, self.settings.allow_unicode_addresses)
    }

    async fn send(&self, out: Outgoing<'_>) -> Result<Sent, SendError> {
        self.deliver(out).await.map(Sent::from)
    }

    /// An email cannot be edited: only a reminder is sent, as a short mail
    /// threaded under the approval email (a reply to it answers, as a
    /// reply to the approval email does).
    async fn update(&self, u: CardUpdate<'_>) -> Result<(), SendError> {
        if u.outcome != "reminder" || u.record.nonce.is_empty() {
            return Ok(());
        }
        let r = u.record;
        let domain = self.settings.domain();
        let approval = verdict::approval_message_id(&r.nonce, domain);
        let id = format!("cowboy-reminder.{}@{domain}", uuid::Uuid::new_v4().simple());
        let subject = format!(
            "Reminder: approval needed [{}]: {} → {}",
            &r.id[..8.min(r.id.len())],
            r.agent().unwrap_or(r.source()),
            r.channel_id
        );
        self.send_text(
            u.channel_id,
            &subject,
            reminder_body(r),
            id,
            &[approval.as_str()],
            Some("auto-generated"),
        )
        .await
        .map(|_| ())
    }
}

/// The reminder's text (from the record; the message itself is in the
/// approval email it answers).
fn reminder_body(r: &Record) -> String {
    let deadline = match r.expires_at {
        0 => String::new(),
        t => format!(" It expires at {} (UTC).", broker::clock::utc(t as f64)),
    };
    format!(
        "Approval {} from {} via {} still waits for a decision.{deadline}\n\n\
         Reply to this email, or to the approval email, with APPROVE, REJECT and a reason, or LATER.\n",
        r.id,
        r.agent().unwrap_or("an agent"),
        r.source()
    )
}

impl EmailSender {
    /// One delivery; returns its external id.
    async fn deliver(&self, out: Outgoing<'_>) -> Result<String, SendError> {
        let m = out.message;
        let domain = self.settings.domain();
        if out.retry && out.approval.is_none() {
            let id = verdict::entry_message_id(out.delivery_key, domain);
            return Err(SendError::Uncertain(format!(
                "an earlier attempt may have been accepted by the mail server (Message-ID <{id}>); not sent again"
            )));
        }
        match out.approval {
            Some(record) => {
                let nonce = record.nonce.as_str();
                if nonce.is_empty() {
                    return Err(SendError::Permanent("approval record has no nonce".into()));
                }
                let content = m.approval_content.as_deref().unwrap_or(&m.content);
                // Its own subject (the short id, and the edit's number): clients
                // that thread by subject never merge two approvals.
                let edit = match record.revision {
                    0 => String::new(),
                    n => format!(", edit {n}"),
                };
                let subject = format!(
                    "Approval needed [{}{edit}]: {} → {}",
                    &record.id[..8.min(record.id.len())],
                    approval::one_line(record.agent().unwrap_or(record.source())),
                    approval::one_line(&record.channel_id)
                );
                let id = verdict::approval_message_id(nonce, domain);
                let sent = self
                    .send_text(
                        &m.channel_id,
                        &subject,
                        approval_body(record, content),
                        id,
                        &[],
                        Some("auto-generated"),
                    )
                    .await;
                // An approval email lost in the server's hands is sent again:
                // a second copy (same Message-ID, same answer address) is
                // harmless, an unshown one would reject the message unasked.
                match sent {
                    Err(SendError::Uncertain(why)) => Err(SendError::Transient(format!(
                        "{why}; the approval email is sent again"
                    ))),
                    other => other,
                }
            }
            None => {
                let subject = m
                    .subject
                    .as_deref()
                    .unwrap_or(&self.settings.default_subject);
                let id = verdict::entry_message_id(out.delivery_key, domain);
                self.send_text(
                    &m.channel_id,
                    subject,
                    m.content.clone(),
                    id,
                    m.reply_to.as_deref().as_slice(),
                    None,
                )
                .await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::canonical_address;

    #[test]
    fn destinations_are_the_mailbox_the_envelope_will_carry() {
        let ok = |raw: &str| canonical_address(raw, false).unwrap();
        assert_eq!(ok("bob@Example.ORG"), "bob@example.org");
        assert_eq!(ok("Bob <bob@example.org>"), "bob@example.org");
        assert_eq!(ok("\"Bob B.\" <bob@example.org>"), "bob@example.org");
        for raw in [
            "\"approvals\"@example.org",
            "eve%evil.com@example.org",
            "evil.com!eve@example.org",
            "eve(comment)@example.org",
            "eve@[127.0.0.1]",
            "b\u{043e}b@example.org",
            "bob@ex\u{0430}mple.org",
            "not an address",
        ] {
            assert!(canonical_address(raw, false).is_err(), "{raw}");
        }
        assert_eq!(
            canonical_address("b\u{043e}b@example.org", true).unwrap(),
            "b\u{043e}b@example.org"
        );
    }
}
