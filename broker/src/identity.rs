//! Approver identities, `KIND:ID`: who answered, in one canonical spelling.
//!
//! Invariants:
//! - An [`Identity`] is always canonical: an email address's is folded to
//!   lower case (one mailbox, one person); every other kind compares exactly.
//!   Folding happens here only.
//! - A parsed identity has a known kind (a surface of the bridge registry,
//!   `cli` or `web`), a non-empty id and no control characters (a quorum
//!   keeps identities one per line). `broker:` identities are the broker's
//!   own and no config can name them.

use std::fmt;
use std::ops::Deref;

/// One approver identity, canonical.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity(String);

impl Identity {
    /// Operator `name`, deciding through the CLI under its own Redis user.
    pub fn cli(name: &str) -> Identity {
        Identity(format!("cli:{name}"))
    }

    /// User `name` of the approval page.
    pub fn web(name: &str) -> Identity {
        Identity(format!("web:{name}"))
    }

    /// The broker itself, deciding for notify bridge `notify` (a card no
    /// human could be shown).
    pub fn broker(notify: &str) -> Identity {
        Identity(format!("broker:{notify}"))
    }

    /// Person `id` on platform `kind` (a bridge type), canonical.
    pub fn on(kind: &str, id: &str) -> Identity {
        Identity(canonical(&format!("{kind}:{id}")))
    }

    /// An identity as written in a record, a request or a trail: canonical,
    /// not checked against the kinds this config knows.
    pub fn read(text: &str) -> Identity {
        Identity(canonical(text))
    }

    /// Reads a configured identity; the error says why it is not one.
    pub fn parse(text: &str) -> Result<Identity, String> {
        let kinds = crate::config::approver_kinds();
        let well_formed = text.split_once(':').is_some_and(|(kind, id)| {
            kinds.contains(&kind) && !id.is_empty() && !id.chars().any(char::is_control)
        });
        match well_formed {
            true => Ok(Identity(canonical(text))),
            false => Err(format!(
                "`{text}` is not `type:id` with type one of {}",
                kinds.join(", ")
            )),
        }
    }

    /// The kind: `cli`, `web`, `broker` or a bridge type.
    pub fn kind(&self) -> &str {
        self.0.split_once(':').map_or("", |(kind, _)| kind)
    }

    /// The id within its kind.
    pub fn id(&self) -> &str {
        self.0.split_once(':').map_or("", |(_, id)| id)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The secret an answer by this identity is proven with, as a class: an
    /// operator's own Redis user (`cli:NAME`), the page's password (`page`),
    /// or the notify bridge's ingest password (`surface`, every platform).
    pub fn proof_class(&self) -> &str {
        match self.kind() {
            "cli" => self.as_str(),
            "web" => "page",
            _ => "surface",
        }
    }
}

/// The canonical spelling of an identity written as text (a config entry, a
/// record's field): `email:Ann@Example.org` is `email:ann@example.org`.
pub fn canonical(text: &str) -> String {
    match text.split_once(':') {
        Some(("email", addr)) => format!("email:{}", addr.to_ascii_lowercase()),
        _ => text.to_string(),
    }
}

impl Deref for Identity {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl From<Identity> for String {
    fn from(identity: Identity) -> String {
        identity.0
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One spelling per person: email folds case, other kinds compare exactly;
    /// a configured identity needs a known kind and a clean id.
    #[test]
    fn identities_have_one_canonical_form() {
        assert_eq!(
            Identity::on("email", "Ann@Example.ORG").as_str(),
            "email:ann@example.org"
        );
        assert_eq!(Identity::on("discord", "Ann").as_str(), "discord:Ann");
        assert_eq!(
            Identity::parse("email:Ann@x.org").unwrap(),
            Identity::on("email", "ann@x.org")
        );
        assert_eq!(Identity::cli("ann").kind(), "cli");
        assert_eq!(Identity::web("ann").id(), "ann");
        assert_eq!(Identity::web("ann").proof_class(), "page");
        assert_eq!(Identity::cli("ann").proof_class(), "cli:ann");
        assert_eq!(Identity::on("discord", "1").proof_class(), "surface");
        for bad in [
            "nobody",
            "smtp:ann",
            "cli:",
            "web:a\nb",
            "broker:desk",
            ":x",
        ] {
            assert!(Identity::parse(bad).is_err(), "{bad:?}");
        }
    }
}
