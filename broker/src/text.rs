//! Text rules every chat surface shares: cutting long content into messages
//! without losing a character, and reading a typed answer to a card.
//!
//! Invariant: [`split`] drops only the separators it cut at (one newline or
//! one space per cut), so the parts joined with them give the content back.

use crate::approval::Verdict;

/// Splits `content` into messages of at most `limit` units (as `width`
/// counts a character: UTF-16 units on Discord, characters on Slack), on line
/// boundaries, else on word boundaries, else between characters.
pub fn split(content: &str, limit: usize, width: fn(char) -> usize) -> Vec<String> {
    let units = |s: &str| s.chars().map(width).sum::<usize>();
    if units(content) <= limit {
        return vec![content.to_string()];
    }
    let mut parts = Vec::new();
    let mut rest = content;
    while units(rest) > limit {
        // The longest prefix within the limit, by characters.
        let mut end = 0;
        let mut count = 0;
        for (i, c) in rest.char_indices() {
            if count + width(c) > limit {
                break;
            }
            count += width(c);
            end = i + c.len_utf8();
        }
        let window = &rest[..end];
        let cut = window
            .rfind('\n')
            .or_else(|| window.rfind(' '))
            .filter(|i| *i > 0);
        match cut {
            // Split at the separator and drop it (it is implied between messages).
            Some(i) => {
                parts.push(rest[..i].to_string());
                rest = &rest[i + 1..];
            }
            None => {
                parts.push(window.to_string());
                rest = &rest[end..];
            }
        }
    }
    parts.push(rest.to_string());
    parts
}

/// A typed answer to a card (a reply, a thread message): `approve` alone
/// (trailing punctuation allowed), or `reject <reason>`; anything else is
/// not an answer. An approval carries no words after it: "approve once CI
/// is green" or "approved by legal?" is a condition or a question, and a
/// condition the broker cannot check must not pass for a yes.
pub fn reply_verdict(text: &str) -> Option<(Verdict, String)> {
    let text = text.trim();
    let (word, rest) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
    match word
        .trim_end_matches([':', ',', '.', '!'])
        .to_ascii_lowercase()
        .as_str()
    {
        "approve" | "approved" if rest.trim().is_empty() => {
            Some((Verdict::Approved, String::new()))
        }
        "reject" | "rejected" => Some((Verdict::Rejected, rest.trim().to_string())),
        _ => None,
    }
}

/// A span of time as people type it: `N` followed by `s`, `m`, `h` or `d`
/// (`90m`, `2h`, `1d`), in seconds. Anything else (a bare number included,
/// which could mean minutes or seconds) is `None`.
pub fn duration_secs(text: &str) -> Option<u64> {
    let text = text.trim();
    let (i, unit) = text.char_indices().last()?;
    let n: u64 = text[..i].parse().ok()?;
    let scale = match unit.to_ascii_lowercase() {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => return None,
    };
    n.checked_mul(scale)
}

/// A typed "later" (a reply, a thread message, an email's first line):
/// `later` alone, or `later 2h`, each optionally followed by a reason.
/// Returns the time asked for (`None`: the bridge's `approval.snooze`) and
/// the reason. A snooze is never a decision; anything else is not one.
pub fn reply_later(text: &str) -> Option<(Option<u64>, String)> {
    let text = text.trim();
    let (word, rest) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
    let word = word
        .trim_end_matches([':', ',', '.', '!'])
        .to_ascii_lowercase();
    if !matches!(word.as_str(), "later" | "snooze") {
        return None;
    }
    let rest = rest.trim();
    // "later, actually reject it" says two things: it is no answer at all.
    let verdict = rest.split(|c: char| !c.is_alphanumeric()).any(|w| {
        matches!(
            w.to_ascii_lowercase().as_str(),
            "approve" | "approved" | "reject" | "rejected"
        )
    });
    if verdict {
        return None;
    }
    let (first, after) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    match duration_secs(first.trim_end_matches([',', '.', ':'])) {
        Some(secs) => Some((Some(secs), after.trim().to_string())),
        None => Some((None, rest.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_is_typed_with_an_optional_time_and_reason() {
        assert_eq!(reply_later("later"), Some((None, String::new())));
        assert_eq!(reply_later("Later 2h"), Some((Some(7200), String::new())));
        assert_eq!(
            reply_later("later: 90m, in a meeting"),
            Some((Some(5400), "in a meeting".into()))
        );
        assert_eq!(
            reply_later("snooze back monday"),
            Some((None, "back monday".into()))
        );
        assert_eq!(reply_later("approve"), None);
        assert_eq!(reply_later("later. Actually reject: wrong recipient"), None);
        assert_eq!(reply_later("laterally speaking"), None);
        assert_eq!(duration_secs("3d"), Some(259_200));
        assert_eq!(duration_secs("15"), None);
        assert_eq!(duration_secs("99999999999999999999h"), None);
    }

    #[test]
    fn splitting_keeps_everything() {
        let text = format!("{}\n{}", "word ".repeat(700), "x".repeat(4500));
        let parts = split(&text, 2000, char::len_utf16);
        assert!(parts.iter().all(|p| p.encode_utf16().count() <= 2000));
        // Words were split at spaces, the line at its newline, the long word nowhere.
        let joined: String = parts.concat();
        let original: String = text.chars().filter(|c| !c.is_whitespace()).collect();
        let rejoined: String = joined.chars().filter(|c| !c.is_whitespace()).collect();
        assert_eq!(original, rejoined);
        assert_eq!(split("short", 2000, char::len_utf16), vec!["short"]);
        let emoji = "😀".repeat(1500); // 3000 UTF-16 units, 1500 characters
        assert_eq!(split(&emoji, 2000, char::len_utf16).len(), 2);
        assert_eq!(split(&emoji, 2000, |_| 1).len(), 1);
        assert_eq!(split(&emoji, 2000, char::len_utf16).concat(), emoji);
    }

    #[test]
    fn typed_answers() {
        assert_eq!(
            reply_verdict("reject too early"),
            Some((Verdict::Rejected, "too early".into()))
        );
        assert_eq!(
            reply_verdict("Approve!"),
            Some((Verdict::Approved, String::new()))
        );
        assert_eq!(reply_verdict("maybe"), None);
        for conditional in [
            "approve once CI is green",
            "Approved by legal yet?",
            "approve?",
        ] {
            assert_eq!(reply_verdict(conditional), None, "{conditional}");
        }
        assert_eq!(
            reply_verdict("  approved. "),
            Some((Verdict::Approved, String::new()))
        );
    }
}
