//! Handing free heap back to the system: glibc keeps freed pages in its
//! arenas, so a process's RSS stays at its peak after a burst. istiod's
//! scavenger and the agent's footprint code both call this.

/// Releases every free page of every glibc arena (`malloc_trim(0)`); a
/// no-op with other allocators, which return memory on their own. It takes
/// the allocator's locks briefly: call it off latency-sensitive threads.
#[allow(unsafe_code)]
pub fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers, only releases memory the
    // allocator holds as free, and is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
}
