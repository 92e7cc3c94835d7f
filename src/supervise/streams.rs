//! `wfjail run`'s guest output: its stdout (raw mode: the result, byte for byte) and its
//! stderr (and, framed, its stdout and its LOG records), each line echoed behind
//! [`GUEST_PREFIX`] and escaped, all charged to `limits.output`; the stderr tail kept for the
//! report. A session has its own (one pipe, its own prefix, its phase machine past the bound).

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags};

use crate::echo::{GUEST_PREFIX, LineEcho};

use super::output::OutputMeter;
use super::{STDERR_TAIL, set_nonblocking};

/// One of the guest's two output pipes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// The guest's stdout and stderr, where they go, and their count against `limits.output`.
pub struct Streams<'a> {
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    /// The result (raw mode); `None` when framed (stdout is then a log, echoed).
    out_sink: Option<&'a mut dyn Write>,
    /// The echo of the guest's text (and wfjail's own lines about it).
    err_sink: Option<&'a mut dyn Write>,
    out_echo: LineEcho,
    err_echo: LineEcho,
    tail: Vec<u8>,
    /// Output and frames so far, against `limits.output`.
    pub meter: OutputMeter,
}

impl<'a> Streams<'a> {
    /// The guest's pipes (made non-blocking), written to `out_sink` and echoed on `err_sink`,
    /// bounded by `limit`.
    pub fn new(
        stdout: OwnedFd,
        stderr: OwnedFd,
        out_sink: Option<&'a mut dyn Write>,
        err_sink: Option<&'a mut dyn Write>,
        limit: u64,
    ) -> Self {
        set_nonblocking(&stdout);
        set_nonblocking(&stderr);
        Streams {
            stdout: Some(stdout),
            stderr: Some(stderr),
            out_sink,
            err_sink,
            out_echo: LineEcho::new(GUEST_PREFIX),
            err_echo: LineEcho::new(GUEST_PREFIX),
            tail: Vec::new(),
            meter: OutputMeter::new(limit),
        }
    }

    /// Whether a pipe is still open (the guest, or a descendant, may write).
    pub fn open(&self) -> bool {
        self.stdout.is_some() || self.stderr.is_some()
    }

    /// Adds the open pipes to the caller's poll set.
    pub fn register<'b, T: From<Stream>>(&'b self, fds: &mut Vec<PollFd<'b>>, tokens: &mut Vec<T>) {
        for (fd, s) in [
            (&self.stdout, Stream::Stdout),
            (&self.stderr, Stream::Stderr),
        ] {
            if let Some(fd) = fd {
                fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
                tokens.push(s.into());
            }
        }
    }

    /// Reads once from `which` (at most `buf`'s length), keeps what fits in the bound and
    /// drops the rest; returns whether something did not fit (the caller stops the guest).
    pub fn on_ready(&mut self, which: Stream, buf: &mut [u8]) -> bool {
        let slot = match which {
            Stream::Stdout => &mut self.stdout,
            Stream::Stderr => &mut self.stderr,
        };
        let Some(fd) = slot.as_ref() else {
            return false;
        };
        let (data, open) = read_some(fd, buf);
        if !open {
            *slot = None;
        }
        let room = self.meter.room();
        self.meter.charge(data.len() as u64);
        let exceeded = data.len() > room;
        let data = &data[..data.len().min(room)];
        if which == Stream::Stdout
            && let Some(w) = self.out_sink.as_mut()
        {
            let _ = w.write_all(data); // the result: byte for byte
        } else if let Some(w) = self.err_sink.as_mut() {
            let echo = match which {
                Stream::Stdout => &mut self.out_echo,
                Stream::Stderr => &mut self.err_echo,
            };
            let _ = w.write_all(&echo.feed(data));
        }
        if which == Stream::Stderr {
            self.tail.extend_from_slice(data);
            if self.tail.len() > 2 * STDERR_TAIL {
                self.tail.drain(..self.tail.len() - STDERR_TAIL);
            }
        }
        exceeded
    }

    /// Echoes a LOG record of level `level`, charging what the echo adds (prefix, escapes) to
    /// the bound too, so that an empty LOG costs its printed line.
    pub fn log(&mut self, level: u8, text: &str) {
        let Some(w) = self.err_sink.as_mut() else {
            return;
        };
        let mut e = LineEcho::new(format!("{GUEST_PREFIX}log ({}): ", level_name(level)));
        let mut line = e.feed(text.as_bytes());
        line.extend(e.finish());
        if line.is_empty() {
            line = e.feed(b"\n");
        }
        let added = line.len().saturating_sub(text.len());
        self.meter.charge(added as u64);
        let _ = w.write_all(&line);
    }

    /// A line of wfjail's own about the guest, where its text is echoed.
    pub fn say(&mut self, what: impl std::fmt::Display) {
        if let Some(w) = self.err_sink.as_mut() {
            let _ = writeln!(w, "wfjail: {what}");
        }
    }

    /// Ends the echoes (a last line without its newline) and returns the stderr tail.
    pub fn finish(mut self) -> Vec<u8> {
        if let Some(w) = self.err_sink.as_mut() {
            let _ = w.write_all(&self.out_echo.finish());
            let _ = w.write_all(&self.err_echo.finish());
        }
        if let Some(w) = self.out_sink.as_mut() {
            let _ = w.flush();
        }
        let mut tail = self.tail;
        if tail.len() > STDERR_TAIL {
            tail.drain(..tail.len() - STDERR_TAIL);
        }
        tail
    }
}

/// Reads once from `fd` into `buf` (at most its length: the caller's bound per iteration);
/// returns the bytes read and false at end-of-file. The loop polls again for more, so a
/// guest that writes without pause cannot keep the supervisor here.
pub(super) fn read_some<'b>(fd: &OwnedFd, buf: &'b mut [u8]) -> (&'b [u8], bool) {
    loop {
        match nix::unistd::read(fd, buf) {
            Ok(0) => return (&[], false),
            Ok(n) => return (&buf[..n], true),
            Err(Errno::EINTR) => continue,
            Err(Errno::EAGAIN) => return (&[], true),
            Err(_) => return (&[], false),
        }
    }
}

/// The name of a LOG frame's level (Python's logging levels).
pub fn level_name(level: u8) -> &'static str {
    match level {
        0..=10 => "debug",
        11..=20 => "info",
        21..=30 => "warning",
        _ => "error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipe() -> (OwnedFd, OwnedFd) {
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap()
    }

    #[test]
    fn what_does_not_fit_the_output_bound_is_dropped_and_reported() {
        let ((out_r, out_w), (err_r, _err_w)) = (pipe(), pipe());
        let mut result = Vec::new();
        let mut s = Streams::new(out_r, err_r, Some(&mut result), None, 4);
        let mut buf = [0u8; 64];
        nix::unistd::write(&out_w, b"abc").unwrap();
        assert!(!s.on_ready(Stream::Stdout, &mut buf), "3 of 4 bytes fit");
        nix::unistd::write(&out_w, b"def").unwrap();
        assert!(s.on_ready(Stream::Stdout, &mut buf), "the rest does not");
        drop(out_w);
        assert!(!s.on_ready(Stream::Stdout, &mut buf));
        assert!(s.open(), "stderr is still open");
        let tail = s.finish();
        assert!(tail.is_empty());
        assert_eq!(result, b"abcd", "the result keeps what fits, byte for byte");
    }

    #[test]
    fn stderr_is_echoed_behind_the_guest_prefix_and_its_tail_kept() {
        let ((out_r, _out_w), (err_r, err_w)) = (pipe(), pipe());
        let mut echo = Vec::new();
        let mut s = Streams::new(out_r, err_r, None, Some(&mut echo), 1 << 20);
        let mut buf = [0u8; 64];
        nix::unistd::write(&err_w, b"one\ntw").unwrap();
        assert!(!s.on_ready(Stream::Stderr, &mut buf));
        s.log(20, "");
        let tail = s.finish();
        assert_eq!(tail, b"one\ntw");
        let text = String::from_utf8(echo).unwrap();
        assert!(text.starts_with(&format!("{GUEST_PREFIX}one\n")), "{text}");
        assert!(text.contains("log (info): "), "{text}");
        assert!(
            text.ends_with("tw\n"),
            "the last line ends at finish: {text}"
        );
    }
}
