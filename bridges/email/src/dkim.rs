//! In-process verification of an answer's sender (`verify = "dkim"`): a DKIM
//! signature that verifies against the signer's key in DNS, aligned with the
//! `From` domain, checked with the `mail-auth` crate.
//!
//! Alignment follows DMARC when the From domain publishes a policy (relaxed or
//! strict, as it says); without a DMARC record only a signature by exactly the
//! From domain counts. A mail with no From or several From addresses, a failing,
//! missing or misaligned signature, and a DNS failure all mean "not verified":
//! the answer decides nothing. DNS goes to the configured `resolver` (an
//! `ip:port`), else to the system's.

use std::net::SocketAddr;

use mail_auth::dmarc::verify::DmarcParameters;
use mail_auth::hickory_resolver::config::{NameServerConfig, ResolverConfig, ResolverOpts};
use mail_auth::{AuthenticatedMessage, DkimResult, DmarcResult, MessageAuthenticator, SpfOutput};

/// Verifies answers' DKIM signatures.
pub struct Verifier {
    auth: MessageAuthenticator,
}

impl Verifier {
    /// A verifier that asks `resolver` (or the system's resolver) for keys and policies.
    pub fn new(resolver: Option<SocketAddr>) -> Result<Verifier, String> {
        let auth = match resolver {
            Some(addr) => {
                let mut ns = NameServerConfig::udp_and_tcp(addr.ip());
                for c in &mut ns.connections {
                    c.port = addr.port();
                }
                let mut opts = ResolverOpts::default();
                opts.timeout = std::time::Duration::from_secs(3);
                opts.attempts = 2;
                MessageAuthenticator::new(ResolverConfig::from_name_servers(vec![ns]), opts)
            }
            None => MessageAuthenticator::new_system_conf(),
        }
        .map_err(|e| format!("DNS resolver: {e}"))?;
        Ok(Verifier { auth })
    }

    /// `Ok(())` when `raw` carries a DKIM signature that verifies and is aligned
    /// with its one From address's domain, `from_domain`; else why not.
    pub async fn verify(&self, raw: &[u8], from_domain: &str) -> Result<(), String> {
        let msg = AuthenticatedMessage::parse(raw).ok_or("the mail cannot be parsed")?;
        match msg.from.as_slice() {
            [one]
                if one
                    .rsplit('@')
                    .next()
                    .is_some_and(|d| d.eq_ignore_ascii_case(from_domain)) => {}
            [_] => return Err("the From address is not the sender's".into()),
            _ => return Err("the mail has no single From address".into()),
        }
        let dkim = self.auth.verify_dkim(&msg).await;
        let passing: Vec<String> = dkim
            .iter()
            .filter(|o| o.result() == &DkimResult::Pass)
            .filter_map(|o| o.signature())
            .map(|s| s.d.to_ascii_lowercase())
            .collect();
        if passing.is_empty() {
            let why: Vec<String> = dkim.iter().map(|o| format!("{:?}", o.result())).collect();
            return Err(format!("no DKIM signature verifies ({})", why.join(", ")));
        }
        // SPF plays no part: the answer is bound to its signed content, not its path.
        let spf = SpfOutput::new(String::new());
        let dmarc = self
            .auth
            .verify_dmarc(DmarcParameters::new(&msg, &dkim, "", &spf))
            .await;
        match dmarc.dkim_result() {
            DmarcResult::Pass if dmarc.domain().eq_ignore_ascii_case(from_domain) => Ok(()),
            DmarcResult::None if passing.iter().any(|d| d.eq_ignore_ascii_case(from_domain)) => {
                Ok(())
            }
            DmarcResult::None => Err(format!(
                "signed by {} but not by {from_domain}, which publishes no DMARC policy",
                passing.join(", ")
            )),
            other => Err(format!("DMARC alignment of {from_domain}: {other:?}")),
        }
    }
}
