//! Giving freed memory back to the system after a burst.
//!
//! A restart with many parked entries reads them in pages; once recovery is
//! done the pages are freed, but glibc's allocator keeps freed heap mapped for
//! reuse, so the process would hold about half again what parking the same
//! entries cost. Trimming once, after the burst, returns it. Elsewhere (musl,
//! other allocators) this does nothing.

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
