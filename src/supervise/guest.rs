//! The one supervisor of an exec'd guest, embedded by `wfjail run` (`supervise()`) and by an
//! exec-mode `serve` session: its pidfd, its start-up (the set-up channel and the initial
//! exec, through startup.rs's [`Driver`]), its seccomp notifications (the budget, the
//! violations and the determinism answers, through `notify::handle`) and the kernel evidence
//! for its memory limit. In the style of mio: the caller's loop asks it to [`register`] its
//! descriptors beside the caller's own, and hands each ready one back to [`on_ready`], which
//! says what happened ([`Progress`]); the caller records that its own way (run in its
//! `Outcome`, a session in its shared state and phase machine).
//!
//! The guest's output and frames stay with the caller: run reads two pipes (its stdout is the
//! result, byte for byte) and a protocol conversation it answers itself, a session one pipe
//! and a socket whose frames drive its phase machine; what both share there is already one
//! piece each (`OutputMeter`, `LineEcho`, `protocol::guest::Conversation`).
//!
//! The notification state lives where the caller keeps it ([`Answering`]): run owns it
//! ([`Answers`], no lock); a session shares it with the zygote router and its report behind
//! `SessionShared`'s mutexes, which on its own thread are uncontended.
//!
//! [`register`]: Supervisor::register
//! [`on_ready`]: Supervisor::on_ready

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use nix::poll::{PollFd, PollFlags};

use crate::answers::{entropy::Entropy, monotonic::Monotonic, vdso};
use crate::notify::violations::Violations;
use crate::notify::{self, Budget, Handled, Rules, paths::Grants};
use crate::plan::Plan;
use crate::policy::OnViolation;
use crate::policy::decisions::Decisions;
use crate::report::Violation;
use crate::sys;

use super::memory_evidence::MemoryEvidence;
use super::startup::{ChanRead, Driver, Listened};

/// Where a guest's notification state is kept, and how one notification is charged and
/// answered with it.
pub trait Answering {
    /// Charges one notification to the guest's budget (`notify::charge`): `false` when the
    /// budget is spent (the notification was refused and the guest killed through `kill`).
    fn charge(&mut self, listener: BorrowedFd<'_>, n: &sys::Notif, kill: &dyn Fn()) -> bool;
    /// Decides and answers `n` (`notify::handle`) with the guest's violations and answers.
    fn answer(
        &mut self,
        listener: BorrowedFd<'_>,
        n: &sys::Notif,
        rules: Rules<'_>,
        kill: &dyn Fn(),
    ) -> Handled;
}

/// `wfjail run`'s notification state, owned by its supervisor.
pub struct Answers {
    pub violations: Violations,
    pub budget: Budget,
    /// The seeded stream (`getrandom = "seeded"`).
    pub entropy: Option<Entropy>,
    /// The workflow time (`clock = "virtual"`).
    pub clock: Option<i64>,
    pub monotonic: Monotonic,
    pub inodes: crate::answers::filetimes::Inodes,
    /// `wfjail learn`: every violation, and the bytes of their arguments.
    pub learned: Option<(Vec<Violation>, usize)>,
}

impl Answering for Answers {
    fn charge(&mut self, listener: BorrowedFd<'_>, n: &sys::Notif, kill: &dyn Fn()) -> bool {
        notify::charge(&mut self.budget, listener, n, kill)
    }

    fn answer(
        &mut self,
        listener: BorrowedFd<'_>,
        n: &sys::Notif,
        rules: Rules<'_>,
        kill: &dyn Fn(),
    ) -> Handled {
        let state = notify::State {
            violations: &mut self.violations,
            entropy: self.entropy.as_mut(),
            clock: self.clock,
            monotonic: &mut self.monotonic,
            inodes: &mut self.inodes,
            learned: self.learned.as_mut().map(|(l, b)| (l, b)),
        };
        notify::handle(listener, n, rules, state, kill)
    }
}

/// What the guest's notifications are judged against (what `notify::Rules` borrows).
pub struct Judge {
    pub decisions: Arc<Decisions>,
    pub grants: Grants,
    /// Under `warn` (`wfjail run`): the read grants every read is judged against.
    pub reads: Option<Grants>,
    /// `wfjail learn`: read-only opens are recorded too.
    pub late_reads: bool,
    pub on_violation: OnViolation,
}

impl Judge {
    /// The rules of `plan`'s guest (`learn`: `wfjail learn`).
    pub fn of(plan: &Plan, learn: bool) -> Judge {
        Judge {
            decisions: plan.rules.decisions.clone(),
            grants: Grants::new(&plan.write),
            reads: plan
                .warn_files
                .then(|| Grants::with_list(&plan.read, &plan.list)),
            late_reads: learn,
            on_violation: plan.on_violation,
        }
    }

    fn rules(&self) -> Rules<'_> {
        Rules {
            decisions: &self.decisions,
            grants: &self.grants,
            late_reads: self.late_reads,
            on_violation: self.on_violation,
            reads: self.reads.as_ref(),
        }
    }
}

/// A descriptor of the supervisor's in the caller's poll set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Token {
    /// The set-up channel, until the exec.
    Chan,
    /// The guest's seccomp listener.
    Listener,
    /// The guest's pidfd (readable once it exited).
    Pidfd,
}

/// What a ready descriptor meant, for the caller to record.
#[derive(Debug)]
pub enum Progress {
    /// Nothing the caller needs to know.
    Nothing,
    /// The guest exited (the pidfd is readable; it is not registered again).
    Exited,
    /// A set-up record did not decode: the guest was killed (`Startup::error` says why).
    SetupBroken,
    /// The exec stop failed (the vDSO patch): the guest was killed.
    ExecStopFailed(vdso::VdsoError),
    /// The guest asked for more answers than its budget: it was killed.
    OverBudget,
    /// A violation under `on_violation = "kill"`: the guest was killed.
    KilledForViolation,
}

/// The supervisor of one exec'd guest (see the module's comment).
pub struct Supervisor<A> {
    pid: libc::pid_t,
    pidfd: Arc<OwnedFd>,
    start: Driver,
    judge: Judge,
    answers: A,
    /// Kernel evidence for the memory limit.
    pub memory: MemoryEvidence,
    exited: bool,
}

impl<A: Answering> Supervisor<A> {
    /// Supervises guest `pid` (its `pidfd`, its set-up channel `chan`), whose exec stop
    /// patches `vdso`.
    pub fn new(
        pid: libc::pid_t,
        pidfd: Arc<OwnedFd>,
        chan: OwnedFd,
        vdso: Option<vdso::Patch>,
        judge: Judge,
        answers: A,
        memory: MemoryEvidence,
    ) -> Self {
        Supervisor {
            pid,
            pidfd,
            start: Driver::new(pid, chan, vdso).nonblocking_listener(),
            judge,
            answers,
            memory,
            exited: false,
        }
    }

    pub fn pid(&self) -> libc::pid_t {
        self.pid
    }

    pub fn pidfd(&self) -> &Arc<OwnedFd> {
        &self.pidfd
    }

    /// The start-up, for what it decided (and whether it is still under way).
    pub fn start(&self) -> &Driver {
        &self.start
    }

    pub fn answers(&self) -> &A {
        &self.answers
    }

    pub fn answers_mut(&mut self) -> &mut A {
        &mut self.answers
    }

    /// The notification state, once the guest is gone.
    pub fn into_answers(self) -> A {
        self.answers
    }

    /// The pidfd was readable: the guest exited.
    pub fn exited(&self) -> bool {
        self.exited
    }

    /// Whether the guest runs its own image (its set-up channel closed at the exec).
    pub fn execd(&self) -> bool {
        self.start.chan().is_none()
    }

    /// Kills the guest (and, as PID 1 of its namespace, everything it started).
    pub fn kill(&self) {
        let _ = sys::pidfd_send_signal(self.pidfd.as_fd(), libc::SIGKILL);
    }

    /// Adds the supervisor's descriptors to the caller's poll set, each with its token: the
    /// pidfd (until it was readable), the set-up channel (until the exec), the listener.
    pub fn register<'a, T: From<Token>>(&'a self, fds: &mut Vec<PollFd<'a>>, tokens: &mut Vec<T>) {
        let mut watch = |fd: BorrowedFd<'a>, token: Token| {
            fds.push(PollFd::new(fd, PollFlags::POLLIN));
            tokens.push(token.into());
        };
        if !self.exited {
            watch(self.pidfd.as_fd(), Token::Pidfd);
        }
        if let Some(c) = self.start.chan() {
            watch(c, Token::Chan);
        }
        if let Some(l) = self.start.listener() {
            watch(l, Token::Listener);
        }
    }

    /// The descriptor of `token` was ready with `rev`.
    pub fn on_ready(&mut self, token: Token, rev: PollFlags) -> Progress {
        match token {
            Token::Pidfd => {
                self.exited = true;
                Progress::Exited
            }
            // Set-up records until end-of-file (= the exec happened).
            Token::Chan => {
                if self.start.read_chan() == ChanRead::Kill {
                    self.kill();
                    return Progress::SetupBroken;
                }
                Progress::Nothing
            }
            Token::Listener => match self.start.on_listener(rev) {
                Listened::Guest(n) => self.on_notification(&n),
                Listened::Nothing => Progress::Nothing,
                Listened::ExecStopFailed(e) => {
                    self.kill();
                    Progress::ExecStopFailed(e)
                }
            },
        }
    }

    /// The guest's own call `n`: charged, looked at for memory evidence, answered.
    fn on_notification(&mut self, n: &sys::Notif) -> Progress {
        let Some(l) = self.start.listener() else {
            return Progress::Nothing;
        };
        let pidfd = &self.pidfd;
        let kill = || {
            let _ = sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL);
        };
        // The supervisor's work for the guest is bounded (notify::Budget).
        if !self.answers.charge(l, n, &kill) {
            return Progress::OverBudget;
        }
        // Kernel evidence for the memory limit (memory_evidence.rs).
        self.memory
            .on_notification(l, n, self.pid, &self.judge.decisions);
        match self.answers.answer(l, n, self.judge.rules(), &kill) {
            Handled::Killed => Progress::KilledForViolation,
            _ => Progress::Nothing,
        }
    }

    /// Samples the guest's peak address space now, if it runs its own image and has not
    /// exited (before its exec the image is wfjail's).
    pub fn sample_memory(&mut self) {
        if !self.exited && self.execd() {
            self.memory.sample(self.pid);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::os::fd::AsRawFd;
    use std::time::{Duration, Instant};

    use nix::poll::{PollTimeout, poll};

    use super::*;
    use crate::plan::{self, PlanRequest};

    fn answers() -> Answers {
        Answers {
            violations: Violations::new(None),
            budget: Budget::default(),
            entropy: None,
            clock: None,
            monotonic: Monotonic::default(),
            inodes: Default::default(),
            learned: None,
        }
    }

    /// Drives `sup` as a caller's loop does, until the guest exited and its start-up is over
    /// (or `limit` passed); returns what it reported, in order.
    pub(crate) fn drive<A: Answering>(sup: &mut Supervisor<A>, limit: Duration) -> Vec<String> {
        let end = Instant::now() + limit;
        let mut seen = Vec::new();
        while !(sup.exited() && sup.execd()) && Instant::now() < end {
            let mut fds = Vec::new();
            let mut tokens: Vec<Token> = Vec::new();
            sup.register(&mut fds, &mut tokens);
            if poll(&mut fds, PollTimeout::from(100u16)).unwrap_or(0) == 0 {
                continue;
            }
            let ready: Vec<(Token, PollFlags)> = tokens
                .into_iter()
                .zip(fds.iter())
                .filter_map(|(t, f)| f.revents().filter(|r| !r.is_empty()).map(|r| (t, r)))
                .collect();
            drop(fds);
            for (t, rev) in ready {
                let p = sup.on_ready(t, rev);
                if !matches!(p, Progress::Nothing) {
                    seen.push(format!("{p:?}"));
                }
            }
        }
        seen
    }

    #[test]
    fn a_confined_guest_that_execs_and_exits_confirms_its_start_up_and_is_seen_exited() {
        let mut sup = supervised("default", &["/bin/true"], |_| {});
        let pid = sup.pid();
        let seen = drive(&mut sup, Duration::from_secs(20));
        let reaped = sys::wait4(pid).unwrap();
        assert_eq!(seen, ["Exited"]);
        assert!(sup.start().startup().exec_confirmed(), "the exec happened");
        assert!(sup.start().startup().fatal().is_none());
        assert!(sup.answers().violations.list.is_empty());
        assert!(libc::WIFEXITED(reaped.status) && libc::WEXITSTATUS(reaped.status) == 0);
        let mut fds = Vec::new();
        let mut tokens: Vec<Token> = Vec::new();
        sup.register(&mut fds, &mut tokens);
        assert!(
            !tokens.contains(&Token::Pidfd),
            "an exited guest's pidfd is not polled again"
        );
    }

    /// Spawns `argv` confined by `policy` (stdio on /dev/null), supervised by a Supervisor
    /// with run's own state; `judge` may change the plan's rules.
    fn supervised(
        policy: &str,
        argv: &[&str],
        judge: impl FnOnce(&mut Judge),
    ) -> Supervisor<Answers> {
        supervised_with(policy, argv, judge, answers())
    }

    /// [`supervised`], its notification state kept in `state`.
    pub(crate) fn supervised_with<A: Answering>(
        policy: &str,
        argv: &[&str],
        judge: impl FnOnce(&mut Judge),
        state: A,
    ) -> Supervisor<A> {
        let policy = crate::policy::load(policy).unwrap();
        let req = PlanRequest {
            argv: argv.iter().map(|a| a.to_string()).collect(),
            grants: vec![],
            extra_env: vec![],
            zygote: false,
            session: false,
            learn: false,
        };
        let plan = plan::build(&policy, &req).unwrap();
        let null = std::fs::File::open("/dev/null").unwrap();
        let targets = [0, 1, 2].map(|t| (null.as_raw_fd(), t));
        let spawned = crate::process::spawn(&plan, &targets, None).unwrap();
        let mut j = Judge::of(&plan, false);
        judge(&mut j);
        Supervisor::new(
            spawned.pid,
            Arc::new(spawned.pidfd),
            spawned.chan,
            plan.rules.vdso,
            j,
            state,
            MemoryEvidence::new(None),
        )
    }

    #[test]
    fn a_violation_the_rules_kill_for_is_recorded_and_the_guest_killed() {
        // strict denies getrandom, and sends it to the supervisor to be named.
        let mut sup = supervised(
            "strict",
            &["/usr/bin/python3", "-c", "import os; os.urandom(8)"],
            |j| j.on_violation = OnViolation::Kill,
        );
        let seen = drive(&mut sup, Duration::from_secs(30));
        let reaped = sys::wait4(sup.pid()).unwrap();
        assert_eq!(seen, ["KilledForViolation", "Exited"]);
        let v = &sup.answers().violations.list;
        assert!(v.iter().any(|v| v.syscall == "getrandom"), "{v:?}");
        assert!(libc::WIFSIGNALED(reaped.status) && libc::WTERMSIG(reaped.status) == libc::SIGKILL);
    }

    #[test]
    fn a_child_that_breaks_the_set_up_channel_is_killed() {
        use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
        let (parent, child_end) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let mut child = std::process::Command::new("/bin/sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as libc::pid_t;
        let pidfd = sys::pidfd_open(pid).unwrap();
        let judge = Judge {
            decisions: Arc::new(Decisions::default()),
            grants: Grants::default(),
            reads: None,
            late_reads: false,
            on_violation: OnViolation::Kill,
        };
        let mut sup = Supervisor::new(
            pid,
            Arc::new(pidfd),
            parent,
            None,
            judge,
            answers(),
            MemoryEvidence::new(None),
        );
        nix::unistd::write(&child_end, &[0xf7, 9, 0, 0, 0, 0, 0, 0]).unwrap();
        let seen = drive(&mut sup, Duration::from_secs(20));
        let status = child.wait().unwrap();
        assert_eq!(seen, ["SetupBroken", "Exited"]);
        assert!(sup.start().startup().error().is_some());
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }
}
