//! The repository guard: git obeys a repository's own config and hooks (where
//! a push goes, programs it runs), so a repository anyone else can write is
//! refused before it is read and before anything runs in it.
//!
//! Invariant: the repository directory, its git directory and the paths in it
//! that decide what git runs or where it pushes (`config`, `hooks` and every
//! hook, `info`, `refs`, `packed-refs`, `objects/info`, `commondir`) are owned
//! by this service's user or root and writable by neither group nor others.
//! A `.git` that is a file (pointing elsewhere) is refused. Checked at start-up
//! (by the ping), when a request is read and again before each run.
//!
//! Limit: another process running as this same user can still write them.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The git directory of `repo`: `repo/.git`, or `repo` itself when bare.
fn git_dir(repo: &Path) -> Result<PathBuf, String> {
    let dot = repo.join(".git");
    match std::fs::symlink_metadata(&dot) {
        Ok(m) if m.is_dir() => Ok(dot),
        Ok(_) => Err(format!(
            "{} is not a directory (a `.git` file or link points elsewhere): refused",
            dot.display()
        )),
        Err(_) if repo.join("HEAD").is_file() && repo.join("config").is_file() => {
            Ok(repo.to_path_buf())
        }
        Err(_) => Err(format!("{} is not a git repository", repo.display())),
    }
}

/// Refuses `repo` unless only this user (or root) can change what git does in it.
pub fn check(repo: &Path) -> Result<(), String> {
    let me = current_uid();
    let dir = git_dir(repo)?;
    let mut paths = vec![repo.to_path_buf(), dir.clone()];
    for name in [
        "config",
        "config.worktree",
        "hooks",
        "info",
        "refs",
        "packed-refs",
        "commondir",
        "objects/info",
        "objects/info/alternates",
        "objects/info/http-alternates",
    ] {
        paths.push(dir.join(name));
    }
    if let Ok(hooks) = std::fs::read_dir(dir.join("hooks")) {
        paths.extend(hooks.flatten().map(|e| e.path()));
    }
    for path in paths {
        let Ok(m) = std::fs::symlink_metadata(&path) else {
            continue; // absent: nothing there to obey
        };
        if m.uid() != me && m.uid() != 0 {
            return Err(format!(
                "{} belongs to uid {}, not to this service (uid {me}) or root: refused",
                path.display(),
                m.uid()
            ));
        }
        if m.mode() & 0o022 != 0 && !m.file_type().is_symlink() {
            return Err(format!(
                "{} is writable by its group or others: refused",
                path.display()
            ));
        }
    }
    Ok(())
}

/// This process's user id, read from `/proc/self` (no unsafe call needed).
fn current_uid() -> u32 {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn repo() -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("cowboy-guard-{}-{}", std::process::id(), rand()));
        std::fs::create_dir_all(dir.join(".git/hooks")).unwrap();
        std::fs::write(dir.join(".git/config"), "").unwrap();
        for p in [dir.clone(), dir.join(".git"), dir.join(".git/hooks")] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        std::fs::set_permissions(
            dir.join(".git/config"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        dir
    }

    fn rand() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    }

    #[test]
    fn a_repository_others_can_write_is_refused() {
        let r = repo();
        assert!(check(&r).is_ok());
        std::fs::set_permissions(
            r.join(".git/config"),
            std::fs::Permissions::from_mode(0o666),
        )
        .unwrap();
        assert!(check(&r).unwrap_err().contains("config"));
        std::fs::set_permissions(
            r.join(".git/config"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        std::fs::write(r.join(".git/hooks/pre-push"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(
            r.join(".git/hooks/pre-push"),
            std::fs::Permissions::from_mode(0o777),
        )
        .unwrap();
        assert!(check(&r).unwrap_err().contains("pre-push"));
    }

    #[test]
    fn a_dot_git_file_is_refused() {
        let r = repo();
        std::fs::remove_dir_all(r.join(".git")).unwrap();
        std::fs::write(r.join(".git"), "gitdir: /tmp/elsewhere\n").unwrap();
        assert!(check(&r).unwrap_err().contains("points elsewhere"));
    }
}
