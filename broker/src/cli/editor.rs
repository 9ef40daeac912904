//! Editing a message in `$VISUAL`/`$EDITOR` for `cowboy approvals edit`.

use crate::error::{Error, Result};

/// Opens `$VISUAL`/`$EDITOR` (default `vi`) on `text`, on a terminal only, and
/// returns what was saved.
pub fn in_editor(text: &str) -> Result<String> {
    use std::io::IsTerminal;
    let fail = |why: String| Error::platform(false, why);
    if !std::io::stdin().is_terminal() {
        return Err(Error::usage(
            "no --content, --content-file, --subject or --channel, and no terminal for $EDITOR",
        ));
    }
    let editor = std::env::var("VISUAL")
        .or_else(|_| std::env::var("EDITOR"))
        .unwrap_or_else(|_| "vi".into());
    let dir = std::env::temp_dir().join(format!("cowboy-edit-{}", std::process::id()));
    std::fs::create_dir(&dir).map_err(|e| fail(format!("{}: {e}", dir.display())))?;
    let path = dir.join("message.txt");
    let result = (|| {
        std::fs::write(&path, text).map_err(|e| fail(format!("{}: {e}", path.display())))?;
        // The editor may carry arguments (`code --wait`); no shell is involved.
        let mut argv = editor.split_whitespace();
        let program = argv.next().unwrap_or("vi");
        let status = std::process::Command::new(program)
            .args(argv)
            .arg(&path)
            .status()
            .map_err(|e| fail(format!("{editor}: {e}")))?;
        if !status.success() {
            return Err(Error::refused(format!(
                "{editor} exited with {status}: nothing edited"
            )));
        }
        std::fs::read_to_string(&path).map_err(|e| fail(format!("{}: {e}", path.display())))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}
