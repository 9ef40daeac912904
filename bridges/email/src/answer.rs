//! Reading an answer the way people write it: where the verdict is, what it
//! says, and whether it says one thing.
//!
//! Invariants:
//! - The verdict is the first line the approver wrote: above the client's
//!   attribution and quote (top-posting), the first unquoted line (inline), or
//!   below the quote (bottom-posting). Quoted lines, attribution lines,
//!   signatures and everything after an "original message" block are never
//!   read as the answer; the markers live in one table, [`MARKERS`].
//! - An answer decides only when its verdict paragraph says one thing: a verdict
//!   phrase near its start, no phrase of the other verdict, and no condition
//!   ("but", "if", "not before", …). Anything else decides nothing, and says why.
//! - Phrases match whole words, longest first, so "don't send it" is a
//!   rejection and not "send it".

use broker::approval::Verdict;

/// What a reply says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A verdict, and for a rejection the approver's reason.
    Decided(Verdict, String),
    /// Nothing decided: what was read (the verdict line, if any) and why.
    NotUnderstood { read: String, why: String },
    /// "Later" (`later`, `later 2h`, and a reason): the deadline moves by
    /// the time given (`None`: the bridge's `approval.snooze`); never a
    /// decision.
    Later(Option<u64>, String),
}

/// Approvals in English, German, French and Spanish (and a thumb).
pub const APPROVE: &[&str] = &[
    "approve",
    "approved",
    "yes",
    "ok",
    "okay",
    "sure",
    "go ahead",
    "send it",
    "send",
    "lgtm",
    "looks good",
    "sounds good",
    "all good",
    "good to go",
    "ship it",
    "yep",
    "yup",
    "yeah",
    "absolutely",
    "confirmed",
    "agreed",
    "fine by me",
    "works for me",
    "go for it",
    "do it",
    "👍",
    "✅",
    "genehmigt",
    "genehmige",
    "freigegeben",
    "ja",
    "einverstanden",
    "passt",
    "passt so",
    "geht klar",
    "in ordnung",
    "alles klar",
    "mach das",
    "oui",
    "d'accord",
    "approuvé",
    "approuve",
    "vas-y",
    "allez-y",
    "c'est bon",
    "ça marche",
    "ca marche",
    "parfait",
    "validé",
    "valide",
    "je valide",
    "sí",
    "aprobado",
    "apruebo",
    "de acuerdo",
    "adelante",
    "vale",
    "dale",
    "perfecto",
    "listo",
    "envíalo",
    "envialo",
    "está bien",
    "esta bien",
];

/// Rejections, and negations (which make an approval word mean its opposite).
pub const REJECT: &[&str] = &[
    "reject",
    "rejected",
    "no",
    "nope",
    "deny",
    "denied",
    "stop",
    "don't",
    "dont",
    "do not",
    "don't send",
    "don't send it",
    "do not send",
    "do not send it",
    "not",
    "never",
    "hold",
    "hold off",
    "cancel",
    "cancelled",
    "decline",
    "declined",
    "scratch that",
    "shouldn't",
    "can't",
    "cannot",
    "won't",
    "wrong",
    "nee",
    "lass mal",
    "👎",
    "❌",
    "nein",
    "abgelehnt",
    "ablehnen",
    "nicht",
    "nicht senden",
    "non",
    "refusé",
    "refuse",
    "rejeté",
    "pas",
    "ne pas envoyer",
    "rechazado",
    "rechazo",
    "no enviar",
];

/// Words that make an answer conditional: it then decides nothing.
pub const CONDITIONS: &[&str] = &[
    "but",
    "if",
    "after",
    "not before",
    "unless",
    "wait",
    "until",
    "only if",
    "once",
    "when",
    "except",
    "provided",
    "though",
    "however",
    "as soon as",
    "first",
    "tomorrow",
    "later",
    "sofern",
    "quand",
    "lorsque",
    "cuando",
    "aber",
    "wenn",
    "falls",
    "nach",
    "nicht vor",
    "außer",
    "ausser",
    "warte",
    "erst",
    "sobald",
    "mais",
    "si",
    "après",
    "apres",
    "pas avant",
    "sauf",
    "attends",
    "attendez",
    "dès que",
    "pero",
    "después",
    "despues",
    "no antes",
    "salvo",
    "excepto",
    "espera",
    "hasta",
];

/// Words that may come before the verdict without changing it ("Please approve").
const LEAD: &[&str] = &[
    "please",
    "thanks",
    "thank",
    "thx",
    "cheers",
    "and",
    "und",
    "et",
    "hi",
    "hello",
    "bitte",
    "danke",
    "merci",
    "gracias",
    "por favor",
];

/// The vocabulary of one bridge: the defaults, or its `approve_words` /
/// `reject_words`.
#[derive(Debug, Clone)]
pub struct Vocabulary {
    approve: Vec<Vec<String>>,
    reject: Vec<Vec<String>>,
    conditions: Vec<Vec<String>>,
}

impl Default for Vocabulary {
    fn default() -> Self {
        let own = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Vocabulary::new(&own(APPROVE), &own(REJECT))
    }
}

fn phrases(words: &[String]) -> Vec<Vec<String>> {
    let mut p: Vec<Vec<String>> = words
        .iter()
        .map(|w| tokens(w).into_iter().map(|t| t.text).collect::<Vec<_>>())
        .filter(|t: &Vec<String>| !t.is_empty())
        .collect();
    // Longest first: "don't send it" before "send it".
    p.sort_by_key(|t| std::cmp::Reverse(t.len()));
    p
}

impl Vocabulary {
    pub fn new(approve: &[String], reject: &[String]) -> Vocabulary {
        let conditions: Vec<String> = CONDITIONS.iter().map(|s| s.to_string()).collect();
        Vocabulary {
            approve: phrases(approve),
            reject: phrases(reject),
            conditions: phrases(&conditions),
        }
    }
}

/// A word of a line, lower case, with where it ends in the line.
struct Token {
    text: String,
    end: usize,
}

/// Words (letters, digits, apostrophes, hyphens inside) and single symbols
/// (emoji), lower case; skin tones and variation selectors dropped.
fn tokens(line: &str) -> Vec<Token> {
    let mut out: Vec<Token> = Vec::new();
    let mut word = String::new();
    let mut end = 0;
    let flush = |word: &mut String, end: usize, out: &mut Vec<Token>| {
        let w = word.trim_matches(['\'', '-']).to_string();
        if !w.is_empty() {
            out.push(Token { text: w, end });
        }
        word.clear();
    };
    for (i, c) in line.char_indices() {
        // Every apostrophe look-alike is one: "don´t" is "don't".
        let c = if matches!(c, '’' | '‘' | '´' | '`' | 'ʼ' | '′') {
            '\''
        } else {
            c
        };
        if c.is_alphanumeric() || ((c == '\'' || c == '-') && !word.is_empty()) {
            word.extend(c.to_lowercase());
            end = i + c.len_utf8();
        } else {
            flush(&mut word, end, &mut out);
            let symbol = !c.is_whitespace() && !c.is_ascii_punctuation() && !c.is_control();
            let modifier = matches!(
                c,
                '\u{FE0E}' | '\u{FE0F}' | '\u{1F3FB}'..='\u{1F3FF}' | '\u{200D}'
            );
            if symbol && !modifier && !matches!(c, '«' | '»' | '¡' | '¿' | '…' | '–' | '—')
            {
                out.push(Token {
                    text: c.to_string(),
                    end: i + c.len_utf8(),
                });
            }
        }
    }
    flush(&mut word, end, &mut out);
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Approve,
    Reject,
    Condition,
}

/// The phrases found in `tokens`, in order: (kind, first token, past the last).
fn find(v: &Vocabulary, tokens: &[Token]) -> Vec<(Kind, usize, usize)> {
    let mut found = Vec::new();
    let mut i = 0;
    'next: while i < tokens.len() {
        // Longest first across all kinds, so "not before" is a condition, not
        // a negation, and "don't send it" a rejection, not an approval.
        let mut best: Option<(Kind, usize)> = None;
        for (kind, list) in [
            (Kind::Condition, &v.conditions),
            (Kind::Reject, &v.reject),
            (Kind::Approve, &v.approve),
        ] {
            for p in list {
                let fits = p.len() <= tokens.len() - i
                    && p.iter().zip(&tokens[i..]).all(|(w, t)| *w == t.text);
                if fits && best.is_none_or(|(_, n)| p.len() > n) {
                    best = Some((kind, p.len()));
                }
            }
        }
        if let Some((kind, n)) = best {
            found.push((kind, i, i + n));
            i += n;
            continue 'next;
        }
        i += 1;
    }
    found
}

/// Judges a verdict `first` line. An approval must also keep the rest of its
/// paragraph (`rest`) free of the other verdict and of conditions; a rejection
/// only its own line free of approvals (its reason may well say "but").
fn judge(v: &Vocabulary, first: &str, rest: &[&str]) -> Answer {
    let read = std::iter::once(first)
        .chain(rest.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    let not = |why: &str| Answer::NotUnderstood {
        read: read.clone(),
        why: why.to_string(),
    };
    let words = tokens(first);
    let mut lead = 0;
    while lead < words.len() && LEAD.contains(&words[lead].text.as_str()) {
        lead += 1;
    }
    let found = find(v, &words);
    let Some(&(kind, start, past)) = found.first() else {
        return not("no approve or reject word on its first line");
    };
    if start > lead || kind == Kind::Condition {
        return not("its first line does not start with approve or reject");
    }
    let on_line = |k: Kind| found.iter().any(|(x, _, _)| *x == k);
    if on_line(Kind::Approve) && on_line(Kind::Reject) {
        return not("it says both approve and reject");
    }
    match kind {
        Kind::Approve => {
            // The first line says only that: approve (and please, thanks).
            // "Send me the full text first", "OK, I'll look tomorrow" and any
            // question decide nothing.
            let covered = |i: usize| {
                found
                    .iter()
                    .any(|(k, a, b)| *k == Kind::Approve && (*a..*b).contains(&i))
                    || LEAD.contains(&words[i].text.as_str())
            };
            if first.contains('?') || !(0..words.len()).all(covered) {
                return not("its first line says more than approve: write only APPROVE there (or a rejection with its reason)");
            }
            let all: Vec<Kind> = rest
                .iter()
                .flat_map(|l| find(v, &tokens(l)))
                .map(|(k, _, _)| k)
                .chain(found.iter().map(|(k, _, _)| *k))
                .collect();
            if all.contains(&Kind::Reject) {
                return not("it says both approve and reject");
            }
            if all.contains(&Kind::Condition) {
                return not("it adds a condition (but, if, after, not before, unless, wait, ...): approve or reject without one");
            }
            Answer::Decided(Verdict::Approved, String::new())
        }
        _ => {
            // The reason: the rest of the line after the verdict, then the
            // rest of its paragraph.
            let end = words[past - 1].end;
            let after = first[end..]
                .trim_start_matches(|c: char| c.is_whitespace() || ":,.;!-–—".contains(c))
                .trim();
            let reason: Vec<&str> = std::iter::once(after)
                .chain(rest.iter().map(|l| l.trim()))
                .filter(|l| !l.is_empty())
                .collect();
            Answer::Decided(Verdict::Rejected, reason.join(" "))
        }
    }
}

/// What a line is, besides the approver's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// A client's line introducing the quote ("On … wrote:"): skipped.
    Attribution,
    /// Everything from here on is the original message, quoted without `>`
    /// (Outlook, "-----Original Message-----"): reading stops.
    Original,
    /// A signature starts here: skipped up to the next quote.
    Signature,
}

/// How a line is recognised (on the trimmed line, lower case).
pub enum Pattern {
    StartsEnds(&'static str, &'static str),
    Contains(&'static str),
    Starts(&'static str),
    Ends(&'static str),
    Exactly(&'static str),
    /// A header block: a line starting with the first, and within the next
    /// lines one starting with any of the second (Outlook's "From: … Sent: …").
    Header(&'static [&'static str], &'static [&'static str]),
    /// A line made of this character only, at least 10 of them.
    RuleOf(char),
    /// Starts, holds, and ends with these.
    Around(&'static str, &'static str, &'static str),
    /// The phrase between dashes ("-----Original Message-----").
    Dashed(&'static str),
}

/// Every marker of every client and language recognised: extend it here.
pub const MARKERS: &[(Pattern, Mark)] = &[
    // Gmail, Apple Mail, Thunderbird, Yahoo: "On Mon, 1 Dec 2026 at 10:00, X <x@y> wrote:"
    (Pattern::StartsEnds("on ", "wrote:"), Mark::Attribution),
    (Pattern::Exactly("wrote:"), Mark::Attribution),
    // German: "Am 01.12.2026 um 10:00 schrieb X <x@y>:"
    (Pattern::Around("am ", " schrieb ", ":"), Mark::Attribution),
    (Pattern::StartsEnds("am ", " schrieb:"), Mark::Attribution),
    // French: "Le lun. 1 déc. 2026 à 10:00, X <x@y> a écrit :"
    (Pattern::StartsEnds("le ", "a écrit :"), Mark::Attribution),
    (Pattern::StartsEnds("le ", "a écrit:"), Mark::Attribution),
    // Spanish: "El lun, 1 dic 2026 a las 10:00, X (<x@y>) escribió:"
    (Pattern::StartsEnds("el ", "escribió:"), Mark::Attribution),
    // Outlook and others: the original follows, unquoted, under a dashed line.
    (Pattern::Dashed("original message"), Mark::Original),
    (Pattern::Dashed("ursprüngliche nachricht"), Mark::Original),
    (Pattern::Dashed("original-nachricht"), Mark::Original),
    (Pattern::Dashed("message d'origine"), Mark::Original),
    (Pattern::Dashed("mensaje original"), Mark::Original),
    (Pattern::Starts("begin forwarded message"), Mark::Original),
    (Pattern::RuleOf('_'), Mark::Original),
    (
        Pattern::Header(
            &["from:", "von:", "de :", "de:"],
            &[
                "sent:",
                "gesendet:",
                "envoyé :",
                "envoyé:",
                "enviado:",
                "date:",
                "datum:",
                "fecha:",
                "to:",
                "an:",
                "à :",
                "para:",
            ],
        ),
        Mark::Original,
    ),
    // Signatures.
    (Pattern::Exactly("--"), Mark::Signature),
    (Pattern::Starts("sent from my "), Mark::Signature),
    (Pattern::Starts("sent from yahoo mail"), Mark::Signature),
    (
        Pattern::Starts("sent from mail for windows"),
        Mark::Signature,
    ),
    (Pattern::Starts("get outlook for "), Mark::Signature),
    (
        Pattern::StartsEnds("von meinem ", " gesendet"),
        Mark::Signature,
    ),
    (Pattern::Starts("gesendet von "), Mark::Signature),
    (Pattern::Starts("envoyé de mon "), Mark::Signature),
    (Pattern::Starts("obtenir outlook pour "), Mark::Signature),
    (Pattern::Starts("enviado desde mi "), Mark::Signature),
];

fn mark_of(lines: &[&str], i: usize) -> Option<Mark> {
    let l = lines[i].trim().to_lowercase();
    MARKERS.iter().find_map(|(p, mark)| {
        let hit = match p {
            Pattern::StartsEnds(a, b) => l.starts_with(a) && l.ends_with(b),
            Pattern::Contains(s) => l.contains(s),
            Pattern::Starts(s) => l.starts_with(s),
            Pattern::Ends(s) => l.ends_with(s),
            Pattern::Exactly(s) => l == *s,
            Pattern::Header(first, then) => {
                first.iter().any(|f| l.starts_with(f))
                    && lines[i + 1..].iter().take(4).any(|n| {
                        let n = n.trim().to_lowercase();
                        then.iter().any(|t| n.starts_with(t))
                    })
            }
            Pattern::RuleOf(c) => l.chars().count() >= 10 && l.chars().all(|x| x == *c),
            Pattern::Around(a, m, b) => l.starts_with(a) && l.contains(m) && l.ends_with(b),
            Pattern::Dashed(s) => l.starts_with('-') && l.ends_with('-') && l.contains(s),
        };
        hit.then_some(*mark)
    })
}

/// The approver's own lines, in order (`None` between paragraphs): quotes,
/// attributions and signatures left out, reading stopped at an original.
fn own_lines(body: &str) -> Vec<Option<&str>> {
    let lines: Vec<&str> = body.lines().collect();
    let mut out = Vec::new();
    let mut in_signature = false;
    for i in 0..lines.len() {
        let l = lines[i].trim();
        if l.starts_with('>') {
            in_signature = false;
            continue;
        }
        match mark_of(&lines, i) {
            Some(Mark::Original) => break,
            Some(Mark::Attribution) => {
                in_signature = false;
                // A wrapped attribution: its first half was taken as text.
                if l.eq_ignore_ascii_case("wrote:") || l.starts_with("wrote:") {
                    if let Some(Some(_)) = out.last() {
                        out.pop();
                    }
                }
                continue;
            }
            Some(Mark::Signature) => {
                in_signature = true;
                continue;
            }
            None => {}
        }
        // The "-- " separator trims to "--" (matched above).
        if in_signature {
            continue;
        }
        out.push((!l.is_empty()).then_some(l));
    }
    out
}

/// Every line not quoted with `>`, up to an original-message block.
fn unquoted(body: &str) -> Vec<&str> {
    let lines: Vec<&str> = body.lines().collect();
    let mut out = Vec::new();
    for i in 0..lines.len() {
        let l = lines[i].trim();
        if mark_of(&lines, i) == Some(Mark::Original) {
            break;
        }
        if !l.starts_with('>') && !l.is_empty() {
            out.push(l);
        }
    }
    out
}

/// What an answer says (see the module's invariants).
pub fn parse(body: &str, vocabulary: &Vocabulary) -> Answer {
    let own = own_lines(body);
    let Some(start) = own.iter().position(Option::is_some) else {
        return Answer::NotUnderstood {
            read: String::new(),
            why: "nothing was written outside the quote".to_string(),
        };
    };
    let paragraph: Vec<&str> = own[start..].iter().map_while(|l| *l).collect();
    // "Later" is read first: it decides nothing, so it cannot be a
    // condition on a verdict.
    if let Some((seconds, reason)) = broker::text::reply_later(paragraph[0]) {
        // "Later. Actually reject: wrong recipient" says two things.
        let verdicts = paragraph
            .iter()
            .flat_map(|l| find(vocabulary, &tokens(l)))
            .any(|(k, _, _)| matches!(k, Kind::Approve | Kind::Reject));
        if verdicts {
            return Answer::NotUnderstood {
                read: paragraph.join(" "),
                why: "it says later and also approve or reject: write one of them".to_string(),
            };
        }
        return Answer::Later(seconds, reason);
    }
    match judge(vocabulary, paragraph[0], &paragraph[1..]) {
        // "Reject", a blank line, then why: the next paragraph is the reason.
        Answer::Decided(Verdict::Rejected, reason) if reason.is_empty() => {
            let next: Vec<&str> = own[start + paragraph.len()..]
                .iter()
                .skip_while(|l| l.is_none())
                .map_while(|l| *l)
                .collect();
            Answer::Decided(Verdict::Rejected, next.join(" "))
        }
        // An approval holds for the whole answer: "Approve", a blank line,
        // then "actually no, wait" decides nothing.
        Answer::Decided(Verdict::Approved, _) => {
            // Every unquoted line counts here, signatures and attribution-like
            // lines too: doubt anywhere in what the approver wrote stops it.
            let first = paragraph[0];
            let later: Vec<&str> = unquoted(body)
                .into_iter()
                .skip_while(|l| *l != first)
                .skip(1)
                .collect();
            match judge_rest(vocabulary, &later) {
                Some(why) => Answer::NotUnderstood {
                    read: own[start..]
                        .iter()
                        .flatten()
                        .copied()
                        .collect::<Vec<_>>()
                        .join(" "),
                    why: why.to_string(),
                },
                None => Answer::Decided(Verdict::Approved, String::new()),
            }
        }
        other => other,
    }
}

/// Why lines written after an approval make it say more than one thing.
fn judge_rest(v: &Vocabulary, lines: &[&str]) -> Option<&'static str> {
    let kinds: Vec<Kind> = lines
        .iter()
        .flat_map(|l| find(v, &tokens(l)))
        .map(|(k, _, _)| k)
        .collect();
    if kinds.contains(&Kind::Reject) {
        return Some("it says both approve and reject");
    }
    if kinds.contains(&Kind::Condition) {
        return Some("it adds a condition (but, if, after, not before, unless, wait, ...): approve or reject without one");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(body: &str) -> Answer {
        parse(body, &Vocabulary::default())
    }

    fn approved(body: &str) {
        assert_eq!(
            p(body),
            Answer::Decided(Verdict::Approved, String::new()),
            "{body:?}"
        );
    }

    fn rejected(body: &str, reason: &str) {
        assert_eq!(
            p(body),
            Answer::Decided(Verdict::Rejected, reason.into()),
            "{body:?}"
        );
    }

    fn nothing(body: &str) {
        assert!(
            matches!(p(body), Answer::NotUnderstood { .. }),
            "{body:?} gave {:?}",
            p(body)
        );
    }

    #[test]
    fn verdicts_where_people_write_them() {
        approved("APPROVE\n\nOn Mon, 1 Dec 2026 at 10:00, Cowboy <b@x> wrote:\n> REJECT");
        approved("On Mon, 1 Dec 2026 at 10:00, Cowboy <b@x> wrote:\n> the request\n\nApproved\n");
        approved("On Mon, 1 Dec 2026 at 10:00, Cowboy Bridge <bridge@example.org>\nwrote:\n> the request\n\nyes\n");
        approved(
            "Sure, send it\n\nSent from my iPhone\n\n> On 1 Dec 2026, at 10:00, x wrote:\n> hi",
        );
        approved("Genehmigt\n\nAm 01.12.2026 um 10:00 schrieb Cowboy <b@x>:\n> Bitte genehmigen");
        approved("Oui, d'accord.\n\nLe lun. 1 déc. 2026 à 10:00, Cowboy <b@x> a écrit :\n> ...");
        approved("Sí, aprobado\n\nEl lun, 1 dic 2026 a las 10:00, Cowboy (<b@x>) escribió:\n> ...");
        approved("Go ahead\n________________________________\nFrom: Cowboy <b@x>\nSent: Monday\nTo: ann\nSubject: Approval\n\nREJECT is not what I mean");
        approved("👍🏽");
        approved("Please approve.\nThanks, Jane");
        approved("Approved\n\nThanks, Jane");
        rejected("REJECT wrong person", "wrong person");
        rejected("reject: too early", "too early");
        rejected(
            "no\nnot this week\nask again\n\nOn Tue, x wrote:\n> hi",
            "not this week ask again",
        );
        rejected(
            "Reject\n\nWrong recipient, it goes to finance.\n\n-- \nJane",
            "Wrong recipient, it goes to finance.",
        );
        rejected("Nein, falscher Empfänger", "falscher Empfänger");
        rejected("Don't send it", "");
        rejected("Reject\n\n-- \nJane", "");
        rejected(
            "Reject: the contract is not signed yet, but soon",
            "the contract is not signed yet, but soon",
        );
    }

    /// The corpus of answers people write (`corpus/answers.txt`): nothing that
    /// must not approve approves (false-approve rate 0), and the false-block
    /// rate (approvals read as anything else) is printed beside it and held
    /// at 0 for what the corpus holds.
    #[test]
    fn the_answer_corpus() {
        let mut counts = std::collections::BTreeMap::<&str, (usize, usize)>::new();
        let (mut false_approve, mut false_block, mut misread) =
            (Vec::new(), Vec::new(), Vec::new());
        for line in include_str!("../corpus/answers.txt").lines() {
            let Some((expect, text)) = line.split_once(" | ") else {
                continue;
            };
            let text = text.replace("\\n", "\n");
            let got = match p(&text) {
                Answer::Decided(Verdict::Approved, _) => "approve",
                Answer::Decided(Verdict::Rejected, _) => "reject",
                Answer::NotUnderstood { .. } => "nothing",
                Answer::Later(..) => "later",
            };
            let c = counts.entry(expect).or_default();
            c.0 += 1;
            if got == expect {
                c.1 += 1;
            } else if got == "approve" {
                false_approve.push(text);
            } else if expect == "approve" {
                false_block.push(text);
            } else {
                misread.push((expect, got, text));
            }
        }
        let approvals = counts.get("approve").map_or(0, |c| c.0);
        let others: usize = counts
            .iter()
            .filter(|(k, _)| **k != "approve")
            .map(|(_, c)| c.0)
            .sum();
        println!(
            "answer corpus: false-approve {}/{others}, false-block {}/{approvals}, other misreadings {}",
            false_approve.len(),
            false_block.len(),
            misread.len()
        );
        assert!(false_approve.is_empty(), "approved: {false_approve:?}");
        assert!(
            false_block.is_empty(),
            "approvals not read as such: {false_block:?}"
        );
        assert!(misread.is_empty(), "{misread:?}");
        assert!(approvals >= 50 && others >= 40, "{counts:?}");
    }

    #[test]
    fn an_answer_that_does_not_say_one_thing_decides_nothing() {
        nothing("No problem, approve");
        nothing("Yes, but not before Monday");
        nothing("Approve if the figures are right");
        nothing("ok, wait for Bob");
        nothing("Approved\nbut only after the audit");
        nothing("Approve\n\nActually no, wait for Bob.\n\nOn Mon, x wrote:\n> hi");
        for ambiguous in [
            "Send me the full text first.",
            "Send it to legal first, then we talk.",
            "Approve? Why is this going to Bob?",
            "OK, I'll look at it tomorrow.",
            "Ok, cancel it.",
            "Yes, hold off for now.",
            "Okay, declined.",
            "Ok, we shouldn't send this.",
            "OK, don\u{b4}t send it.",
            "Yes, when Bob confirms.",
            "Approved except for the last paragraph.",
            "Ja nee, lass mal.",
            "Oui, quand Bob confirme.",
            "Approve\n\nActually, don't: -----Original Message----- had the right numbers.",
            "Approved\nBut fix what the agent wrote:\n> | the text",
            "Approve\nAm I the only one? Don't send:",
            "Ja\nVon meinem Standpunkt aus aber erst nach Freitag.",
            "Approve\n--\nno wait",
        ] {
            nothing(ambiguous);
        }
        nothing("Genehmigt, aber erst nach Freitag");
        nothing("Oui mais pas avant lundi");
        nothing("not approved");
        nothing("I think yes is fine");
        nothing("> APPROVE\nmaybe later");
        nothing("approvedish");
        nothing("");
        nothing("On Mon, x wrote:\n> APPROVE");
        nothing("Sent from my iPhone\n\n> APPROVE");
    }

    #[test]
    fn own_words_replace_the_defaults() {
        let v = Vocabulary::new(&["ship it".into()], &["hold".into()]);
        assert_eq!(
            parse("Ship it!", &v),
            Answer::Decided(Verdict::Approved, String::new())
        );
        assert_eq!(
            parse("hold: legal review", &v),
            Answer::Decided(Verdict::Rejected, "legal review".into())
        );
        assert!(matches!(parse("approve", &v), Answer::NotUnderstood { .. }));
    }
}
