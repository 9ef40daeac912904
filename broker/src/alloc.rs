//! Giving freed memory back to the system after a burst.
//!
//! A restart with many parked entries reads them in pages; once recovery is
//! done the pages are freed, but glibc's allocator keeps freed heap mapped for
//! reuse, so the process would hold about half again what parking the same
//! entries cost. The thresholds are fixed at start-up and the heap trimmed
//! once after the burst. Elsewhere (musl, other allocators) this does nothing.

/// Fixes glibc's thresholds, once at start-up before any thread: a block of
/// 128 KiB or more is mapped on its own and unmapped when freed, and free
/// heap above 128 KiB at the top of an arena is handed back. glibc raises
/// both by itself after a large block is freed (up to 32 MiB), after which
/// the memory of a recovery's pages (read on the runtime's worker threads,
/// in their own arenas, where `malloc_trim` cannot reach the top) would
/// stay with the process.
pub fn fix_thresholds() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets the allocator's parameters; called before
    // any other thread exists, it races with no allocation.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 * 1024);
    }
}

/// Returns the allocator's free heap to the system. Cheap enough for once per
/// recovery; not for a hot loop.
pub fn release_freed() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists; it takes
    // no pointer from us and is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
