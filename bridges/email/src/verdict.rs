//! Pure logic of email answers: the verdict in a reply, the anti-spoofing check
//! on `Authentication-Results`, and the Message-IDs the bridge generates.

use broker::approval::Verdict;

/// What a reply says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Decided(Verdict, String),
    NotUnderstood,
}

/// The verdict is the first non-empty line that is not quoted (`>`):
/// `approve`/`approved`/`yes`/`ok` approves; `reject`/`rejected`/`no` rejects,
/// with the rest of that line, or else the next unquoted lines, as the reason.
pub fn parse_answer(body: &str) -> Answer {
    let mut lines = body
        .lines()
        .map(str::trim)
        .skip_while(|l| l.is_empty() || l.starts_with('>'));
    let Some(first) = lines.next() else {
        return Answer::NotUnderstood;
    };
    let (word, rest) = match first
        .find(|c: char| c.is_whitespace() || c == ':' || c == ',' || c == '.' || c == '!')
    {
        Some(i) => (
            &first[..i],
            first[i..].trim_start_matches([':', ',', '.', '!', ' ', '\t', '-']),
        ),
        None => (first, ""),
    };
    match word.to_ascii_lowercase().as_str() {
        "approve" | "approved" | "yes" | "ok" | "okay" => {
            Answer::Decided(Verdict::Approved, String::new())
        }
        "reject" | "rejected" | "no" => {
            let reason = if rest.trim().is_empty() {
                lines
                    .take_while(|l| !l.is_empty() && !l.starts_with('>') && !is_attribution(l))
                    .collect::<Vec<_>>()
                    .join(" ")
            } else {
                rest.trim().to_string()
            };
            Answer::Decided(Verdict::Rejected, reason)
        }
        _ => Answer::NotUnderstood,
    }
}

/// "On Mon, ... wrote:" lines introduce the quoted notification.
fn is_attribution(line: &str) -> bool {
    line.ends_with("wrote:")
}

/// Whether the topmost `Authentication-Results` header added by `authserv_id`
/// shows `dkim=pass` or `dmarc=pass` for `domain`. Headers come in message
/// order (topmost first); only the first one carrying our authserv-id counts,
/// since anything below it may have been written by the sender.
pub fn authenticated<'a>(
    headers: impl IntoIterator<Item = &'a str>,
    authserv_id: &str,
    domain: &str,
) -> bool {
    let domain = domain.to_ascii_lowercase();
    let Some(ours) = headers.into_iter().find(|h| {
        h.split(';')
            .next()
            .and_then(|id| id.split_whitespace().next())
            .is_some_and(|id| id.eq_ignore_ascii_case(authserv_id))
    }) else {
        return false;
    };
    ours.split(';').skip(1).any(|result| {
        let lower = result.to_ascii_lowercase();
        let mut words = lower.split_whitespace();
        let Some(method) = words.next() else {
            return false;
        };
        let props: Vec<&str> = words.collect();
        let aligned = |keys: &[&str]| {
            props.iter().any(|p| {
                keys.iter().any(|k| {
                    p.strip_prefix(k).is_some_and(|v| {
                        let v = v.trim_start_matches('@');
                        v == domain
                    })
                })
            })
        };
        match method {
            "dkim=pass" => aligned(&["header.d=", "header.i="]),
            "dmarc=pass" => aligned(&["header.from="]),
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
    fn verdicts() {
        assert_eq!(
            parse_answer("APPROVE\n\nOn Mon wrote:\n> REJECT"),
            Answer::Decided(Verdict::Approved, "".into())
        );
        assert_eq!(
            parse_answer("\n  yes please\n"),
            Answer::Decided(Verdict::Approved, "".into())
        );
        assert_eq!(
            parse_answer("Ok."),
            Answer::Decided(Verdict::Approved, "".into())
        );
        assert_eq!(
            parse_answer("REJECT wrong person"),
            Answer::Decided(Verdict::Rejected, "wrong person".into())
        );
        assert_eq!(
            parse_answer("reject: too early"),
            Answer::Decided(Verdict::Rejected, "too early".into())
        );
        assert_eq!(
            parse_answer("no\nnot this week\nask again\n\nOn Tue, x wrote:\n> hi"),
            Answer::Decided(Verdict::Rejected, "not this week ask again".into())
        );
        assert_eq!(
            parse_answer("> APPROVE\nmaybe later"),
            Answer::NotUnderstood
        );
        assert_eq!(parse_answer("approvedish"), Answer::NotUnderstood);
        assert_eq!(parse_answer(""), Answer::NotUnderstood);
    }

    #[test]
    fn only_the_topmost_result_of_our_server_counts() {
        let ours = "mx.example.org; dkim=pass header.d=example.org header.s=s1; spf=pass";
        let forged = "mx.example.org; dmarc=pass header.from=example.org";
        assert!(authenticated([ours], "mx.example.org", "example.org"));
        assert!(authenticated(
            ["other.host; dkim=pass header.d=example.org", ours],
            "mx.example.org",
            "Example.org"
        ));
        // Our server says fail; a forged pass below it must not count.
        assert!(!authenticated(
            ["mx.example.org; dkim=fail header.d=example.org", forged],
            "mx.example.org",
            "example.org"
        ));
        assert!(!authenticated(
            ["mx.example.org; dkim=pass header.d=evil.org"],
            "mx.example.org",
            "example.org"
        ));
        assert!(!authenticated(
            ["mx.example.org; spf=pass smtp.mailfrom=example.org"],
            "mx.example.org",
            "example.org"
        ));
        assert!(authenticated(
            ["mx.example.org; dmarc=pass (p=reject) header.from=example.org"],
            "mx.example.org",
            "example.org"
        ));
        assert!(!authenticated(
            Vec::<&str>::new(),
            "mx.example.org",
            "example.org"
        ));
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
