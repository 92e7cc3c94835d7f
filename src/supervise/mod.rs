//! The parent while the guest runs: set-up records, seccomp notifications, the guest's output
//! (bounded), the wall-clock timeout, and the exit. One `poll` loop, no threads.

pub mod decode;
pub mod paths;

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::policy::{OnViolation, Policy};
use crate::process::Spawned;
use crate::process::channel::{self, ChildMsg, Received, Step};
use crate::report::{Action, Violation};
use crate::sys::{self, NotifAnswer, NotifBuf, Reaped};

/// How long to keep reading the guest's output after it exited (descendants that escaped a
/// missing PID namespace may hold the pipes open).
const DRAIN_GRACE: Duration = Duration::from_millis(500);
/// Distinct violations kept in a report; repeats are counted, further kinds are dropped.
const MAX_DISTINCT_VIOLATIONS: usize = 256;
/// Bytes of stderr kept for the report.
pub const STDERR_TAIL: usize = 4096;

/// Where the guest's output goes.
pub struct Sinks<'a> {
    /// The guest's stdout (raw mode: the result).
    pub stdout: Option<&'a mut dyn Write>,
    /// Echo the guest's stderr live to ours.
    pub stderr: Option<&'a mut dyn Write>,
    /// Print a one-line summary of each new violation here.
    pub violations: Option<&'a mut dyn Write>,
}

/// Supervision settings.
pub struct Config {
    pub timeout: Option<Duration>,
    pub output_limit: u64,
    /// What the policy lets the guest write (watched writes are checked against it).
    pub write_grants: paths::WriteGrants,
}

/// The guest's pipes, parent ends.
pub struct GuestPipes {
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// What happened, before classification into a report.
#[derive(Debug, Default)]
pub struct Outcome {
    pub reaped: Option<Reaped>,
    pub duration: Duration,
    pub timed_out: bool,
    pub output_exceeded: bool,
    /// A required step failed in the child (no guest ran).
    pub fatal: Option<(Step, Errno)>,
    /// Best-effort steps that failed.
    pub degraded: Vec<(Step, Errno)>,
    /// A seccomp listener was received: violations are named.
    pub notify: bool,
    /// The set-up channel reached end-of-file without a fatal record: exec succeeded.
    pub exec_confirmed: bool,
    pub violations: Vec<Violation>,
    pub killed_for_violation: bool,
    pub stderr_tail: Vec<u8>,
    /// A malformed set-up record (a bug or a hostile child).
    pub channel_error: Option<String>,
}

fn set_nonblocking(fd: &OwnedFd) {
    if let Ok(flags) = fcntl(fd, FcntlArg::F_GETFL) {
        let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
        let _ = fcntl(fd, FcntlArg::F_SETFL(flags));
    }
}

/// Reads what is available from `fd` into `buf`; returns false at end-of-file.
fn read_available(fd: &OwnedFd, buf: &mut [u8], mut on_data: impl FnMut(&[u8])) -> bool {
    loop {
        match nix::unistd::read(fd, buf) {
            Ok(0) => return false,
            Ok(n) => on_data(&buf[..n]),
            Err(Errno::EINTR) => continue,
            Err(Errno::EAGAIN) => return true,
            Err(_) => return false,
        }
    }
}

/// The violation bookkeeping for one execution.
struct Violations<'a> {
    list: Vec<Violation>,
    index: HashMap<(String, String, &'static str), usize>,
    echo: Option<&'a mut dyn Write>,
}

impl Violations<'_> {
    fn record(&mut self, v: Violation) {
        let key = (v.syscall.clone(), v.args.clone(), v.action.as_str());
        if let Some(&i) = self.index.get(&key) {
            self.list[i].count += 1;
            return;
        }
        if self.list.len() >= MAX_DISTINCT_VIOLATIONS {
            return;
        }
        if let Some(w) = self.echo.as_mut() {
            let _ = writeln!(w, "{}", v.summary());
        }
        self.index.insert(key, self.list.len());
        self.list.push(v);
    }
}

/// Supervises `child` until it exits (and its output is drained).
pub fn supervise(
    child: Spawned,
    pipes: GuestPipes,
    policy: &Policy,
    cfg: &Config,
    sinks: Sinks<'_>,
) -> Outcome {
    let Sinks {
        stdout: mut out_sink,
        stderr: mut err_sink,
        violations: echo,
    } = sinks;
    let mut o = Outcome::default();
    let mut violations = Violations {
        list: vec![],
        index: HashMap::new(),
        echo,
    };
    let mut chan = Some(child.chan);
    let mut listener: Option<OwnedFd> = None;
    let mut notif_buf: Option<NotifBuf> = None;
    let mut stdout = Some(pipes.stdout);
    let mut stderr = Some(pipes.stderr);
    for fd in [&stdout, &stderr, &chan].into_iter().flatten() {
        set_nonblocking(fd);
    }
    let deadline = cfg.timeout.map(|t| child.started + t);
    let mut exited_at: Option<Instant> = None;
    let mut initial_exec_done = false;
    let mut output: u64 = 0;
    let mut tail: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    // Kill the guest (and, as PID 1 of its namespace, everything it started).
    let kill = || {
        let _ = sys::pidfd_send_signal(child.pidfd.as_fd(), libc::SIGKILL);
    };

    loop {
        if let Some(t) = exited_at
            && (chan.is_none() && stdout.is_none() && stderr.is_none() || t.elapsed() > DRAIN_GRACE)
        {
            break;
        }
        // Poll set, in a fixed order; absent sources are skipped.
        let mut fds: Vec<PollFd> = Vec::with_capacity(5);
        let mut kinds: Vec<u8> = Vec::with_capacity(5);
        if let Some(c) = &chan {
            fds.push(PollFd::new(c.as_fd(), PollFlags::POLLIN));
            kinds.push(0);
        }
        if let Some(l) = &listener {
            fds.push(PollFd::new(l.as_fd(), PollFlags::POLLIN));
            kinds.push(1);
        }
        if let Some(s) = &stdout {
            fds.push(PollFd::new(s.as_fd(), PollFlags::POLLIN));
            kinds.push(2);
        }
        if let Some(s) = &stderr {
            fds.push(PollFd::new(s.as_fd(), PollFlags::POLLIN));
            kinds.push(3);
        }
        if exited_at.is_none() {
            fds.push(PollFd::new(child.pidfd.as_fd(), PollFlags::POLLIN));
            kinds.push(4);
        }
        let now = Instant::now();
        let mut wait = match exited_at {
            Some(t) => DRAIN_GRACE.saturating_sub(t.elapsed()),
            None => Duration::from_secs(3600),
        };
        if let (Some(d), None, false) = (deadline, exited_at, o.timed_out) {
            wait = wait.min(d.saturating_duration_since(now));
        }
        let ms = wait.as_millis().min(i32::MAX as u128) as i32;
        let ready = match poll(
            &mut fds,
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(n) => n,
            Err(Errno::EINTR) => continue,
            Err(_) => 0,
        };
        let revents: Vec<(u8, PollFlags)> = kinds
            .iter()
            .zip(fds.iter())
            .map(|(&k, f)| (k, f.revents().unwrap_or(PollFlags::empty())))
            .collect();
        drop(fds);

        if ready == 0 {
            if let (Some(d), None) = (deadline, exited_at)
                && Instant::now() >= d
                && !o.timed_out
            {
                o.timed_out = true;
                kill();
            }
            continue;
        }
        for (kind, rev) in revents {
            if rev.is_empty() {
                continue;
            }
            match kind {
                0 => {
                    // Set-up channel: records until end-of-file.
                    while let Some(c) = &chan {
                        match channel::recv(c) {
                            Ok(Ok(Received::Msg(ChildMsg::Degraded { step, errno }, _))) => {
                                o.degraded.push((step, Errno::from_raw(errno)));
                            }
                            Ok(Ok(Received::Msg(ChildMsg::Fatal { step, errno }, _))) => {
                                o.fatal = Some((step, Errno::from_raw(errno)));
                            }
                            Ok(Ok(Received::Msg(ChildMsg::Listener, fd))) => {
                                if let Some(fd) = fd {
                                    set_nonblocking(&fd);
                                    notif_buf = NotifBuf::new().ok();
                                    listener = Some(fd);
                                    o.notify = true;
                                    crate::timing::mark("child confined (listener received)");
                                }
                            }
                            Ok(Ok(Received::Eof)) => {
                                o.exec_confirmed = o.fatal.is_none();
                                crate::timing::mark("exec confirmed (channel closed)");
                                chan = None;
                            }
                            Ok(Err(e)) => {
                                o.channel_error = Some(e.to_string());
                                kill();
                                chan = None;
                            }
                            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => break,
                            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                            Err(_) => chan = None,
                        }
                    }
                }
                1 => {
                    let (Some(l), Some(nb)) = (&listener, notif_buf.as_mut()) else {
                        continue;
                    };
                    if rev.intersects(PollFlags::POLLHUP | PollFlags::POLLERR)
                        && !rev.contains(PollFlags::POLLIN)
                    {
                        listener = None; // every task using the filter is gone
                        continue;
                    }
                    let n = match sys::notif_recv(l.as_fd(), nb) {
                        Ok(n) => n,
                        Err(_) => continue, // ENOENT: the task died or the call was interrupted
                    };
                    // The one exec that starts the guest: the child's first execve, before the
                    // set-up channel closed. Every later one is the guest's.
                    if !initial_exec_done
                        && chan.is_some()
                        && n.pid == child.pid as u32
                        && n.nr == libc::SYS_execve as i32
                        && n.arch == crate::policy::bpf::AUDIT_ARCH_X86_64
                    {
                        initial_exec_done = true;
                        let _ = sys::notif_send(l.as_fd(), n.id, NotifAnswer::Continue);
                        continue;
                    }
                    let verdict = decode::classify(&n, policy, &cfg.write_grants);
                    if !sys::notif_id_valid(l.as_fd(), n.id) {
                        continue; // what we read may not belong to this call any more
                    }
                    let Some(d) = verdict else {
                        // A watched write inside the grants: Landlock has the last word.
                        let _ = sys::notif_send(l.as_fd(), n.id, NotifAnswer::Continue);
                        continue;
                    };
                    let (answer, action) = match policy.on_violation {
                        OnViolation::Kill => (NotifAnswer::Error(d.errno), Action::Killed),
                        OnViolation::Warn if !d.always_deny => {
                            (NotifAnswer::Continue, Action::Warned)
                        }
                        _ => (NotifAnswer::Error(d.errno), Action::Denied),
                    };
                    if action == Action::Killed {
                        o.killed_for_violation = true;
                        kill();
                    }
                    let _ = sys::notif_send(l.as_fd(), n.id, answer);
                    violations.record(Violation {
                        hint: d.category.hint().to_string(),
                        category: d.category,
                        syscall: d.syscall,
                        args: d.args,
                        action,
                        rule: d.rule,
                        count: 1,
                    });
                }
                2 | 3 => {
                    let is_out = kind == 2;
                    let slot = if is_out { &mut stdout } else { &mut stderr };
                    let Some(fd) = slot.as_ref() else { continue };
                    let mut exceeded = false;
                    let open = read_available(fd, &mut buf, |data| {
                        // Keep what fits in the bound; the rest is dropped (and the guest killed).
                        let room = cfg.output_limit.saturating_sub(output) as usize;
                        output += data.len() as u64;
                        if data.len() > room {
                            exceeded = true;
                        }
                        let data = &data[..data.len().min(room)];
                        if is_out {
                            if let Some(w) = out_sink.as_mut() {
                                let _ = w.write_all(data);
                            }
                        } else {
                            if let Some(w) = err_sink.as_mut() {
                                let _ = w.write_all(data);
                            }
                            tail.extend_from_slice(data);
                            if tail.len() > 2 * STDERR_TAIL {
                                tail.drain(..tail.len() - STDERR_TAIL);
                            }
                        }
                    });
                    if exceeded && !o.output_exceeded && exited_at.is_none() {
                        o.output_exceeded = true;
                        kill();
                    }
                    if !open {
                        *slot = None;
                    }
                }
                4 => {
                    crate::timing::mark("guest exited (pidfd)");
                    exited_at = Some(Instant::now())
                }
                _ => {}
            }
        }
    }
    if let Some(w) = out_sink.as_mut() {
        let _ = w.flush();
    }
    crate::timing::mark("output drained");
    o.reaped = sys::wait4(child.pid).ok();
    o.duration = child.started.elapsed();
    if tail.len() > STDERR_TAIL {
        tail.drain(..tail.len() - STDERR_TAIL);
    }
    o.stderr_tail = tail;
    o.violations = violations.list;
    o
}
