//! The text of a mail as its writer saw it: format=flowed (RFC 3676) joined
//! back into paragraphs, HTML-only mail turned into text with block elements
//! ending lines (by `html2text`), quotes kept as `>` lines for the reader of
//! answers.

use mail_parser::{MessagePart, MimeHeaders, PartType};

/// The first text body of `mail`, decoded as above.
pub fn text_of(mail: &mail_parser::Message<'_>) -> String {
    let Some(part) = mail.text_body.first().and_then(|i| mail.part(*i)) else {
        return String::new();
    };
    text_of_part(part)
}

fn text_of_part(part: &MessagePart<'_>) -> String {
    let param = |name: &str| {
        part.content_type()
            .and_then(|ct| ct.attribute(name))
            .map(|v| v.to_ascii_lowercase())
    };
    match &part.body {
        PartType::Text(text) if param("format").as_deref() == Some("flowed") => {
            unflow(text, param("delsp").as_deref() == Some("yes"))
        }
        PartType::Text(text) => text.to_string(),
        PartType::Html(html) => html_to_text(html),
        _ => String::new(),
    }
}

/// HTML to text: every block element ends a line, blockquotes become `>`
/// lines, nothing is wrapped.
pub fn html_to_text(html: &str) -> String {
    html2text::config::plain()
        .string_from_read(html.as_bytes(), 10_000)
        .unwrap_or_default()
}

/// Joins format=flowed lines (a line ending in a space continues on the next
/// line of the same quote depth), removes space-stuffing, and with `delsp`
/// the space that marked the soft break.
pub fn unflow(text: &str, delsp: bool) -> String {
    let mut out: Vec<String> = Vec::new();
    // The paragraph being joined: (quote depth, text).
    let mut open: Option<(usize, String)> = None;
    for raw in text.split('\n') {
        let raw = raw.strip_suffix('\r').unwrap_or(raw);
        let depth = raw.chars().take_while(|c| *c == '>').count();
        let mut line = &raw[depth..];
        if line.starts_with(' ') {
            line = &line[1..]; // space-stuffing (or the space after the quote marks)
        }
        let signature = line == "-- ";
        let soft = line.ends_with(' ') && !signature;
        let piece = if soft && delsp {
            &line[..line.len() - 1]
        } else {
            line
        };
        match &mut open {
            Some((d, acc)) if *d == depth => acc.push_str(piece),
            _ => {
                if let Some((d, acc)) = open.take() {
                    out.push(quoted(d, &acc));
                }
                open = Some((depth, piece.to_string()));
            }
        }
        if !soft {
            if let Some((d, acc)) = open.take() {
                out.push(quoted(d, &acc));
            }
        }
    }
    if let Some((d, acc)) = open.take() {
        out.push(quoted(d, &acc));
    }
    out.join("\n")
}

fn quoted(depth: usize, text: &str) -> String {
    match depth {
        0 => text.to_string(),
        d => format!("{} {text}", ">".repeat(d)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flowed_lines_join_and_quotes_stay() {
        let text = "REJECT the wording is wrong until the contract is \r\nsigned by both parties.\r\n\r\n> On Mon, x wrote:\r\n> a long quoted \r\n> line\r\n";
        assert_eq!(
            unflow(text, false),
            "REJECT the wording is wrong until the contract is signed by both parties.\n\n> On Mon, x wrote:\n> a long quoted line\n"
        );
        assert_eq!(unflow("one \ntwo", true), "onetwo");
        assert_eq!(unflow("-- \nJane", false), "-- \nJane");
    }

    #[test]
    fn html_blocks_end_lines() {
        let html = "<div>wrong recipient</div><hr><div id=\"divRplyFwdMsg\"><b>From:</b> bridge@x &lt;bridge@x&gt;<br><b>Sent:</b> Monday</div>";
        let text = html_to_text(html);
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        assert_eq!(lines[0], "wrong recipient", "{text}");
        assert!(lines.iter().any(|l| l.starts_with("From:")), "{text}");
        let yahoo = html_to_text("<div>Approved</div><div><br></div><div>Thanks, Jane</div>");
        assert!(
            yahoo.lines().next().unwrap().trim() == "Approved",
            "{yahoo}"
        );
    }
}
