//! Delivery over SMTP, and the approval email.
//!
//! Invariants: the Message-ID is generated here, derived from the stream entry
//! (or, for a notification, from the approval's random nonce), so a retried send
//! carries the same id and a receiving system can drop the duplicate; every
//! header value is typed by lettre or cleaned of control characters, so no field
//! of an entry can inject a header; recipients are parsed before sending.

use std::time::Duration;

use broker::approval::Record;
use broker::config::read_secret;
use broker::outbox::{Outgoing, SendError, Sender};
use lettre::message::{header::ContentType, Mailbox};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Tls as SmtpTls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use crate::config::{EmailSettings, SmtpSettings, Tls};
use crate::verdict;

/// Builds the SMTP transport described by `smtp`.
pub fn transport(
    smtp: &SmtpSettings,
    bridge: &str,
) -> broker::Result<AsyncSmtpTransport<Tokio1Executor>> {
    let tls = |host: &str| {
        TlsParameters::new(host.to_string())
            .map_err(|e| broker::Error::Request(format!("smtp tls: {e}")))
    };
    let mut builder = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(smtp.host.clone())
        .port(smtp.port)
        .timeout(Some(Duration::from_secs(30)));
    builder = match smtp.tls {
        Tls::Starttls => builder.tls(SmtpTls::Required(tls(&smtp.host)?)),
        Tls::Implicit => builder.tls(SmtpTls::Wrapper(tls(&smtp.host)?)),
        Tls::None => builder.tls(SmtpTls::None),
    };
    if let (Some(user), Some(file)) = (&smtp.username, &smtp.password_file) {
        let password = read_secret(&format!("bridges.{bridge}.smtp.password_file"), file)?;
        builder = builder.credentials(Credentials::new(user.clone(), password));
    }
    Ok(builder.build())
}

/// Sends the bridge's mail.
pub struct EmailSender {
    settings: EmailSettings,
    from: Mailbox,
    smtp: AsyncSmtpTransport<Tokio1Executor>,
}

impl EmailSender {
    pub fn new(settings: EmailSettings, bridge: &str) -> broker::Result<EmailSender> {
        let from: Mailbox = settings
            .from
            .parse()
            .map_err(|e| broker::Error::Request(format!("bridges.{bridge}.from: {e}")))?;
        let smtp = transport(&settings.smtp, bridge)?;
        Ok(EmailSender {
            settings,
            from,
            smtp,
        })
    }

    /// EHLO and NOOP with the configured credentials (the ping's liveness check).
    pub async fn check(&self) -> Result<(), String> {
        match self.smtp.test_connection().await {
            Ok(true) => Ok(()),
            Ok(false) => Err("SMTP server did not answer NOOP".into()),
            Err(e) => Err(format!("SMTP: {e}")),
        }
    }

    /// Sends one text/plain message; returns its Message-ID (without brackets).
    pub async fn send_text(
        &self,
        to: &str,
        subject: &str,
        body: String,
        message_id: String,
        reply_to: Option<&str>,
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
        if let Some(raw) = reply_to {
            let id = verdict::clean_message_id(raw).ok_or_else(|| {
                SendError::Permanent(format!("reply_to `{raw}` is not a Message-ID"))
            })?;
            builder = builder
                .in_reply_to(format!("<{id}>"))
                .references(format!("<{id}>"));
        }
        let email = builder
            .body(body)
            .map_err(|e| SendError::Permanent(format!("cannot build the message: {e}")))?;
        match self.smtp.send(email).await {
            Ok(_) => Ok(message_id),
            Err(e) if e.is_permanent() => Err(SendError::Permanent(format!(
                "the mail server refused it: {e}"
            ))),
            Err(e) => Err(SendError::Transient(format!("SMTP: {e}"))),
        }
    }
}

/// The approval email: readable on a phone, complete, and saying how to answer.
pub fn approval_body(record: &Record, content: &str) -> String {
    let deadline = match record.expires_at() {
        0 => "This request does not expire.".to_string(),
        t => format!("Answer before {t} (unix time); after that the message is dropped."),
    };
    format!(
        "{who} wants to send a message.\n\n\
         Via:       {bridge}\n\
         To:        {dest}\n\
         Size:      {bytes} bytes\n\
         SHA-256:   {sha}\n\
         Approval:  {id}\n\n\
         {deadline}\n\n\
         Reply to this email with APPROVE on the first line to send it,\n\
         or REJECT and a reason to drop it.\n\n\
         ----- the complete message -----\n{content}\n----- end of message -----\n",
        who = record.agent().unwrap_or("An agent on the shared outbox"),
        bridge = record.source(),
        dest = record.get("channel_id"),
        bytes = content.len(),
        sha = record.get("content_sha256"),
        id = record.id,
    )
}

impl Sender for EmailSender {
    async fn send(&self, out: Outgoing<'_>) -> Result<String, SendError> {
        let m = out.message;
        let domain = self.settings.domain();
        match out.approval {
            Some(record) => {
                let nonce = record.get("nonce");
                if nonce.is_empty() {
                    return Err(SendError::Permanent("approval record has no nonce".into()));
                }
                let content = m.approval_content.as_deref().unwrap_or(&m.content);
                let subject = format!(
                    "Approval needed: {} → {}",
                    record.agent().unwrap_or(record.source()),
                    record.get("channel_id")
                );
                let id = verdict::approval_message_id(nonce, domain);
                self.send_text(
                    &m.channel_id,
                    &subject,
                    approval_body(record, content),
                    id,
                    None,
                )
                .await
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
                    m.reply_to.as_deref(),
                )
                .await
            }
        }
    }
}
