//! Secrets: only paths to them sit in the config; they are read at start-up.

use std::path::{Path, PathBuf};

use crate::error::ConfigError;

/// Resolves a secret file path: a leading `$CREDENTIALS_DIRECTORY` is replaced by
/// that environment variable (set by systemd for units with `LoadCredential=`), so
/// one config file serves every unit even though each has its own credentials dir.
pub fn secret_path(path: &Path) -> PathBuf {
    let text = path.to_string_lossy();
    match (
        text.strip_prefix("$CREDENTIALS_DIRECTORY"),
        std::env::var_os("CREDENTIALS_DIRECTORY"),
    ) {
        (Some(rest), Some(dir)) => PathBuf::from(dir).join(rest.trim_start_matches('/')),
        _ => path.to_path_buf(),
    }
}

/// Reads a secret (password, token) from its file: the first line, without its newline.
pub fn read_secret(key: &str, path: &Path) -> Result<String, ConfigError> {
    let path = secret_path(path);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| ConfigError::invalid(key, format!("cannot read {}: {e}", path.display())))?;
    let secret = text.lines().next().unwrap_or("").to_string();
    if secret.is_empty() {
        return Err(ConfigError::invalid(
            key,
            format!("{} is empty", path.display()),
        ));
    }
    Ok(secret)
}
