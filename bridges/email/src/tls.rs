//! TLS for IMAP and SMTP: one crypto provider, the platform's roots plus an
//! optional private CA (`ca_file`), and errors that name the host.
//!
//! Invariants:
//! - No TLS path depends on a process-wide default provider: rustls is built here
//!   with two providers linked in (ring by lettre, aws-lc by others), so asking
//!   for the default panics. Every config built here names ring explicitly, and
//!   [`install_provider`] also sets it as the default for any library that asks.
//! - Certificates are always checked (chain and host name); `ca_file` only adds
//!   roots, it never turns a check off.
//! - A `ca_file` that cannot be read or holds no certificate fails the start-up
//!   naming the key, never the first connection.

use std::path::Path;
use std::sync::Arc;

use broker::error::ConfigError;
use tokio_rustls::rustls::crypto::{ring, CryptoProvider};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::CertificateDer;
use tokio_rustls::rustls::ClientConfig;

/// The crypto provider every TLS connection of the bridge uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

/// Makes [`provider`] the process default (idempotent; a later call is a no-op).
pub fn install_provider() {
    // Err means a provider is installed already, which is all we need.
    let _ = ring::default_provider().install_default();
}

/// The certificates of a PEM `ca_file`; `key` names the setting in errors.
pub fn read_ca_file(key: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let invalid = |message: String| ConfigError::Invalid {
        key: key.to_string(),
        message,
    };
    let pem = std::fs::read(path)
        .map_err(|e| invalid(format!("cannot read `{}`: {e}", path.display())))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(format!("`{}` is not PEM: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(invalid(format!(
            "`{}` holds no CERTIFICATE block",
            path.display()
        )));
    }
    Ok(certs)
}

/// A client config that trusts the platform's roots and `extra` roots.
pub fn client_config(
    extra: Vec<CertificateDer<'static>>,
) -> Result<ClientConfig, tokio_rustls::rustls::Error> {
    let provider = provider();
    let verifier =
        rustls_platform_verifier::Verifier::new_with_extra_roots(extra, provider.clone())?;
    Ok(ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth())
}

/// Whether `host` is a loopback address or name (where plaintext is allowed
/// without `allow_plaintext`).
pub fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}
