//! `Authentication-Results` (RFC 8601) parsed by its grammar, not by splitting:
//! comments `( … )` (nested, with quoted pairs) are dropped, quoted strings are
//! one value whatever they hold (`;`, `=`, `(`), and a value is everything
//! written without whitespace between its parts (`"a;b"@example.org`).
//!
//! No maintained crate parses this header (mail-auth only writes it), hence
//! this module. Anything that does not follow the grammar is an error, and the
//! caller treats an error as "not authenticated": a header it cannot read never
//! vouches for anyone.

/// One `method=result` of the header, with its reason and properties.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResInfo {
    /// Lower case, without a version (`dkim`, `dmarc`, `spf`).
    pub method: String,
    /// Lower case (`pass`, `fail`, `none`, ...).
    pub result: String,
    pub reason: Option<String>,
    /// (ptype, property, value), ptype and property lower case.
    pub props: Vec<(String, String, String)>,
}

impl ResInfo {
    /// The value of `ptype.property`, if given.
    pub fn prop(&self, ptype: &str, property: &str) -> Option<&str> {
        self.props
            .iter()
            .find(|(t, p, _)| t == ptype && p == property)
            .map(|(_, _, v)| v.as_str())
    }
}

/// A parsed header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthResults {
    pub authserv_id: String,
    pub results: Vec<ResInfo>,
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    /// A run of ordinary characters, or a quoted string (unquoted already).
    Word {
        text: String,
        quoted: bool,
    },
    Semi,
    Equals,
    Slash,
}

/// A token and whether whitespace or a comment came right before it.
type Spaced = (Tok, bool);

fn lex(text: &str) -> Result<Vec<Spaced>, String> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    let mut spaced = true;
    while let Some(&c) = chars.peek() {
        match c {
            c if c.is_whitespace() => {
                chars.next();
                spaced = true;
            }
            '(' => {
                let mut depth = 0;
                loop {
                    match chars.next() {
                        Some('(') => depth += 1,
                        Some(')') => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        Some('\\') => {
                            chars.next();
                        }
                        Some(_) => {}
                        None => return Err("unclosed comment".into()),
                    }
                }
                spaced = true;
            }
            '"' => {
                chars.next();
                let mut s = String::new();
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => s.extend(chars.next()),
                        Some(c) => s.push(c),
                        None => return Err("unclosed quoted string".into()),
                    }
                }
                out.push((
                    Tok::Word {
                        text: s,
                        quoted: true,
                    },
                    spaced,
                ));
                spaced = false;
            }
            ';' | '=' | '/' => {
                chars.next();
                let t = match c {
                    ';' => Tok::Semi,
                    '=' => Tok::Equals,
                    _ => Tok::Slash,
                };
                out.push((t, spaced));
                spaced = false;
            }
            ')' => return Err("unbalanced `)`".into()),
            _ => {
                let mut s = String::new();
                while let Some(&c) = chars.peek() {
                    if c.is_whitespace() || "();=/\"".contains(c) {
                        break;
                    }
                    s.push(c);
                    chars.next();
                }
                out.push((
                    Tok::Word {
                        text: s,
                        quoted: false,
                    },
                    spaced,
                ));
                spaced = false;
            }
        }
    }
    Ok(out)
}

struct Parser {
    toks: Vec<Spaced>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at).map(|(t, _)| t)
    }

    fn next(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.at).map(|(t, _)| t.clone());
        self.at += 1;
        t
    }

    fn expect(&mut self, want: Tok, what: &str) -> Result<(), String> {
        match self.next() {
            Some(t) if t == want => Ok(()),
            other => Err(format!("expected {what}, found {other:?}")),
        }
    }

    /// A plain word (a keyword: method, result, ptype.property).
    fn word(&mut self, what: &str) -> Result<String, String> {
        match self.next() {
            Some(Tok::Word {
                text,
                quoted: false,
            }) if !text.is_empty() => Ok(text),
            other => Err(format!("expected {what}, found {other:?}")),
        }
    }

    /// A value: words and quoted strings written together, with `/` and `=`
    /// inside them kept (`"x"@example.org`, base64 `b=` values). It ends at
    /// whitespace, a comment, `;` or the end.
    fn value(&mut self, what: &str) -> Result<String, String> {
        let mut out = String::new();
        let mut first = true;
        while let Some((t, spaced)) = self.toks.get(self.at) {
            if !first && *spaced {
                break;
            }
            match t {
                Tok::Word { text, .. } => out.push_str(text),
                Tok::Equals if !first => out.push('='),
                Tok::Slash if !first => out.push('/'),
                _ => break,
            }
            first = false;
            self.at += 1;
        }
        if first {
            return Err(format!("expected {what}"));
        }
        Ok(out)
    }
}

/// Parses one header value (without the `Authentication-Results:` name).
pub fn parse(header: &str) -> Result<AuthResults, String> {
    let mut p = Parser {
        toks: lex(header)?,
        at: 0,
    };
    let authserv_id = p.value("the authserv-id")?;
    // An optional version number follows the authserv-id.
    if let Some(Tok::Word {
        text,
        quoted: false,
    }) = p.peek()
    {
        if text.chars().all(|c| c.is_ascii_digit()) {
            p.next();
        }
    }
    let mut results = Vec::new();
    while p.peek().is_some() {
        p.expect(Tok::Semi, "`;`")?;
        let method = p.word("a method")?.to_ascii_lowercase();
        if method == "none" && p.peek().is_none() && results.is_empty() {
            break;
        }
        if p.peek() == Some(&Tok::Slash) {
            p.next();
            p.word("a method version")?;
        }
        p.expect(Tok::Equals, "`=` after the method")?;
        let result = p.word("a result")?.to_ascii_lowercase();
        let mut info = ResInfo {
            method,
            result,
            reason: None,
            props: Vec::new(),
        };
        while let Some(Tok::Word { .. }) = p.peek() {
            let key = p.word("a property")?.to_ascii_lowercase();
            p.expect(Tok::Equals, "`=` after a property")?;
            let value = p.value("a property value")?;
            if key == "reason" {
                info.reason = Some(value);
                continue;
            }
            let (ptype, property) = key
                .split_once('.')
                .ok_or_else(|| format!("property `{key}` is not ptype.property"))?;
            info.props
                .push((ptype.to_string(), property.to_string(), value));
        }
        results.push(info);
    }
    Ok(AuthResults {
        authserv_id,
        results,
    })
}

/// Whether the topmost `Authentication-Results` header added by `authserv_id`
/// shows `dkim=pass` with `header.d` (or `header.i`) of `domain`, or
/// `dmarc=pass` with `header.from` of `domain`. Headers come in message order
/// (topmost first); only the first one carrying our authserv-id counts, since
/// anything below it may have been written by the sender. If that one does not
/// parse, the answer is no.
pub fn authenticated<'a>(
    headers: impl IntoIterator<Item = &'a str>,
    authserv_id: &str,
    domain: &str,
) -> bool {
    // Picked by its first word alone, so a header of ours that a sender-chosen
    // value makes unparseable is still ours (and then answers no), rather than
    // letting the next header, perhaps the sender's, speak for our server.
    let ours = headers.into_iter().find(|h| {
        h.trim_start()
            .split(|c: char| c.is_whitespace() || c == ';' || c == '(')
            .next()
            .is_some_and(|id| id.eq_ignore_ascii_case(authserv_id))
    });
    let Some(parsed) = ours.and_then(|h| parse(h).ok()) else {
        return false;
    };
    if !parsed.authserv_id.eq_ignore_ascii_case(authserv_id) {
        return false;
    }
    let is_domain = |v: Option<&str>| {
        v.is_some_and(|v| {
            let d = v.rsplit('@').next().unwrap_or(v);
            d.eq_ignore_ascii_case(domain)
        })
    };
    parsed
        .results
        .iter()
        .any(|r| match (r.method.as_str(), r.result.as_str()) {
            ("dkim", "pass") => {
                is_domain(r.prop("header", "d")) || is_domain(r.prop("header", "i"))
            }
            ("dmarc", "pass") => is_domain(r.prop("header", "from")),
            _ => false,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_rfc_examples() {
        let a = parse("example.com; spf=pass smtp.mailfrom=example.net").unwrap();
        assert_eq!(a.authserv_id, "example.com");
        assert_eq!(a.results[0].method, "spf");
        assert_eq!(a.results[0].prop("smtp", "mailfrom"), Some("example.net"));
        let b = parse(
            "example.com 1; auth=pass (cram-md5) smtp.auth=sender@example.net;\r\n spf=pass smtp.mailfrom=example.net; dkim/1=pass reason=\"good sig\" header.i=@example.org",
        )
        .unwrap();
        assert_eq!(b.results.len(), 3);
        assert_eq!(b.results[2].method, "dkim");
        assert_eq!(b.results[2].reason.as_deref(), Some("good sig"));
        assert_eq!(b.results[2].prop("header", "i"), Some("@example.org"));
        assert_eq!(parse("example.org; none").unwrap().results, vec![]);
    }

    /// The attack of the consent issue: a quoted value holding `; dkim=pass`.
    #[test]
    fn quoted_strings_and_comments_cannot_add_results() {
        let forged = r#"mx.example.org; spf=fail smtp.mailfrom="x; dkim=pass header.d=example.org"@evil.test"#;
        let a = parse(forged).unwrap();
        assert_eq!(a.results.len(), 1);
        assert_eq!(
            a.results[0].prop("smtp", "mailfrom"),
            Some("x; dkim=pass header.d=example.org@evil.test")
        );
        assert!(!authenticated([forged], "mx.example.org", "example.org"));
        // With a space before the closing quote, string splitting read a clean pass.
        let spaced = r#"mx.example.org; spf=fail smtp.mailfrom="x; dkim=pass header.d=example.org "@evil.test"#;
        assert!(!authenticated([spaced], "mx.example.org", "example.org"));
        let comment =
            "mx.example.org; spf=fail (; dkim=pass header.d=example.org) smtp.mailfrom=evil.test";
        assert!(!authenticated([comment], "mx.example.org", "example.org"));
        assert!(!authenticated(
            ["mx.example.org; dkim=pass header.d=example.org (unclosed"],
            "mx.example.org",
            "example.org"
        ));
        // Ours does not parse: the answer is no, not the next (forged) header.
        assert!(!authenticated(
            [
                "mx.example.org; spf=fail smtp.mailfrom=\"x",
                "mx.example.org; dkim=pass header.d=example.org"
            ],
            "mx.example.org",
            "example.org"
        ));
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
            ["mx.example.org.evil; dkim=pass header.d=example.org"],
            "mx.example.org",
            "example.org"
        ));
        assert!(!authenticated(
            Vec::<&str>::new(),
            "mx.example.org",
            "example.org"
        ));
    }
}
