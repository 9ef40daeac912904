//! `[bridges.NAME]` settings of an email bridge (beside the common keys).

use std::path::PathBuf;

use broker::error::ConfigError;
use serde::Deserialize;

/// How a connection is secured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tls {
    /// Plain connection upgraded with STARTTLS (SMTP submission on 587, IMAP on 143).
    Starttls,
    /// TLS from the first byte (SMTPS on 465, IMAPS on 993).
    Implicit,
    /// No TLS at all: refused at start-up for a host other than loopback
    /// unless `allow_plaintext = true` is written beside it.
    None,
}

/// The email bridge's own keys; any other key fails the start-up.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmailSettings {
    /// The bridge's address: `From` of every mail it sends.
    pub from: String,
    /// Outgoing mail.
    pub smtp: SmtpSettings,
    /// Incoming mail.
    pub imap: ImapSettings,
    /// Subject of messages that carry none.
    #[serde(default = "default_subject")]
    pub default_subject: String,
    /// Count an approval answer only when the topmost `Authentication-Results`
    /// header from `authserv_id` shows DKIM or DMARC pass for the sender's domain.
    #[serde(default)]
    pub require_authentication: bool,
    /// The authserv-id of the receiving mail server (the first token of its
    /// `Authentication-Results` headers).
    #[serde(default)]
    pub authserv_id: Option<String>,
    /// Verify answers in the bridge itself instead of trusting the server's
    /// headers: `"dkim"` counts an answer only with a DKIM signature that
    /// verifies and is aligned with its From domain (DMARC where published).
    #[serde(default)]
    pub verify: Option<Verify>,
    /// The DNS server (`ip:port`) `verify` asks for keys and policies; the
    /// system's resolver when absent.
    #[serde(default)]
    pub resolver: Option<String>,
    /// Words and phrases that approve in an answer; replace the defaults
    /// (English, German, French, Spanish: see `answer::APPROVE`).
    #[serde(default)]
    pub approve_words: Option<Vec<String>>,
    /// Words and phrases that reject; replace the defaults (`answer::REJECT`).
    #[serde(default)]
    pub reject_words: Option<Vec<String>>,
    /// Accept destinations with non-ASCII characters (internationalized
    /// addresses). Off by default: look-alike letters pass a glob and read as
    /// another address to approvers.
    #[serde(default)]
    pub allow_unicode_addresses: bool,
}

impl EmailSettings {
    /// The vocabulary answers are read with.
    pub fn vocabulary(&self) -> crate::answer::Vocabulary {
        let own = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let approve = self
            .approve_words
            .clone()
            .unwrap_or_else(|| own(crate::answer::APPROVE));
        let reject = self
            .reject_words
            .clone()
            .unwrap_or_else(|| own(crate::answer::REJECT));
        crate::answer::Vocabulary::new(&approve, &reject)
    }
}

/// In-process sender verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verify {
    /// An aligned, verifying DKIM signature (see [`crate::dkim`]).
    Dkim,
}

/// `smtp = { host, port, tls, ca_file, allow_plaintext, username, password_file }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SmtpSettings {
    pub host: String,
    pub port: u16,
    pub tls: Tls,
    /// PEM roots trusted beside the platform's (a private CA).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Lets `tls = "none"` reach a host other than loopback.
    #[serde(default)]
    pub allow_plaintext: bool,
    /// SMTP AUTH user; none means no AUTH.
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password_file: Option<PathBuf>,
}

/// `imap = { host, port, tls, ca_file, allow_plaintext, username, password_file,
/// mailbox, move_to, poll_seconds }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImapSettings {
    pub host: String,
    pub port: u16,
    pub tls: Tls,
    /// PEM roots trusted beside the platform's (a private CA).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Lets `tls = "none"` reach a host other than loopback.
    #[serde(default)]
    pub allow_plaintext: bool,
    pub username: String,
    pub password_file: PathBuf,
    /// The folder to watch.
    #[serde(default = "default_mailbox")]
    pub mailbox: String,
    /// Move handled mail here instead of flagging it `\Seen`.
    #[serde(default)]
    pub move_to: Option<String>,
    /// How often to look for mail when the server lacks IDLE.
    #[serde(default = "default_poll")]
    pub poll_seconds: u64,
}

fn default_subject() -> String {
    "Message from your agent".to_string()
}

fn default_mailbox() -> String {
    "INBOX".to_string()
}

fn default_poll() -> u64 {
    30
}

impl EmailSettings {
    /// Checks what serde cannot, naming the key.
    pub fn validate(&self, bridge: &str) -> Result<(), ConfigError> {
        let at = |k: &str| format!("bridges.{bridge}.{k}");
        if self.from.parse::<lettre::Address>().is_err() {
            return Err(ConfigError::Invalid {
                key: at("from"),
                message: format!("`{}` is not an email address", self.from),
            });
        }
        if self.require_authentication && self.authserv_id.as_deref().unwrap_or("").is_empty() {
            return Err(ConfigError::Invalid {
                key: at("authserv_id"),
                message: "require_authentication = true needs the receiving server's authserv_id"
                    .into(),
            });
        }
        if let Some(r) = &self.resolver {
            if r.parse::<std::net::SocketAddr>().is_err() {
                return Err(ConfigError::Invalid {
                    key: at("resolver"),
                    message: format!("`{r}` is not ip:port"),
                });
            }
            if self.verify.is_none() {
                return Err(ConfigError::Invalid {
                    key: at("resolver"),
                    message: "resolver is used only with verify = \"dkim\"".into(),
                });
            }
        }
        if self.smtp.username.is_some() != self.smtp.password_file.is_some() {
            return Err(ConfigError::Invalid {
                key: at("smtp.password_file"),
                message: "smtp.username and smtp.password_file go together".into(),
            });
        }
        for (side, host, tls, ca_file, allow_plaintext) in [
            (
                "smtp",
                &self.smtp.host,
                self.smtp.tls,
                &self.smtp.ca_file,
                self.smtp.allow_plaintext,
            ),
            (
                "imap",
                &self.imap.host,
                self.imap.tls,
                &self.imap.ca_file,
                self.imap.allow_plaintext,
            ),
        ] {
            if tls == Tls::None && !allow_plaintext && !crate::tls::is_loopback(host) {
                return Err(ConfigError::Invalid {
                    key: at(&format!("{side}.tls")),
                    message: format!(
                        "tls = \"none\" to {host} would send passwords and mail in clear; \
                         use starttls or implicit, or write allow_plaintext = true"
                    ),
                });
            }
            if let Some(path) = ca_file {
                let key = at(&format!("{side}.ca_file"));
                if tls == Tls::None {
                    return Err(ConfigError::Invalid {
                        key,
                        message: "ca_file is used only with tls = \"starttls\" or \"implicit\""
                            .into(),
                    });
                }
                crate::tls::read_ca_file(&key, path)?;
            }
        }
        if self.imap.poll_seconds == 0 {
            return Err(ConfigError::Invalid {
                key: at("imap.poll_seconds"),
                message: "must be at least 1".into(),
            });
        }
        Ok(())
    }

    /// The domain of `from`, used in generated Message-IDs.
    pub fn domain(&self) -> &str {
        self.from.rsplit('@').next().unwrap_or("localhost")
    }
}
