//! `[bridges.NAME]` settings of an effects bridge: its declared actions.
//!
//! Invariants:
//! - An agent can only name a declared action and fill its declared params;
//!   the program and every argument come from here.
//! - A command's placeholders are `{sha}` and `{NAME}` for a declared param;
//!   anything else in braces fails the start-up, naming the key.
//! - A param's pattern must match the whole value (it is anchored here).

use std::collections::BTreeMap;
use std::path::PathBuf;

use broker::error::ConfigError;
use regex::Regex;
use serde::Deserialize;

/// The effects bridge's own keys; any other key fails the start-up.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EffectsSettings {
    /// What agents may ask for, by name.
    #[serde(default)]
    pub actions: BTreeMap<String, Action>,
}

/// One declared action.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Action {
    /// The git repository whose commit an approval binds.
    pub repo: PathBuf,
    /// Program and arguments, run without a shell; `{sha}` and `{PARAM}` are
    /// replaced by the approved values.
    pub command: Vec<String>,
    /// Named params an agent must give, each with the pattern its value must match.
    #[serde(default)]
    pub params: BTreeMap<String, String>,
    /// Seconds the command may run before it is killed.
    #[serde(default = "default_timeout")]
    pub timeout: u64,
    /// The whole environment of the command (nothing is inherited).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// What the commit is shown against (`git log TARGET..SHA`), e.g. `origin/main`.
    #[serde(default)]
    pub target: Option<String>,
    /// Whether running twice is harmless: only then is a run cut off by a crash
    /// run again; otherwise it is reported `uncertain`.
    #[serde(default)]
    pub idempotent: bool,
}

fn default_timeout() -> u64 {
    300
}

/// Param and action names: they appear in placeholders and in keys.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl EffectsSettings {
    /// Checks every action; the error names the offending key.
    pub fn validate(&self, bridge: &str) -> Result<(), ConfigError> {
        if self.actions.is_empty() {
            return Err(ConfigError::invalid(
                format!("bridges.{bridge}.actions"),
                "declare at least one action",
            ));
        }
        for (name, action) in &self.actions {
            let at = format!("bridges.{bridge}.actions.{name}");
            if !valid_name(name) {
                return Err(ConfigError::invalid(
                    at,
                    "action names are 1 to 64 letters, digits, `-` or `_`",
                ));
            }
            check_run(&at, &action.command, action.timeout)?;
            for (param, pattern) in &action.params {
                if !valid_name(param) || param == "sha" {
                    return Err(ConfigError::invalid(
                        format!("{at}.params.{param}"),
                        "param names are 1 to 64 letters, digits, `-` or `_`, and not `sha`",
                    ));
                }
                if let Err(e) = anchored(pattern) {
                    return Err(ConfigError::invalid(
                        format!("{at}.params.{param}"),
                        format!("not a valid pattern: {e}"),
                    ));
                }
            }
            for arg in &action.command {
                for placeholder in placeholders(arg) {
                    if placeholder != "sha" && !action.params.contains_key(placeholder) {
                        return Err(ConfigError::invalid(
                            format!("{at}.command"),
                            format!(
                                "`{{{placeholder}}}` is neither `{{sha}}` nor a declared param"
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

/// What every run needs: a program, and a timeout of at least a second. `at`
/// is the table the keys are in.
pub fn check_run(at: &str, command: &[String], timeout: u64) -> Result<(), ConfigError> {
    if command.first().is_none_or(|p| p.is_empty()) {
        return Err(ConfigError::invalid(
            format!("{at}.command"),
            "must name a program",
        ));
    }
    if timeout == 0 {
        return Err(ConfigError::invalid(
            format!("{at}.timeout"),
            "must be at least 1 second",
        ));
    }
    Ok(())
}

/// A pattern that must match a whole value.
pub fn anchored(pattern: &str) -> Result<Regex, regex::Error> {
    Regex::new(&format!("^(?:{pattern})$"))
}

/// The names inside `{...}` in one argument.
fn placeholders(arg: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = arg;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        match after.find('}') {
            Some(close) => {
                out.push(&after[..close]);
                rest = &after[close + 1..];
            }
            None => break,
        }
    }
    out
}

impl Action {
    /// The argv after substitution: `{sha}` and each `{PARAM}` replaced. Values
    /// are whole arguments' parts, never split or shell-interpreted.
    /// One pass over each argument: a value is never read for placeholders.
    pub fn argv(&self, sha: &str, params: &BTreeMap<String, String>) -> Vec<String> {
        self.command
            .iter()
            .map(|arg| {
                let mut out = String::new();
                let mut rest = arg.as_str();
                while let Some(open) = rest.find('{') {
                    out.push_str(&rest[..open]);
                    let after = &rest[open + 1..];
                    let Some(close) = after.find('}') else {
                        out.push_str(&rest[open..]);
                        rest = "";
                        break;
                    };
                    let name = &after[..close];
                    match (name, params.get(name)) {
                        ("sha", _) => out.push_str(sha),
                        (_, Some(value)) => out.push_str(value),
                        _ => out.push_str(&rest[open..open + close + 2]),
                    }
                    rest = &after[close + 1..];
                }
                out.push_str(rest);
                out
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn action(command: &[&str], params: &[(&str, &str)]) -> Action {
        Action {
            repo: "/srv/site".into(),
            command: command.iter().map(|s| s.to_string()).collect(),
            params: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            timeout: 300,
            env: BTreeMap::new(),
            target: None,
            idempotent: false,
        }
    }

    #[test]
    fn placeholders_must_be_sha_or_a_declared_param() {
        let ok = EffectsSettings {
            actions: BTreeMap::from([(
                "push".to_string(),
                action(
                    &["git", "push", "origin", "{sha}:refs/heads/{branch}"],
                    &[("branch", "[a-z]+")],
                ),
            )]),
        };
        assert!(ok.validate("d").is_ok());
        let bad = EffectsSettings {
            actions: BTreeMap::from([("push".to_string(), action(&["rm", "{path}"], &[]))]),
        };
        let e = bad.validate("d").unwrap_err().to_string();
        assert!(e.contains("bridges.d.actions.push.command"), "{e}");
    }

    #[test]
    fn patterns_match_whole_values() {
        let re = anchored("[a-z]+").unwrap();
        assert!(re.is_match("main"));
        assert!(!re.is_match("main; rm -rf /"));
    }

    #[test]
    fn a_value_is_never_substituted_again() {
        let a = action(&["echo", "{a}-{b}"], &[("a", ".*"), ("b", ".*")]);
        let params = BTreeMap::from([
            ("a".to_string(), "{b}".to_string()),
            ("b".to_string(), "{sha}".to_string()),
        ]);
        assert_eq!(a.argv("abc", &params), ["echo", "{b}-{sha}"]);
    }

    #[test]
    fn substitution_keeps_arguments_whole() {
        let a = action(
            &["git", "push", "origin", "{sha}:refs/heads/{branch}"],
            &[("branch", ".*")],
        );
        let params = BTreeMap::from([("branch".to_string(), "a b".to_string())]);
        assert_eq!(
            a.argv("abc", &params),
            ["git", "push", "origin", "abc:refs/heads/a b"]
        );
    }
}
