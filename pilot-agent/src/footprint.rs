//! Gives back the memory the agent touched for work it has finished.
//!
//! The agent's steady job is a few sockets and a timer, but its resident set
//! after start-up is mostly pages it will not touch again until the next
//! certificate rotation: the code and read-only data of the binary and of libc
//! that parsed the command line and configuration, generated the key, signed
//! the CSR and dialled istiod (the kernel maps file pages 64 KiB around each
//! fault, so a binary's whole text soon counts), and heap the allocator keeps
//! after those buffers were freed. After start-up and after each rotation the
//! agent unmaps the unmodified file-backed pages of its read-only mappings
//! (they stay in the page cache, shared; a later access maps them again from
//! there) and asks the allocator to return free heap to the system. What the
//! agent then keeps resident is what its steady work touches.
//!
//! Only mappings that are read-only and hold no private (copied-on-write)
//! page are released: dropping a private page would lose its contents (for
//! example relocated pointers in RELRO data), while an unmodified file page is
//! identical to the file's.

use std::io;

use thiserror::Error;

/// Why releasing memory failed.
#[derive(Debug, Error)]
pub enum FootprintError {
    /// `/proc/self/smaps` could not be read.
    #[error("reading /proc/self/smaps: {0}")]
    Smaps(io::Error),
}

/// What one release gave back.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// Resident KiB of file-backed read-only mappings that were unmapped.
    pub file_kib: u64,
    /// Mappings released.
    pub mappings: usize,
}

/// One mapping of `/proc/self/smaps` that may be released.
#[derive(Debug, PartialEq, Eq)]
struct Candidate {
    start: usize,
    len: usize,
    rss_kib: u64,
}

/// The read-only, file-backed mappings of `smaps` with resident pages and no
/// private (anonymous) page among them.
fn candidates(smaps: &str) -> Vec<Candidate> {
    let mut out = Vec::new();
    let mut current: Option<(usize, usize, bool)> = None;
    let mut rss_kib = 0;
    let mut finish = |current: &mut Option<(usize, usize, bool)>, rss: u64, anon: u64| {
        if let Some((start, end, eligible)) = current.take()
            && eligible
            && rss > 0
            && anon == 0
        {
            out.push(Candidate {
                start,
                len: end - start,
                rss_kib: rss,
            });
        }
    };
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else { continue };
        if let Some((lo, hi)) = first.split_once('-')
            && let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
        {
            let perms = fields.next().unwrap_or_default();
            let path = fields.nth(3).unwrap_or_default();
            // A path that is a file (not [heap], [stack], [vdso], ...), mapped
            // private and without write permission.
            let eligible = path.starts_with('/')
                && perms.starts_with('r')
                && !perms.contains('w')
                && perms.ends_with('p');
            current = Some((lo, hi, eligible));
            rss_kib = 0;
            continue;
        }
        match first {
            "Rss:" => rss_kib = fields.next().and_then(|v| v.parse().ok()).unwrap_or(0),
            "Anonymous:" => {
                // The last field read for a mapping we need; an absent one
                // would leave the mapping alone.
                let anon = fields
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(u64::MAX);
                finish(&mut current, rss_kib, anon);
            }
            _ => {}
        }
    }
    out
}

/// Unmaps the resident pages of read-only file mappings and trims the heap.
/// Blocking (reads `/proc`): run it off the async runtime.
pub fn release() -> Result<Released, FootprintError> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").map_err(FootprintError::Smaps)?;
    let mut released = Released::default();
    for c in candidates(&smaps) {
        if advise_dontneed(c.start, c.len) {
            released.file_kib += c.rss_kib;
            released.mappings += 1;
        }
    }
    common::memory::release_free_heap();
    Ok(released)
}

/// `madvise(MADV_DONTNEED)` on a read-only private file mapping: its pages are
/// unmapped and, being unmodified, read again from the page cache on the
/// next access.
#[allow(unsafe_code)]
fn advise_dontneed(start: usize, len: usize) -> bool {
    // SAFETY: the range is a whole mapping of this process read from
    // /proc/self/smaps, read-only and with no private page, so dropping its
    // pages loses nothing: the kernel maps the same file contents again on the
    // next access. No Rust reference can observe the difference.
    let rc = unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED) };
    rc == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55d0a0000000-55d0a0100000 r--p 00000000 fe:01 123 /usr/local/bin/pilot-agent
Rss:                 512 kB
Anonymous:             0 kB
55d0a0100000-55d0a0500000 r-xp 00100000 fe:01 123 /usr/local/bin/pilot-agent
Rss:                4096 kB
Anonymous:             0 kB
55d0a0500000-55d0a0600000 r--p 00500000 fe:01 123 /usr/local/bin/pilot-agent
Rss:                 200 kB
Anonymous:           200 kB
55d0a0600000-55d0a0610000 rw-p 00600000 fe:01 123 /usr/local/bin/pilot-agent
Rss:                  64 kB
Anonymous:            64 kB
55d0a1000000-55d0a1100000 rw-p 00000000 00:00 0 [heap]
Rss:                 300 kB
Anonymous:           300 kB
7f0000000000-7f0000200000 r-xp 00000000 fe:01 456 /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                1500 kB
Anonymous:             0 kB
7f0000300000-7f0000301000 r--s 00000000 fe:01 789 /some/shared/file
Rss:                   4 kB
Anonymous:             0 kB
7f0000400000-7f0000402000 r-xp 00000000 00:00 0 [vdso]
Rss:                   8 kB
Anonymous:             0 kB
7f0000500000-7f0000600000 r--p 00000000 fe:01 456 /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                   0 kB
Anonymous:             0 kB
";

    #[test]
    fn only_unmodified_read_only_private_file_mappings_are_released() {
        let got = candidates(SMAPS);
        assert_eq!(
            got,
            vec![
                Candidate {
                    start: 0x55d0a0000000,
                    len: 0x100000,
                    rss_kib: 512
                },
                Candidate {
                    start: 0x55d0a0100000,
                    len: 0x400000,
                    rss_kib: 4096
                },
                Candidate {
                    start: 0x7f0000000000,
                    len: 0x200000,
                    rss_kib: 1500
                },
            ]
        );
    }

    #[test]
    fn a_mapping_without_an_anonymous_field_is_left_alone() {
        let smaps = "\
55d0a0000000-55d0a0100000 r-xp 00000000 fe:01 123 /bin/x
Rss:                 512 kB
";
        assert!(candidates(smaps).is_empty());
    }

    #[test]
    fn releasing_keeps_the_process_working() {
        let before = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let released = release().expect("release");
        assert!(released.mappings > 0, "nothing released: {released:?}");
        // Code and read-only data are mapped again on use: this test, the
        // formatter and the allocator still run.
        let after = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        assert!(before.contains("VmRSS") && after.contains("VmRSS"));
        assert_eq!(format!("{:?}", vec![1, 2, 3]), "[1, 2, 3]");
    }
}
