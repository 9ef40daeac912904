//! Deployment files: the Nix module's render function against the Rust loader,
//! and the systemd template units. Needs `nix-instantiate` (Debian: nix-bin) and
//! `systemd-analyze` (Debian: systemd); `.ci/run` installs both.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use broker::bridge::Bridge;
use broker::Config;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn tool(name: &str, package: &str) -> Command {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "{name} is missing: install it (Debian: apt-get install -y {package}), as .ci/run does"
    );
    Command::new(name)
}

fn nix_files() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![root().join("nix")];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "nix") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Evaluates render.nix on an example file and returns the TOML text.
fn render(example: &str) -> String {
    nix_eval(&format!(
        "import ./render.nix (import ./examples/{example}.nix)"
    ))
}

/// Evaluates a Nix expression in `nix/`, strictly, as JSON.
fn nix_eval<T: serde::de::DeserializeOwned>(expr: &str) -> T {
    let out = tool("nix-instantiate", "nix-bin")
        .current_dir(root().join("nix"))
        .args(["--eval", "--strict", "--json", "-E", expr])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{expr}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Every .nix file parses.
#[test]
fn every_nix_file_parses() {
    let files = nix_files();
    assert!(files.len() >= 7, "{files:?}");
    for f in files {
        let out = tool("nix-instantiate", "nix-bin")
            .arg("--parse")
            .arg(&f)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            f.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The module's render function produces config the Rust loader accepts,
/// including each console bridge's own settings.
#[test]
fn rendered_examples_load() {
    for example in [
        "minimal",
        "approval-via-another-bridge",
        "per-agent",
        "discord-approved-by-email",
        "slack",
        "effects",
        "sentinels",
        "cluster",
    ] {
        let text = render(example);
        let config = Config::parse(&text).unwrap_or_else(|e| panic!("{example}: {e}\n{text}"));
        // Each bridge crate accepts its own settings (unknown keys would fail here).
        for (name, bridge) in &config.bridges {
            let (_, check) = SETTINGS
                .iter()
                .find(|(kind, _)| *kind == bridge.kind)
                .unwrap_or_else(|| panic!("no settings check for type {}", bridge.kind));
            check(&config, name).unwrap_or_else(|e| panic!("{example}: {e}\n{text}"));
        }
    }
    let c = Config::parse(&render("discord-approved-by-email")).unwrap();
    let mail = email::settings(&c, "email").unwrap();
    assert_eq!(
        mail.smtp.host, "mail.example.org",
        "secrets merge into their table, not over it"
    );
    assert_eq!(
        mail.smtp.password_file.unwrap().to_str(),
        Some("$CREDENTIALS_DIRECTORY/smtp.password_file")
    );
    let c = Config::parse(&render("approval-via-another-bridge")).unwrap();
    let mail = &c.bridges["mail"].approval;
    assert!(mail.required && mail.notify.as_deref() == Some("desk") && mail.timeout == 600);
    assert_eq!(Config::parse(&render("per-agent")).unwrap().agents.len(), 2);
}

/// Reads a bridge's type-specific settings without its secrets.
type SettingsCheck = fn(&Config, &str) -> Result<(), String>;

/// Every bridge crate of the workspace: its `Bridge::TYPE` and how its
/// settings are read. A new bridge crate adds a line here.
const SETTINGS: &[(&str, SettingsCheck)] = &[
    (<console::Console as Bridge>::TYPE, |c, name| {
        c.bridge(name)
            .map_err(|e| e.to_string())?
            .settings::<console::config::ConsoleSettings>(name)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }),
    (<discord::Discord as Bridge>::TYPE, |c, name| {
        discord::settings(c, name)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }),
    (<slack::Slack as Bridge>::TYPE, |c, name| {
        slack::settings(c, name)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }),
    (<email::Email as Bridge>::TYPE, |c, name| {
        email::settings(c, name)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }),
    (<effects::Effects as Bridge>::TYPE, |c, name| {
        c.bridge(name)
            .map_err(|e| e.to_string())?
            .settings::<effects::config::EffectsSettings>(name)
            .and_then(|s| s.validate(name))
            .map_err(|e| e.to_string())
    }),
    (<effects::rebuild::Rebuild as Bridge>::TYPE, |c, name| {
        c.bridge(name).map(|_| ()).map_err(|e| e.to_string())
    }),
];

/// One list of bridge types: the registry the loader, the CLI and the page
/// read is exactly the NixOS module's `type` enum (which reads the same file)
/// and exactly the types the workspace's bridge crates serve.
#[test]
fn the_registry_is_the_module_enum_and_the_crates() {
    let module = std::fs::read_to_string(root().join("nix/module.nix")).unwrap();
    assert!(
        module.contains(
            "registry = builtins.fromTOML (builtins.readFile ../bridges/registry/bridges.toml);"
        ) && module.contains("types.enum (attrNames registry)"),
        "the module's type enum must be read from the registry"
    );
    let in_nix: Vec<String> = nix_eval(
        "builtins.attrNames (builtins.fromTOML (builtins.readFile ../bridges/registry/bridges.toml))",
    );
    assert_eq!(
        in_nix,
        registry::names(),
        "Nix reads the registry as Rust does"
    );
    let mut crates: Vec<&str> = SETTINGS.iter().map(|(kind, _)| *kind).collect();
    crates.sort();
    assert_eq!(
        crates,
        registry::names(),
        "one bridge crate per registry type"
    );
}

fn key_paths(prefix: &str, table: &toml::Table, out: &mut BTreeSet<String>) {
    for (k, v) in table {
        // Names chosen by the user become `*`, as in broker::schema::key_paths.
        let k = if ["agents.", "bridges.", "operators.", "people.", "web.users."].contains(&prefix)
        {
            "*"
        } else {
            k.as_str()
        };
        let path = format!("{prefix}{k}");
        if let toml::Value::Table(t) = v {
            key_paths(&format!("{path}."), t, out);
        }
        out.insert(path);
    }
}

/// The module can express every key of the Rust schema: the maximal example,
/// which sets every option the module renders, covers `broker::schema::key_paths`.
/// A key added to the Rust config fails this until the module (render.nix and
/// its options) gains it.
#[test]
fn the_module_expresses_every_rust_key() {
    let text = render("maximal");
    Config::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let table: toml::Table = toml::from_str(&text).unwrap();
    let mut rendered = BTreeSet::new();
    key_paths("", &table, &mut rendered);
    // `url`, `sentinels` and `cluster` exclude each other: the Sentinels'
    // and the cluster's keys come from their own examples.
    for example in ["sentinels", "cluster"] {
        let other: toml::Table = toml::from_str(&render(example)).unwrap();
        key_paths("", &other, &mut rendered);
    }
    let missing: Vec<String> = broker::schema::key_paths()
        .into_iter()
        .filter(|k| !rendered.contains(k))
        .collect();
    assert!(
        missing.is_empty(),
        "the NixOS module cannot express {missing:?}"
    );
    assert!(
        text.contains("token_file = \"$CREDENTIALS_DIRECTORY/token_file\""),
        "secrets render as credential paths: {text}"
    );
}

/// The template units pass `systemd-analyze verify` with the binaries' paths
/// resolvable, and keep a low exposure score.
#[test]
fn unit_templates_verify() {
    let dir = tempfile::tempdir().unwrap();
    let units = root().join("systemd");
    let cowboy = harness::binary("cowboy");
    for e in std::fs::read_dir(&units).unwrap() {
        let p = e.unwrap().path();
        let dest = dir.path().join(p.file_name().unwrap());
        if p.is_dir() {
            std::fs::create_dir_all(&dest).unwrap();
            for f in std::fs::read_dir(&p).unwrap() {
                let f = f.unwrap().path();
                std::fs::copy(&f, dest.join(f.file_name().unwrap())).unwrap();
            }
        } else {
            let text = std::fs::read_to_string(&p)
                .unwrap()
                .replace("/usr/local/bin/cowboy", cowboy.to_str().unwrap());
            std::fs::write(dest, text).unwrap();
        }
    }
    let unit_path = format!("{}:", dir.path().display());
    let out = tool("systemd-analyze", "systemd")
        .env("SYSTEMD_UNIT_PATH", &unit_path)
        .current_dir(dir.path())
        .args([
            "verify",
            "--man=no",
            "cowboy-ingest@mail.service",
            "cowboy-outbox@mail.service",
            "cowboy-ping@mail.service",
            "cowboy-web.service",
            "cowboy-exporter.service",
            "cowboy.target",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify: {stderr}"
    );
    for unit in [
        "cowboy-ingest@mail.service",
        "cowboy-outbox@mail.service",
        "cowboy-ping@mail.service",
        "cowboy-web.service",
        "cowboy-exporter.service",
    ] {
        let svc = unit;
        let out = Command::new("systemd-analyze")
            .env("SYSTEMD_UNIT_PATH", &unit_path)
            .args(["security", "--offline=yes", "--threshold=20", unit])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "exposure above 2.0 for {svc}: {text}");
        assert!(
            text.contains("Type=notify") || text.contains("Overall exposure"),
            "{text}"
        );
    }
}

/// The module's secret assertion sees secrets at every nesting level of
/// `settings` (and inside lists), not only top-level keys; `*_file` keys pass.
#[test]
fn inline_secrets_are_found_at_any_depth() {
    let expr = r#"import ./secrets.nix { smtp = { host = "h"; password = "x"; password_file = "/f"; }; token_file = "/t"; imap.auth.api_key = "k"; hooks = [ { secret = "s"; } ]; channels = [ "1" ]; }"#;
    let found: Vec<String> = nix_eval(expr);
    assert_eq!(
        found,
        ["hooks.secret", "imap.auth.api_key", "smtp.password"]
    );
}
