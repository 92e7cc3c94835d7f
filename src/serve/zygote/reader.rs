//! The zygote's control reader: READY, FORKED and EXITED from the zygote, each handed to the
//! session it concerns; SETTLED kept for STATUS.

use super::*;

impl Zygote {
    pub(super) fn read_control(
        self: Arc<Self>,
        ctl: OwnedFd,
        ready: Sender<Result<Ready, ControlError>>,
        on_death: Arc<dyn Fn(usize) + Send + Sync>,
    ) {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match nix::sys::socket::recv(ctl.as_raw_fd(), &mut buf, MsgFlags::empty()) {
                Ok(0) => break,
                Ok(n) => n,
                Err(Errno::EINTR) => continue,
                Err(_) => break,
            };
            match control::parse(&buf[..n]) {
                Ok(Control::Ready(doc)) => {
                    // A zygote that could not preload exits next: that death is not a restart.
                    if doc.error.is_none() {
                        let _ = self.ready.set(doc.clone());
                    }
                    let _ = ready.send(Ok(doc));
                }
                Ok(Control::Forked(forked)) => {
                    // The child is known by its pid before its FORK stops being in flight:
                    // the router takes "no FORK in flight and no session" to mean a spare
                    // (`await_session`).
                    let mut pending = self.pending.lock().unwrap();
                    let Some((shared, tx)) = pending.remove(&forked.session) else {
                        continue;
                    };
                    let reply = match forked.child {
                        ForkOutcome::Pid { pid } => {
                            self.by_ns_pid.lock().unwrap().insert(pid, shared);
                            Ok(pid)
                        }
                        ForkOutcome::Error { error } => Err(ForkError::Refused(error)),
                    };
                    drop(pending);
                    self.registration_changed();
                    let _ = tx.send(reply);
                }
                Ok(Control::Settled(settled)) => {
                    let _ = self.settled.set(settled);
                    self.settling_changed();
                }
                Ok(Control::Exited(exited)) => {
                    let Some(shared) = self.by_ns_pid.lock().unwrap().remove(&exited.pid) else {
                        continue;
                    };
                    self.by_pid.lock().unwrap().retain(|_, s| s.id != shared.id);
                    shared.set_exit(exited.into());
                }
                // Start-up waits for READY: a malformed one fails it at once.
                Err(e) if e.kind() == Some(control::READY) && self.ready.get().is_none() => {
                    let _ = ready.send(Err(e));
                }
                // The zygote runs trusted code only (preload code, wfjail's package): a bad
                // packet is a bug there, said and skipped.
                Err(e) => eprintln!("wfjail: zygote {}: {e}; ignored", self.index),
            }
        }
        // The zygote is gone: so are its children.
        self.alive.store(false, Ordering::SeqCst);
        self.settling_changed();
        let status = sys::wait4(self.pid).map(|r| r.status).ok();
        let expected = self.stopping.load(Ordering::SeqCst) || self.ready.get().is_none();
        if !expected {
            eprintln!(
                "wfjail: zygote {} (pid {}) died ({}); its sessions fail and it is restarted",
                self.index,
                self.pid,
                status.map_or("status unknown".into(), describe_status)
            );
        }
        let gone = ChildExit {
            status: None,
            cpu_ms: 0.0,
            max_rss_kb: 0,
        };
        for (_, s) in self.by_ns_pid.lock().unwrap().drain() {
            s.set_exit(gone);
        }
        for (_, (_, tx)) in self.pending.lock().unwrap().drain() {
            let _ = tx.send(Err(ForkError::Died));
        }
        self.registration_changed();
        if !expected {
            on_death(self.index);
        }
    }
}

/// How a session child ended, as the zygote reported it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChildExit {
    /// The wait status; `None` when the zygote died (and took the child with it).
    pub status: Option<i32>,
    pub cpu_ms: f64,
    pub max_rss_kb: u64,
}

impl From<Exited> for ChildExit {
    fn from(e: Exited) -> Self {
        ChildExit {
            status: Some(e.status),
            cpu_ms: e.cpu_ms,
            max_rss_kb: e.max_rss_kb,
        }
    }
}

/// "exit 1", "killed by SIGKILL".
pub fn describe_status(status: i32) -> String {
    if libc::WIFEXITED(status) {
        format!("exit {}", libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        format!(
            "killed by {}",
            crate::report::signal_name(libc::WTERMSIG(status))
        )
    } else {
        format!("status {status}")
    }
}
