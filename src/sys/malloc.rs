//! One malloc arena for the agent's and the keeper's threads.
//!
//! glibc's malloc gives each new thread an arena of its own on its first
//! allocation: a 64 MiB region reserved (mapped, trimmed and protected:
//! four system calls), and the arena's first pages faulted in. The agent starts
//! five threads per run, each allocating a little, and never more than one
//! of them allocates at a time in earnest, so their arenas buy nothing:
//! capped at one, every thread shares the main arena (under its lock), and
//! a run makes twenty fewer system calls and holds fewer pages. Measured:
//! 0.1 to 0.2 ms of a 4 ms run (docs/benchmarks.md). `leaseagent serve`,
//! whose many threads do allocate at once, keeps glibc's default.
//!
//! The cap must be set before the first thread allocates: the agent's and
//! the keeper's `main` call [`one_arena`] first thing.

/// Caps glibc's malloc at one arena (`mallopt(M_ARENA_MAX, 1)`); a no-op
/// where the C library is not glibc. Best effort: a refusal leaves the
/// default, which only costs time.
pub fn one_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes a malloc parameter; M_ARENA_MAX with a
    // positive value is documented for any time, and at this point no
    // other thread of this process has been started.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}
