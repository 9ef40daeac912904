//! Pure logic around answers: what marks a mail as automatic, and the
//! Message-IDs the bridge generates (reading an answer: [`crate::answer`]).

/// Whether a mail was written by a machine (a vacation responder, a bounce, a
/// list), from its headers as (name, value): such a mail never decides and is
/// never answered, so two robots cannot talk each other into a decision.
pub fn is_automatic<'a>(headers: impl IntoIterator<Item = (&'a str, &'a str)>) -> bool {
    headers.into_iter().any(|(name, value)| {
        let value = value.trim().to_ascii_lowercase();
        match name.to_ascii_lowercase().as_str() {
            // RFC 3834: anything but `no` (parameters after `;` aside).
            "auto-submitted" => value.split(';').next().map(str::trim) != Some("no"),
            "x-autoreply" | "x-autorespond" => true,
            "precedence" => matches!(value.as_str(), "bulk" | "junk" | "list" | "auto_reply"),
            "list-id" | "list-unsubscribe" => true,
            "return-path" => {
                let path = value.trim_matches(['<', '>', ' ']);
                path.is_empty() || path.split('@').next() == Some("mailer-daemon")
            }
            _ => false,
        }
    })
}

/// Message-ID (without angle brackets) of a delivered entry: derived from the
/// delivery key, so a retried send carries the same one.
pub fn entry_message_id(delivery_key: &str, domain: &str) -> String {
    let digest = broker::approval::sha256_hex(delivery_key.as_bytes());
    format!("cowboy.{}@{domain}", &digest[..32])
}

/// Message-ID of an approval notification: carries the record's random nonce.
pub fn approval_message_id(nonce: &str, domain: &str) -> String {
    format!("cowboy-approval.{nonce}@{domain}")
}

/// Whether a referenced id looks like one of our notifications.
pub fn is_approval_id(id: &str) -> bool {
    id.trim_matches(['<', '>']).starts_with("cowboy-approval.")
}

/// A Message-ID an agent gave as `reply_to`: one `<local@domain>` token, no
/// whitespace or control characters (so it cannot inject headers).
pub fn clean_message_id(raw: &str) -> Option<String> {
    let id = raw.trim().trim_start_matches('<').trim_end_matches('>');
    let ok = !id.is_empty()
        && id.contains('@')
        && id
            .chars()
            .all(|c| c.is_ascii_graphic() && c != '<' && c != '>');
    ok.then(|| id.to_string())
}

/// One line, no control characters: what may go into a header.
pub fn clean_header(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machines_are_recognised() {
        for h in [
            ("Auto-Submitted", "auto-replied"),
            ("auto-submitted", "auto-generated; owner-email=x@y"),
            ("X-Autoreply", "yes"),
            ("X-Autorespond", "Vacation"),
            ("Precedence", "bulk"),
            ("Precedence", "auto_reply"),
            ("List-Id", "<ops.example.org>"),
            ("Return-Path", "<>"),
            ("Return-Path", "<MAILER-DAEMON@mx.example.org>"),
        ] {
            assert!(is_automatic([h]), "{h:?}");
        }
        for h in [
            ("Auto-Submitted", "no"),
            ("Precedence", "first-class"),
            ("Return-Path", "<ann@example.org>"),
            ("X-Auto-Response-Suppress", "All"),
            ("Subject", "Auto-Submitted"),
        ] {
            assert!(!is_automatic([h]), "{h:?}");
        }
    }

    #[test]
    fn ids_and_headers_are_clean() {
        assert_eq!(clean_message_id(" <a.b@c> "), Some("a.b@c".into()));
        assert_eq!(clean_message_id("a@b>\r\nBcc: x@y"), None);
        assert_eq!(clean_message_id("no-at-sign"), None);
        assert_eq!(clean_header("hi\r\nBcc: evil@x"), "hi  Bcc: evil@x");
        assert_eq!(
            entry_message_id("s/1-0", "d"),
            entry_message_id("s/1-0", "d")
        );
        assert!(is_approval_id(&format!(
            "<{}>",
            approval_message_id("n", "d")
        )));
    }
}
