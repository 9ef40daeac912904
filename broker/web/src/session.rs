//! Sessions and CSRF tokens, both signed with one key.
//!
//! Invariants:
//! - A session cookie is `user|expires|nonce|mac`: nothing in it is trusted
//!   unless the HMAC-SHA256 over the rest verifies, and it is refused at or
//!   after `expires` (unix seconds, by the page's clock).
//! - A CSRF token is the MAC of the session's nonce: only a page rendered for
//!   that session carries it, and a cross-site form cannot read it.
//! - The login form, before any session, carries the MAC of a random value also
//!   set as a cookie (double submit), so a login cannot be posted from elsewhere.
//! - Comparisons of MACs take constant time.

use hmac::{KeyInit, Mac};
use sha2::Sha256;

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "cowboy_session";
/// The pre-login cookie's name.
pub const LOGIN_COOKIE: &str = "cowboy_login";

/// The signing key.
#[derive(Clone)]
pub struct Keys {
    key: Vec<u8>,
}

/// A verified session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub user: String,
    pub nonce: String,
}

impl Keys {
    /// The key from `path` (at least 32 bytes), or a random one.
    pub fn load(path: Option<&std::path::Path>) -> Result<Keys, String> {
        match path {
            Some(path) => {
                let key = broker::config::read_secret("web.session_key_file", path)
                    .map_err(|e| e.to_string())?;
                if key.len() < 32 {
                    return Err(format!(
                        "web.session_key_file: {} holds {} bytes; give it at least 32",
                        path.display(),
                        key.len()
                    ));
                }
                Ok(Keys {
                    key: key.into_bytes(),
                })
            }
            None => Ok(Keys::random()),
        }
    }

    pub fn random() -> Keys {
        let key = [uuid::Uuid::new_v4(), uuid::Uuid::new_v4()]
            .iter()
            .flat_map(|u| u.as_bytes().to_vec())
            .collect();
        Keys { key }
    }

    fn mac(&self, parts: &[&str]) -> String {
        let mut mac = hmac::Hmac::<Sha256>::new_from_slice(&self.key).expect("any key length");
        mac.update(parts.join("|").as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }

    /// A session cookie value for `user`, valid until `expires`.
    pub fn session(&self, user: &str, expires: u64) -> String {
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let expires = expires.to_string();
        let mac = self.mac(&["session", user, &expires, &nonce]);
        format!("{user}|{expires}|{nonce}|{mac}")
    }

    /// The session a cookie value proves, if it verifies and has not expired.
    pub fn verify(&self, value: &str, now: f64) -> Option<Session> {
        let mut parts = value.split('|');
        let (user, expires, nonce, mac) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let want = self.mac(&["session", user, expires, nonce]);
        if !same(&want, mac) {
            return None;
        }
        let expires: u64 = expires.parse().ok()?;
        (now < expires as f64).then(|| Session {
            user: user.to_string(),
            nonce: nonce.to_string(),
        })
    }

    /// The CSRF token of a session.
    pub fn csrf(&self, session: &Session) -> String {
        self.mac(&["csrf", &session.user, &session.nonce])
    }

    /// The login form's token for the pre-login cookie's value.
    pub fn login_csrf(&self, cookie: &str) -> String {
        self.mac(&["login", cookie])
    }
}

/// Constant-time equality of two MACs.
pub fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// A cookie's value from a `Cookie` header.
pub fn cookie<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').find_map(|pair| {
        let (k, v) = pair.trim().split_once('=')?;
        (k == name).then_some(v)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_verifies_until_it_expires_and_not_when_changed() {
        let keys = Keys::random();
        let value = keys.session("ann", 100);
        let s = keys.verify(&value, 99.0).expect("valid");
        assert_eq!(s.user, "ann");
        assert!(keys.verify(&value, 100.0).is_none(), "expired");
        let forged = value.replacen("ann", "bob", 1);
        assert!(keys.verify(&forged, 0.0).is_none(), "user changed");
        let later = value.replacen("|100|", "|999|", 1);
        assert!(keys.verify(&later, 0.0).is_none(), "expiry changed");
        assert!(Keys::random().verify(&value, 0.0).is_none(), "another key");
        assert_ne!(keys.csrf(&s), Keys::random().csrf(&s));
    }

    #[test]
    fn cookies_are_found_by_name() {
        assert_eq!(
            cookie("a=1; cowboy_session=x|y", SESSION_COOKIE),
            Some("x|y")
        );
        assert_eq!(cookie("cowboy_sessionx=1", SESSION_COOKIE), None);
    }
}
