//! Approval ids and digests.
//!
//! Invariants:
//! - Approval ids are derived from (stream, entry id) with a secret key
//!   ([`IdKey`]) that only the requesting outbox service reads: a restarted
//!   service finds the record of a parked entry without any extra index, and an
//!   agent, who knows its stream and entry ids, still cannot compute the id of
//!   anything.
//! - Every id of a bridge ends with that bridge's tag
//!   ([`keys::approval_tag`]), so the ACL gives each service the records of
//!   the bridges it serves by a key pattern, and no others. 90 bits stay
//!   secret.
//! - Digests cover a canonical, length-prefixed encoding, so no two different
//!   sets of values share one.

use redis::AsyncCommands;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::keys;
use crate::store::Store;

/// The secret that approval ids are derived with: 32 random bytes kept in
/// `{bridge}:id-key`, readable only by the bridge's outbox user (and the operator).
#[derive(Clone)]
pub struct IdKey {
    secret: [u8; 32],
    tag: [u8; 4],
}

impl std::fmt::Debug for IdKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdKey(..)")
    }
}

impl IdKey {
    pub fn from_bytes(bytes: [u8; 32], bridge: &str) -> IdKey {
        let tag = hex::decode(keys::approval_tag(bridge))
            .ok()
            .and_then(|t| <[u8; 4]>::try_from(t).ok())
            .expect("a tag is four bytes in hex");
        IdKey { secret: bytes, tag }
    }

    /// Reads the bridge's key; `None` when it was never made.
    pub async fn existing(store: &mut Store, bridge: &str) -> Result<Option<IdKey>> {
        let key = keys::id_key(bridge);
        let saved: Option<String> = store
            .conn
            .get(&key)
            .await
            .map_err(|e| Error::from_redis(&format!("GET {key}"), e))?;
        saved
            .map(|s| {
                hex::decode(s.trim())
                    .ok()
                    .and_then(|b| <[u8; 32]>::try_from(b).ok())
                    .map(|b| IdKey::from_bytes(b, bridge))
                    .ok_or_else(|| {
                        Error::internal(format!("`{key}` does not hold 32 hex-encoded bytes"))
                    })
            })
            .transpose()
    }

    /// Reads the bridge's key, creating it on first use (`SET NX`, so two workers
    /// starting together agree on one key).
    pub async fn load(store: &mut Store, bridge: &str) -> Result<IdKey> {
        let key = keys::id_key(bridge);
        // Two v4 UUIDs: 244 random bits from the OS generator.
        let fresh = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        let _: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(&fresh)
            .arg("NX")
            .query_async(&mut store.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("SET {key} NX"), e))?;
        let saved: String = store
            .conn
            .get(&key)
            .await
            .map_err(|e| Error::from_redis(&format!("GET {key}"), e))?;
        let bytes = hex::decode(saved.trim())
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .ok_or_else(|| {
                Error::internal(format!("`{key}` does not hold 32 hex-encoded bytes"))
            })?;
        Ok(IdKey::from_bytes(bytes, bridge))
    }

    /// The approval id of a parked entry: HMAC-SHA256 of (stream, entry id) as a
    /// version-8 UUID whose last four bytes are the bridge's tag. Stable across
    /// restarts, not computable without the key.
    pub fn id_for(&self, stream: &str, entry_id: &str) -> String {
        use hmac::{KeyInit, Mac};
        let mut mac = hmac::Hmac::<Sha256>::new_from_slice(&self.secret).expect("any key length");
        mac.update(stream.as_bytes());
        mac.update(b"\n");
        mac.update(entry_id.as_bytes());
        let digest = mac.finalize().into_bytes();
        let mut bytes = [0u8; 16];
        bytes[..12].copy_from_slice(&digest[..12]);
        bytes[12..].copy_from_slice(&self.tag);
        uuid::Uuid::new_v8(bytes).to_string()
    }
}

/// Fields `cowboy deliveries reconcile` adds to an entry it puts back: the
/// approval it re-asks and a seal over the rest, so the card can say "re-send
/// of approval X" and an agent, who cannot compute the seal, cannot claim it.
pub const RESEND_OF: &str = "resend_of";
pub const RESEND_SEAL: &str = "resend_seal";

impl IdKey {
    /// The seal over what decides an approval of `record`: the version to
    /// send (its digest), the quorum and the deadline. Written by the
    /// requesting bridge's services when they park or edit, and checked
    /// before an approval is sealed, so a password that can write records
    /// (a surface's outbox) cannot swap the message or lower the quorum under
    /// a human's answer to the genuine card.
    ///
    /// After an edit it also covers who edited (`editors`), so that list, which
    /// keeps an editor's own approval out of a quorum, cannot be shortened,
    /// and the revision, so a count made before an edit chain came back to
    /// the same text does not count after it. Unedited records are sealed as
    /// before that was added, so approvals parked before an upgrade still
    /// verify.
    pub fn seal_version(&self, record: &super::Record) -> String {
        let mut text = format!(
            "version\n{}\n{}\n{}\n{}",
            record.id, record.message_sha256, record.quorum, record.expires_at
        );
        if record.revision > 0 || !record.editors.is_empty() {
            let editors = fields_sha256([("editors", Some(record.editors.as_bytes()))]);
            text.push_str(&format!("\n{editors}\n{}", record.revision));
        }
        // A snoozed deadline is the broker's too, and so is how many times it
        // moved (records never snoozed are sealed as before snoozing existed).
        if record.snoozes > 0 {
            text.push_str(&format!("\nsnoozes {}", record.snoozes));
        }
        // So are the escalation steps taken: each lets more approvers answer.
        if record.escalated > 0 {
            text.push_str(&format!("\nescalated {}", record.escalated));
        }
        self.seal(&text)
    }

    /// The seal over the count of approval `id` so far, as stored: who
    /// approved (`approvals`, what the trail and `approvals show` name), the
    /// people counted and the shared proofs they came through, for the version
    /// with digest `version` at `revision` (so a count made for a version an
    /// edit replaced cannot be carried over to the next, even when an edit
    /// chain comes back to the same text). None is needed while all are empty.
    pub fn seal_count(&self, id: &str, version: (&str, u32), count: &super::Tally) -> String {
        let revision = version.1.to_string();
        let digest = fields_sha256([
            ("approvals", Some(count.approvals.as_bytes())),
            ("people", Some(count.people.as_bytes())),
            ("proofs", Some(count.proofs.as_bytes())),
            ("version", Some(version.0.as_bytes())),
            ("revision", Some(revision.as_bytes())),
        ]);
        self.seal(&format!("count\n{id}\n{digest}"))
    }

    /// The seal of approval `id` of the version with digest `digest`: written
    /// by the requesting bridge's services when the approval is decided, and
    /// checked before the send, so a record set to `approved` by anyone
    /// without the key (a surface's password, a forger) is never sent.
    pub fn seal_decision(&self, id: &str, digest: &str) -> String {
        self.seal(&format!("approved\n{id}\n{digest}"))
    }

    /// The seal of a delegation of person `from`'s approvals on this bridge
    /// to person `to` until `until` (see [`super::delegation`]).
    pub fn seal_delegation(&self, from: &str, to: &str, until: u64, at: u64) -> String {
        let (until, at) = (until.to_string(), at.to_string());
        let digest = fields_sha256([
            ("from", Some(from.as_bytes())),
            ("to", Some(to.as_bytes())),
            ("until", Some(until.as_bytes())),
            ("at", Some(at.as_bytes())),
        ]);
        self.seal(&format!("delegation\n{digest}"))
    }

    /// The seal of a re-send of approval `of` on `stream` whose other fields
    /// are `fields` (in stream order).
    pub fn seal_resend<'a>(
        &self,
        of: &str,
        stream: &str,
        fields: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    ) -> String {
        let digest = fields_sha256(fields.into_iter().map(|(k, v)| (k, Some(v))));
        self.seal(&format!("resend\n{of}\n{stream}\n{digest}"))
    }

    /// The HMAC of `text` under this bridge's key, in hex.
    fn seal(&self, text: &str) -> String {
        use hmac::{KeyInit, Mac};
        let mut mac = hmac::Hmac::<Sha256>::new_from_slice(&self.secret).expect("any key length");
        mac.update(text.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }
}

/// Whether two secrets (seals, tokens) are equal, in time that does not
/// depend on where they differ.
pub fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// sha256 over a canonical encoding of named values, in the given order: each
/// as `name`, then `-` when absent or `LEN:` and the bytes when present, then a
/// newline. Lengths make the encoding unambiguous whatever the values contain.
pub fn fields_sha256<'a>(fields: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>) -> String {
    let mut h = Sha256::new();
    for (name, value) in fields {
        h.update(name.as_bytes());
        h.update(b"=");
        match value {
            None => h.update(b"-"),
            Some(v) => {
                h.update(format!("{}:", v.len()).as_bytes());
                h.update(v);
            }
        }
        h.update(b"\n");
    }
    hex::encode(h.finalize())
}

/// The digest an approval binds (a message's `sha256`, see
/// [`crate::entry::Message::sha256`]), from its parts: a card checks with it
/// that the content it draws from the record is the message's.
pub fn message_sha256(
    channel_id: &str,
    subject: Option<&str>,
    reply_to: Option<&str>,
    content: &str,
) -> String {
    fields_sha256([
        ("channel_id", Some(channel_id.as_bytes())),
        ("subject", subject.map(str::as_bytes)),
        ("reply_to", reply_to.map(str::as_bytes)),
        ("content", Some(content.as_bytes())),
    ])
}

/// [`fields_sha256`] of a stream entry's fields, as they stand.
pub fn entry_sha256(fields: &[(String, Vec<u8>)]) -> String {
    fields_sha256(fields.iter().map(|(k, v)| (k.as_str(), Some(v.as_slice()))))
}

/// sha256 of the exact bytes that will be sent, hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Whether `id` has the shape of an approval id (so no other key is ever read).
pub fn is_id(id: &str) -> bool {
    uuid::Uuid::try_parse(id).is_ok_and(|u| u.hyphenated().to_string() == id)
}

/// Whether `id` is an approval id of requesting bridge `bridge` (its tag).
pub fn is_id_of(id: &str, bridge: &str) -> bool {
    is_id(id) && id.ends_with(&keys::approval_tag(bridge))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_per_entry_and_keyed() {
        let k = IdKey::from_bytes([7; 32], "a");
        assert_eq!(k.id_for("a:outbox", "1-0"), k.id_for("a:outbox", "1-0"));
        assert_ne!(k.id_for("a:outbox", "1-0"), k.id_for("b:outbox", "1-0"));
        let other = IdKey::from_bytes([8; 32], "a");
        assert_ne!(k.id_for("a:outbox", "1-0"), other.id_for("a:outbox", "1-0"));
        let id = k.id_for("a:outbox", "1-0");
        assert!(is_id(&id), "{id}");
        // The bridge's tag ends the id, and only that bridge's.
        assert!(is_id_of(&id, "a") && !is_id_of(&id, "b"), "{id}");
        assert!(id.ends_with(&keys::approval_tag("a")));
    }

    #[test]
    fn field_digests_are_unambiguous() {
        let a = fields_sha256([("a", Some(&b"x\nb=1:y"[..])), ("b", None)]);
        let b = fields_sha256([("a", Some(&b"x"[..])), ("b", Some(&b"y"[..]))]);
        assert_ne!(a, b);
        assert_ne!(
            fields_sha256([("s", None)]),
            fields_sha256([("s", Some(&b""[..]))])
        );
    }
}
