//! Local scratch space (`/tmp` in Lambda): how much is free, and whether a
//! file fits before it is written.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Scratch names handed out in this process.
static SCRATCH_NAMES: AtomicU64 = AtomicU64::new(0);

/// A path in `dir` no other run uses: `<stem>-<pid>-<n>`, `n` unique within
/// the process and the process id keeping two processes sharing `/tmp`
/// apart. Named by the job alone, two runs of one job in one process (a
/// lease taken over in the same sandbox, two tests of the same bytes)
/// would clear each other's files. Whatever a crashed process left at the
/// name is its, and the caller may clear it.
pub fn unique_path(dir: &Path, stem: &str) -> PathBuf {
    let n = SCRATCH_NAMES.fetch_add(1, Ordering::Relaxed);
    dir.join(format!("{stem}-{}-{n}", std::process::id()))
}

/// Whether `input_bytes` fit with `free_bytes` free and `reserve` to spare;
/// the refusal names the numbers and the setting to raise. Pure.
pub fn check_fits(
    input_bytes: u64,
    free_bytes: u64,
    reserve: u64,
    dir: &Path,
) -> Result<(), String> {
    let needed = input_bytes.saturating_add(reserve);
    if needed > free_bytes {
        return Err(format!(
            "the input ({input_bytes} bytes) does not fit in {}: {free_bytes} bytes free, \
             {needed} needed with the outputs' reserve (raise the function's ephemeral storage)",
            dir.display()
        ));
    }
    Ok(())
}

/// Free bytes for an unprivileged writer in the file system holding `dir`.
pub fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statvfs the call fills.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stats) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(stats.f_bavail as u64 * stats.f_frsize as u64)
}

/// Whether `bytes` more fit in `dir` with `reserve` to spare.
pub fn ensure_room(dir: &Path, bytes: u64, reserve: u64) -> Result<(), String> {
    let free = free_bytes(dir).map_err(|e| format!("free space of {}: {e}", dir.display()))?;
    check_fits(bytes, free, reserve, dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_paths_differ_for_the_same_stem() {
        let dir = Path::new("/tmp");
        let a = unique_path(dir, "mediaonce-k");
        let b = unique_path(dir, "mediaonce-k");
        assert_ne!(a, b);
        let name = a.file_name().unwrap().to_str().unwrap();
        assert!(name.starts_with(&format!("mediaonce-k-{}-", std::process::id())), "{name}");
    }
}
