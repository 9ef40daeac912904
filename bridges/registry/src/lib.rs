//! The bridge types of this workspace, in one list: `bridges.toml` beside this
//! crate. The broker's core names no bridge type; config loading, the CLI, the
//! page and the tests ask here, and `nix/module.nix` reads the same file for
//! its `type` enum.
//!
//! Invariants:
//! - A type's properties (gated, surface) live here only; code asks
//!   [`kind`], never compares type names.
//! - The list is sorted by name and names are plain lowercase words, so an
//!   identity `TYPE:ID` splits at its first colon.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde::Deserialize;

/// The registry's text, as shipped.
pub const SOURCE: &str = include_str!("../bridges.toml");

/// One bridge type.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Kind {
    /// The `type` of its `[bridges.NAME]` tables (the table's key in `bridges.toml`).
    #[serde(skip)]
    pub name: String,
    /// Every entry waits for approval, and approvers judge the bridge's card
    /// (a declared action), not the agent's fields: no edits.
    pub gated: bool,
    /// People answer on this platform: `TYPE:ID` is an approver identity and
    /// a bridge of this type can show cards.
    pub surface: bool,
    /// Its cards can be brought up again in place (a reply to the card):
    /// `approval.remind_after` works when a bridge of this type shows them.
    pub reminds: bool,
    /// One line for the docs and the NixOS option.
    pub about: String,
}

/// Every bridge type, sorted by name.
pub fn kinds() -> &'static [Kind] {
    static KINDS: OnceLock<Vec<Kind>> = OnceLock::new();
    KINDS.get_or_init(|| parse(SOURCE).unwrap_or_else(|e| panic!("bridges.toml: {e}")))
}

/// The type called `name`, if this workspace ships it.
pub fn kind(name: &str) -> Option<&'static Kind> {
    kinds().iter().find(|k| k.name == name)
}

/// The names of every type, for error messages ("known: a, b").
pub fn names() -> Vec<&'static str> {
    kinds().iter().map(|k| k.name.as_str()).collect()
}

/// Whether bridges of type `name` gate every entry. Unknown types read as
/// gated: a record of a type this build no longer knows is shown and handled
/// the careful way.
pub fn is_gated(name: &str) -> bool {
    kind(name).is_none_or(|k| k.gated)
}

/// Whether bridges of type `name` can remind approvers on their cards.
pub fn reminds(name: &str) -> bool {
    kind(name).is_some_and(|k| k.reminds)
}

fn parse(text: &str) -> Result<Vec<Kind>, String> {
    let table: BTreeMap<String, Kind> = toml::from_str(text).map_err(|e| e.to_string())?;
    let mut kinds = Vec::new();
    for (name, mut kind) in table {
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_lowercase()) {
            return Err(format!("`{name}` is not a plain lowercase word"));
        }
        kind.name = name;
        kinds.push(kind);
    }
    Ok(kinds)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped list parses, and what the rest of the workspace relies on holds.
    #[test]
    fn the_shipped_registry() {
        // Sorted, and holding the types the rest of this test names (a new
        // type needs no edit here: the deploy test checks crates against it).
        let names = names();
        assert!(names.windows(2).all(|w| w[0] < w[1]), "{names:?}");
        for kind in ["console", "discord", "effects", "email", "rebuild"] {
            assert!(names.contains(&kind), "{kind} in {names:?}");
        }
        assert!(kind("effects").is_some_and(|k| k.gated && !k.surface));
        assert!(kind("discord").is_some_and(|k| !k.gated && k.surface));
        assert!(is_gated("gone"), "an unknown type is handled as gated");
        assert!(!is_gated("email"));
    }

    /// A malformed table or name is refused with the reason.
    #[test]
    fn bad_entries_are_refused() {
        assert!(parse("[Bad]\ngated = false\nsurface = true\nabout = \"\"\n").is_err());
        assert!(
            parse("[ok]\ngated = false\n").is_err(),
            "every key is required"
        );
        assert!(parse("[ok]\ngated = false\nsurface = true\nabout = \"\"\nextra = 1\n").is_err());
    }
}
