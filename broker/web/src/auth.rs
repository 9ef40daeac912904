//! Who may log in: the users of `[web.users]`, each with an Argon2 hash.
//!
//! Invariants:
//! - Passwords are never stored or logged: files hold PHC strings made by
//!   `cowboy web hash-password`, checked with Argon2 off the async threads.
//! - An unknown user costs the same check as a known one (against a hash made
//!   at start-up), so the answer's timing does not tell which names exist.
//! - Every failure answers only after [`FAILURE_DELAY`]; after
//!   [`LOCK_AFTER`] failures in a row for one name from one client (an IPv4
//!   address or an IPv6 /64), that pair is locked for [`LOCK_SECS`], during
//!   which even the right password is refused. Never a name for everyone: a
//!   stranger guessing cannot lock a named approver out of the page; and a
//!   login under another name does not reset the count.
//! - A session is tied to the fingerprint of the password hash it was issued
//!   under ([`Users::fingerprint`]): a changed hash ends every earlier session.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;

/// How long a failed login waits before it is answered.
pub const FAILURE_DELAY: Duration = Duration::from_millis(750);
/// Failures in a row that lock a client address.
pub const LOCK_AFTER: u32 = 3;
/// How long a locked address stays locked.
pub const LOCK_SECS: f64 = 300.0;
/// Addresses whose failures are remembered at most (locked ones are kept first).
const MAX_TRACKED: usize = 10_000;

/// Whom failed logins are counted against: an IPv4 address, or an IPv6 /64
/// (one host commonly holds a whole /64). IPv4-mapped IPv6 is IPv4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Client {
    V4(std::net::Ipv4Addr),
    V6Net(u64),
}

impl Client {
    pub fn of(ip: std::net::IpAddr) -> Client {
        match ip.to_canonical() {
            std::net::IpAddr::V4(v4) => Client::V4(v4),
            std::net::IpAddr::V6(v6) => Client::V6Net((u128::from(v6) >> 64) as u64),
        }
    }
}

/// The outcome of a login.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Login {
    Ok,
    Wrong,
    /// Locked for this many more seconds.
    Locked(u64),
}

pub struct Users {
    hashes: BTreeMap<String, String>,
    dummy: String,
    /// Failures in a row and the lock's end, per (client, name).
    failures: Mutex<HashMap<(Client, String), (u32, f64)>>,
    /// Argon2 checks at once: each takes 19 MiB, so a flood of logins waits
    /// here instead of exhausting memory.
    checks: tokio::sync::Semaphore,
}

/// A PHC Argon2id hash of `password` with a random salt.
pub fn hash_password(password: &str) -> String {
    let bytes = *uuid::Uuid::new_v4().as_bytes();
    let salt = SaltString::encode_b64(&bytes).expect("16 bytes is a valid salt");
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .expect("argon2 with default parameters")
        .to_string()
}

impl Users {
    /// Reads every user's hash file; a missing or malformed one names its key.
    pub fn load(web: &broker::config::WebConfig) -> Result<Users, String> {
        let mut hashes = BTreeMap::new();
        for (name, user) in &web.users {
            let key = format!("web.users.{name}.password_file");
            let phc = broker::config::read_secret(&key, &user.password_file)
                .map_err(|e| e.to_string())?;
            PasswordHash::new(&phc).map_err(|e| {
                format!("{key}: not an Argon2 hash ({e}); make one with `cowboy web hash-password`")
            })?;
            hashes.insert(name.clone(), phc);
        }
        Ok(Users {
            hashes,
            dummy: hash_password(&uuid::Uuid::new_v4().to_string()),
            failures: Mutex::new(HashMap::new()),
            checks: tokio::sync::Semaphore::new(2),
        })
    }

    /// The fingerprint of `user`'s password hash (sessions are tied to it);
    /// `None` for a user not in the config.
    pub fn fingerprint(&self, user: &str) -> Option<String> {
        use sha2::Digest;
        let phc = self.hashes.get(user)?;
        Some(hex::encode(&sha2::Sha256::digest(phc.as_bytes())[..16]))
    }

    /// Checks a login from `client` at `now` (unix seconds). The attempt is
    /// counted before the password is checked, in one step with the lock
    /// check, so parallel attempts cannot each get a guess past the lock.
    pub async fn check(
        &self,
        user: &str,
        password: &str,
        now: f64,
        client: std::net::IpAddr,
    ) -> Login {
        let key = (Client::of(client), user.to_string());
        let locked = {
            let mut failures = self.failures.lock().expect("lock");
            // Bounded: many addresses cannot grow the table without end.
            if failures.len() >= MAX_TRACKED && !failures.contains_key(&key) {
                failures.retain(|_, (fails, until)| *fails >= LOCK_AFTER && now < *until);
            }
            let entry = failures.entry(key.clone()).or_insert((0, 0.0));
            if entry.0 >= LOCK_AFTER && now < entry.1 {
                Some((entry.1 - now).ceil() as u64)
            } else {
                if entry.0 >= LOCK_AFTER {
                    *entry = (0, 0.0); // the lock ran out: a fresh count
                }
                entry.0 += 1;
                if entry.0 >= LOCK_AFTER {
                    entry.1 = now + LOCK_SECS;
                }
                None
            }
        };
        if let Some(secs) = locked {
            tokio::time::sleep(FAILURE_DELAY).await;
            return Login::Locked(secs);
        }
        let phc = self.hashes.get(user).unwrap_or(&self.dummy).clone();
        let known = self.hashes.contains_key(user);
        let password = password.to_string();
        let Ok(_permit) = self.checks.acquire().await else {
            return Login::Wrong;
        };
        let ok = tokio::task::spawn_blocking(move || {
            PasswordHash::new(&phc)
                .map(|h| {
                    Argon2::default()
                        .verify_password(password.as_bytes(), &h)
                        .is_ok()
                })
                .unwrap_or(false)
        })
        .await
        .unwrap_or(false)
            && known;
        if ok {
            // Only this name from this client: logging in as oneself never
            // resets the count against someone else's name.
            self.failures.lock().expect("lock").remove(&key);
            return Login::Ok;
        }
        tokio::time::sleep(FAILURE_DELAY).await;
        Login::Wrong
    }
}
