//! Ctrl-C stops the current generation instead of killing the process: the handler only sets
//! a flag (the one thing a signal handler may safely do) that the token loop reads.

use std::sync::atomic::{AtomicBool, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Routes SIGINT to the flag from now on.
pub fn catch_interrupt() {
    #[cfg(unix)]
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(
            libc::SIGINT,
            on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
    }
}

/// Whether Ctrl-C came since the last `clear`.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

pub fn clear() {
    INTERRUPTED.store(false, Ordering::SeqCst);
}

/// Exit status of a process ended by Ctrl-C, as shells report it (128 + SIGINT).
pub const EXIT_INTERRUPTED: u8 = 130;

/// Gives SIGINT back its default action (end the process).
pub fn default_interrupt() {
    #[cfg(unix)]
    // SAFETY: restoring the default disposition.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
    }
}
