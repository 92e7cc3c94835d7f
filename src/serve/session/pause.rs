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
    /// looks at it once, [`STOP_WAIT`] later ([`Session::confirm_stop`]).
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

    /// Whether the stop sent last holds: looked at once, [`STOP_WAIT`] after SIGSTOP, if no
    /// call resumed the guest before (a call's SIGCONT ends the wait unlooked, as it always
    /// did). A guest not stopped by then (nor gone) fails the session. One `/proc` read for
    /// a run idle that long, none for a call that comes sooner: the kernel stops the guest
    /// whether or not the session looks, so earlier looks (every millisecond until it
    /// showed stopped: ~2.6 reads and loop turns per call in a real worker) changed no
    /// outcome; this one is stricter (a guest continued by its own processes since shows
    /// running, and fails).
    pub(super) fn confirm_stop(&mut self) -> Result<(), Failure> {
        let (Some(sent), true) = (self.stop_unconfirmed, self.stopped) else {
            self.stop_unconfirmed = None;
            return Ok(());
        };
        if sent.elapsed() < STOP_WAIT {
            return Ok(());
        }
        self.stop_unconfirmed = None;
        if self.guest_process().is_none() {
            return Ok(());
        }
        match self.guest_stat().map(|s| s.state) {
            Some(b'T' | b't' | b'Z' | b'X') | None => Ok(()),
            Some(_) => {
                crate::serve::waits::timed_out(crate::serve::waits::Wait::GuestStop);
                Err(Failure::NoStop(STOP_WAIT))
            }
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
