//! Between calls the guest is stopped (SIGSTOP after its answer, SIGCONT with the next call
//! or at CLOSE), so that it runs no code the worker did not ask for.

use std::time::Instant;

use crate::sys;

use super::super::phases::Failure;
use super::*;

impl Session {
    /// Stops the guest after it answered, so that it runs no code between calls (a guest
    /// could answer and go on working, from code after its reply or a signal handler).
    /// SIGSTOP cannot be caught or ignored, and as it comes from an ancestor PID namespace it
    /// stops a guest that is PID 1 too. The kernel stops it as soon as it runs (a running
    /// guest is interrupted at once); the answer does not wait for that, the event loop
    /// confirms it ([`Session::confirm_stop`]).
    pub(super) fn stop_guest(&mut self) -> Result<(), Failure> {
        if self.stopped || self.ended() {
            return Ok(());
        }
        let Some((_, pidfd)) = self.guest_process() else {
            return Err(Failure::NoPid);
        };
        if sys::pidfd_send_signal(pidfd, libc::SIGSTOP).is_err() {
            return Ok(()); // it is gone: its exit is on the way
        }
        self.stopped = true;
        self.stop_unconfirmed = Some(Instant::now());
        Ok(())
    }

    /// Whether the stop sent last is confirmed by the kernel (or moot: the guest runs again,
    /// or is gone); a guest still not stopped [`STOP_WAIT`] after SIGSTOP fails the session.
    pub(super) fn confirm_stop(&mut self) -> Result<(), Failure> {
        let (Some(sent), true) = (self.stop_unconfirmed, self.stopped) else {
            self.stop_unconfirmed = None;
            return Ok(());
        };
        if self.guest_process().is_none() {
            self.stop_unconfirmed = None;
            return Ok(());
        }
        match self.guest_stat().map(|s| s.state) {
            Some(b'T' | b't' | b'Z' | b'X') | None => {
                self.stop_unconfirmed = None;
                Ok(())
            }
            Some(_) if sent.elapsed() >= STOP_WAIT => {
                self.stop_unconfirmed = None;
                crate::serve::waits::timed_out(crate::serve::waits::Wait::GuestStop);
                Err(Failure::NoStop(STOP_WAIT))
            }
            Some(_) => Ok(()),
        }
    }

    /// Lets a stopped guest run again (a call begins, or it is to exit).
    pub(super) fn resume_guest(&mut self) {
        self.stop_unconfirmed = None;
        if !std::mem::take(&mut self.stopped) {
            return;
        }
        // The peak address space is a high-water mark: a sample taken a sampling period
        // into the call sees everything before it, so a short call costs no read of /proc.
        self.samples.sampled();
        if let Some((_, pidfd)) = self.guest_process() {
            let _ = sys::pidfd_send_signal(pidfd, libc::SIGCONT);
        }
    }
}
