//! The phases of one `wfjail serve` session, as an I/O-free state machine: what each worker
//! frame and each guest event does in each phase, when the guest is stopped and resumed, what
//! is forwarded where, what fails the session and how it ends.
//!
//! session/ does the I/O: it reads the worker's connection (worker_conn.rs) and the guest's
//! conversation (`protocol::guest::Conversation`, which already checks the guest's frames
//! against the guest protocol), feeds what it read here with the time, and carries out the
//! [`Action`]s it gets back, in order. The rules (read top to bottom, this is the
//! specification; the unit tests below follow it rule by rule):
//!
//! 1. A session starts in `Starting`: the guest has the call timeout, but at least
//!    [`START_WAIT`], to say HELLO.
//! 2. The worker's CALLs are queued in any phase and issued one at a time, in order, whenever
//!    the guest is idle: the request is written, the guest resumed (SIGCONT), and the call's
//!    timeout starts. At most [`MAX_QUEUED_CALLS`] calls and [`MAX_QUEUED_BYTES`] bytes of
//!    requests wait: a worker that sends more without waiting for answers fails its session.
//! 3. CLOSE is kept until the queue is empty and the guest idle: then the guest is resumed,
//!    its input ended (end-of-file: no further call) and it has [`EXIT_GRACE`] to exit. A
//!    guest that does not is killed, and the session is still closed.
//! 4. Any other worker frame fails the session; the frames behind it are dropped.
//! 5. HELLO while starting opens the session: OPENED to the worker, and the guest is stopped
//!    (SIGSTOP) unless a call or the close is waiting.
//! 6. RESULT during a call: the guest is stopped (unless a call or the close is waiting), then
//!    the result goes to the worker.
//! 7. ERROR during a call: the guest's peak memory is read (a limit may explain the failure),
//!    the guest stopped as for RESULT, and the error goes to the worker with the violations of
//!    that call. The session goes on.
//! 8. ERROR while starting: the guest could not start (no such handler, no Landlock domain of
//!    its own); the session fails with its reason.
//! 9. QUERY during a call is answered with the violations since the previous QUERY.
//! 10. LOG is echoed, in any phase.
//! 11. A frame the conversation rejects is a protocol error, unless the session has already
//!     failed (a guest being killed may stop inside a frame). So is a guest event out of its
//!     phase (HELLO after the start; RESULT, ERROR or QUERY outside a call): the conversation
//!     rejects those first, the machine does not rely on it.
//! 12. The worker gone (its connection ended) is a CLOSE; a start or call in progress is given
//!     [`EXIT_GRACE`] rather than the rest of its timeout, and then fails the session.
//! 13. The deadline, checked every turn: while closing, the guest is killed (the session is
//!     still closed); a start or call the worker left fails the session; a start without HELLO
//!     fails it; a call past its timeout times it out.
//! 14. A failure seen by the I/O side (the output limit, a guest that does not stop, answers
//!     left unread, a broken worker wire) fails the session. Every failure kills the guest;
//!     the first reason is the one reported.
//! 15. The session ends when the guest's exit is known (the I/O side sees it): CLOSED if it
//!     reached `Closing` without a failure, FAILED otherwise.
//! 16. TIME (8 bytes: nanoseconds since the epoch) sets the workflow time of the CALL queued
//!     after it, just before that call's request is written; a call without one keeps the
//!     time it had. A TIME of another length fails the session.
//! 17. UPCALL during a call goes to the worker, at most [`MAX_UPCALLS`] waiting at once (more
//!     is a protocol error, as is an UPCALL outside a call: rule 11). Each REPLY answers the
//!     oldest waiting UPCALL and goes to the guest; a REPLY nobody waits for (more than were
//!     asked, or after the call ended) is dropped.
//! 18. INTERRUPT during a call interrupts the guest (SIGUSR2: the call answers for itself);
//!     outside a call it is dropped.
//! 19. Closing frees the session's slot (`Slots`): the guest lingers for its grace, holding
//!     none. When as many guests linger as the server has slots, the one that has lingered
//!     longest is killed (`linger_displaced`) to make room, and its report says so as for
//!     rule 3.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use crate::policy::Dur;
use crate::protocol::MAX_FRAME;
use crate::protocol::guest::{Event, OutboxFull, ProtocolError};
use crate::protocol::worker;
use crate::report::GuestError;
use crate::supervise::verdict::SessionEnd;

use super::worker_conn::{Frame, WireError};

/// The least time a guest gets to start (fork or exec, then HELLO).
pub const START_WAIT: Duration = Duration::from_secs(30);
/// How long a guest has to exit after its session was closed (or its worker left mid-call),
/// before it is killed.
pub const EXIT_GRACE: Duration = Duration::from_secs(2);
/// The most calls waiting behind the one in progress.
pub const MAX_QUEUED_CALLS: usize = 64;
/// UPCALLs of one call that may wait for the worker's REPLY at once.
pub const MAX_UPCALLS: usize = 64;
/// The most request bytes waiting behind the call in progress: two of the largest calls.
pub const MAX_QUEUED_BYTES: usize = 2 * MAX_FRAME;

/// Where a session is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for the guest's HELLO.
    Starting,
    /// No call in progress.
    Idle,
    /// A call is in progress: the guest runs until its answer.
    Calling,
    /// The guest was told there is no further call; waiting for it to exit.
    Closing,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Starting => "starting",
            Phase::Idle => "idle",
            Phase::Calling => "calling",
            Phase::Closing => "closing",
        })
    }
}

/// What the session does, in the order given.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Write REQUEST with this payload to the guest: a call begins (the conversation expects
    /// its answer; violations counted from now on are the call's). If the guest's outbox
    /// cannot take it, tell [`Phases::request_unsent`] and carry out nothing after it.
    Request(Vec<u8>),
    /// Set the workflow time (`TIME`) for the call that follows (comes just before its
    /// `Request`).
    SetClock(i64),
    /// Let the stopped guest run (SIGCONT); nothing when it is not stopped.
    Resume,
    /// Stop the guest (SIGSTOP) and wait until it is: it is idle. Nothing when it is stopped
    /// already or gone.
    Stop,
    /// End the guest's input (shut its socket down for writing): there is no further call.
    EndInput,
    /// Tell the worker the session is open (OPENED).
    Opened,
    /// Forward the call's result to the worker (RESULT).
    Result(Vec<u8>),
    /// Forward the call's error to the worker (ERROR), with the violations of that call.
    CallError(GuestError),
    /// Answer the guest's QUERY with the violations since the previous one. If the guest's
    /// outbox cannot take it, fail the session ([`Failure::QueryUnread`]) and carry out
    /// nothing after it.
    AnswerQuery,
    /// Interrupt the guest's call (SIGUSR2).
    Interrupt,
    /// Relay the guest's UPCALL to the worker (UPCALL).
    Upcall(Vec<u8>),
    /// Relay the worker's REPLY to the guest (a REPLY frame).
    Reply(Vec<u8>),
    /// Echo a LOG line of the guest's.
    Log { level: u8, text: String },
    /// Read the guest's peak address space now (a failed call: the memory limit may explain it).
    SampleMemory,
    /// Kill the guest.
    Kill,
}

/// Why a session failed (the report's `error`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Failure {
    #[error("unexpected {} frame from the worker", worker::name(*.0))]
    WorkerFrame(u8),
    #[error(
        "the worker queued more than {MAX_QUEUED_CALLS} calls or {MAX_QUEUED_BYTES} bytes of \
         requests without waiting for their answers"
    )]
    CallQueueFull,
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("the guest did not say HELLO in time")]
    NoHello,
    #[error("the worker closed the session during a call")]
    Abandoned,
    #[error("the call took longer than {}", Dur(*.0))]
    CallTimeout(Duration),
    #[error("the guest could not start: {}: {}", .0.kind, .0.message)]
    StartRefused(GuestError),
    #[error(transparent)]
    Protocol(ProtocolError),
    /// The guest asked (QUERY) and did not read the answers.
    #[error(transparent)]
    QueryUnread(OutboxFull),
    /// A request did not fit in the guest's outbox.
    #[error(transparent)]
    RequestUnsent(OutboxFull),
    #[error("the guest's output and logs exceeded limits.output ({0} bytes)")]
    Output(u64),
    #[error("the call used more than limits.cpu ({}) of CPU time", Dur(*.0))]
    CallCpu(Duration),
    #[error("a TIME frame carries 8 bytes (nanoseconds since the epoch), not {0}")]
    BadTime(usize),
    #[error("the guest answered before its pid was known")]
    NoPid,
    #[error("the guest did not stop within {}s after answering", .0.as_secs())]
    NoStop(Duration),
}

impl Failure {
    /// Whether the guest broke the guest protocol (the report's `protocol_error` fact).
    fn is_protocol(&self) -> bool {
        matches!(self, Failure::Protocol(_) | Failure::QueryUnread(_))
    }
}

/// The phases of one session. See the module documentation for the rules.
#[derive(Debug)]
pub struct Phases {
    phase: Phase,
    /// Requests of CALLs not issued yet, and their bytes.
    queue: VecDeque<(Vec<u8>, Option<i64>)>,
    /// A TIME frame's time, for the next CALL.
    pending_time: Option<i64>,
    queued_bytes: usize,
    /// UPCALLs sent to the worker during the current call and not answered yet.
    upcalls: usize,
    close_requested: bool,
    /// The worker left while the guest started or ran a call.
    abandoned: bool,
    /// Each call's wall-clock limit.
    timeout: Option<Duration>,
    deadline: Option<Instant>,
    failure: Option<Failure>,
    timed_out: bool,
    /// Closed, but the guest did not exit within [`EXIT_GRACE`] and was killed (rule 3).
    exit_overdue: bool,
    /// Displaced among the lingering, when this many lingered (rule 19): killed early.
    linger_displaced: Option<usize>,
    protocol_error: bool,
    guest_error: Option<GuestError>,
}

impl Phases {
    /// Rule 1: a session whose guest was just started (`now`); `timeout`: each call's limit.
    pub fn new(timeout: Option<Duration>, now: Instant) -> Self {
        Phases {
            phase: Phase::Starting,
            queue: VecDeque::new(),
            pending_time: None,
            queued_bytes: 0,
            upcalls: 0,
            close_requested: false,
            abandoned: false,
            timeout,
            deadline: Some(now + timeout.unwrap_or(START_WAIT).max(START_WAIT)),
            failure: None,
            timed_out: false,
            exit_overdue: false,
            linger_displaced: None,
            protocol_error: false,
            guest_error: None,
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// When [`Phases::tick`] has something to do, if ever.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// The first reason the session failed.
    pub fn failure(&self) -> Option<&Failure> {
        self.failure.as_ref()
    }

    /// A call ran past its timeout.
    pub fn timed_out(&self) -> bool {
        self.timed_out
    }

    /// Rule 3: the session was closed, but its guest did not exit within [`EXIT_GRACE`]
    /// of its input ending, and was killed.
    pub fn exit_overdue(&self) -> bool {
        self.exit_overdue
    }

    /// Rule 19: the lingering guest was killed before its grace ended, displaced by a newer
    /// one when this many lingered.
    pub fn displaced_at(&self) -> Option<usize> {
        self.linger_displaced
    }

    /// Rule 19: the closed guest lingered longest of `lingering` (as many as the server has
    /// slots) when a newer one needed a place: the rest of its grace is cut short.
    pub fn linger_displaced(&mut self, lingering: usize) -> Vec<Action> {
        if self.phase != Phase::Closing || self.failure.is_some() {
            return Vec::new();
        }
        self.exit_overdue = true;
        self.linger_displaced = Some(lingering);
        self.deadline = None;
        vec![Action::Kill]
    }

    /// The guest broke the guest protocol.
    pub fn protocol_error(&self) -> bool {
        self.protocol_error
    }

    /// The guest's last ERROR (of its start or of a call).
    pub fn guest_error(&self) -> Option<&GuestError> {
        self.guest_error.as_ref()
    }

    /// Rule 15: the session's last frame is CLOSED (otherwise FAILED).
    pub fn closed(&self) -> bool {
        self.failure.is_none() && self.phase == Phase::Closing
    }

    /// How the conversation ended, for the verdict.
    pub fn end(&self) -> SessionEnd {
        if self.guest_error.is_some() && self.phase == Phase::Starting {
            SessionEnd::RefusedStart
        } else if self.phase == Phase::Closing {
            SessionEnd::Closed
        } else {
            SessionEnd::EndedEarly
        }
    }

    /// Rules 2–4, 12 and 16–18: the frames the worker sent (in one read), and whether its
    /// connection ended.
    pub fn worker(&mut self, frames: Vec<Frame>, gone: bool, now: Instant) -> Vec<Action> {
        let mut acts = Vec::new();
        for (kind, payload) in frames {
            match kind {
                worker::CALL => {
                    if self.queue.len() >= MAX_QUEUED_CALLS
                        || self.queued_bytes + payload.len() > MAX_QUEUED_BYTES
                    {
                        acts.extend(self.fail(Failure::CallQueueFull));
                        break;
                    }
                    self.queued_bytes += payload.len();
                    let time = self.pending_time.take();
                    self.queue.push_back((payload, time));
                }
                worker::TIME => match <[u8; 8]>::try_from(payload.as_slice()) {
                    Ok(b) => self.pending_time = Some(i64::from_le_bytes(b)),
                    Err(_) => {
                        acts.extend(self.fail(Failure::BadTime(payload.len())));
                        break;
                    }
                },
                worker::CLOSE => self.close_requested = true,
                // A call that runs too long, interrupted (the answer is the call's own).
                worker::INTERRUPT => {
                    if self.phase == Phase::Calling {
                        acts.push(Action::Interrupt);
                    }
                }
                // The answer to an UPCALL of the current call; one that comes after the call
                // ended (its guest answered without waiting) has no one to go to.
                worker::REPLY => {
                    if self.phase == Phase::Calling && self.upcalls > 0 {
                        self.upcalls -= 1;
                        acts.push(Action::Reply(payload));
                    }
                }
                k => {
                    acts.extend(self.fail(Failure::WorkerFrame(k)));
                    break;
                }
            }
        }
        if gone {
            self.close_requested = true;
            if matches!(self.phase, Phase::Starting | Phase::Calling) && !self.abandoned {
                self.abandoned = true;
                let grace = now + EXIT_GRACE;
                self.deadline = Some(self.deadline.map_or(grace, |d| d.min(grace)));
            }
        }
        self.advance(now, &mut acts);
        acts
    }

    /// Rules 5–11: one event of the guest's conversation.
    pub fn guest(&mut self, event: Event, now: Instant) -> Vec<Action> {
        let mut acts = Vec::new();
        match (self.phase, event) {
            (_, Event::Log { level, text }) => acts.push(Action::Log { level, text }),
            (Phase::Starting, Event::Hello) => {
                self.answered(&mut acts);
                acts.push(Action::Opened);
            }
            (Phase::Starting, Event::Error(e)) => {
                self.guest_error = Some(e.clone());
                return self.fail(Failure::StartRefused(e));
            }
            (Phase::Calling, Event::Query) => acts.push(Action::AnswerQuery),
            (Phase::Calling, Event::Upcall(bytes)) => {
                if self.upcalls >= MAX_UPCALLS {
                    return self.guest_broke(ProtocolError(format!(
                        "more than {MAX_UPCALLS} UPCALLs of one call wait for the worker"
                    )));
                }
                self.upcalls += 1;
                acts.push(Action::Upcall(bytes));
            }
            (Phase::Calling, Event::Result(bytes)) => {
                self.answered(&mut acts);
                acts.push(Action::Result(bytes));
            }
            (Phase::Calling, Event::Error(e)) => {
                acts.push(Action::SampleMemory);
                self.answered(&mut acts);
                self.guest_error = Some(e.clone());
                acts.push(Action::CallError(e));
            }
            (phase, event) => {
                let what = match event {
                    Event::Hello => "HELLO",
                    Event::Query => "QUERY",
                    Event::Result(_) => "RESULT",
                    Event::Error(_) => "ERROR",
                    Event::Log { .. } => "LOG",
                    Event::Upcall(_) => "UPCALL",
                };
                return self.guest_broke(ProtocolError(format!(
                    "unexpected {what} frame from the guest while the session is {phase}"
                )));
            }
        }
        self.advance(now, &mut acts);
        acts
    }

    /// Rule 11: the conversation rejected what the guest sent.
    pub fn guest_broke(&mut self, e: ProtocolError) -> Vec<Action> {
        if self.failure.is_some() {
            return Vec::new();
        }
        self.fail(Failure::Protocol(e))
    }

    /// Rule 13: called on every turn of the session's loop.
    pub fn tick(&mut self, now: Instant) -> Vec<Action> {
        if self.deadline.is_none_or(|d| now < d) {
            return Vec::new();
        }
        self.deadline = None;
        match self.phase {
            Phase::Closing => {
                // It did not exit after its input ended.
                self.exit_overdue = true;
                vec![Action::Kill]
            }
            _ if self.abandoned => self.fail(Failure::Abandoned),
            Phase::Starting => self.fail(Failure::NoHello),
            Phase::Idle | Phase::Calling => {
                self.timed_out = true;
                self.fail(Failure::CallTimeout(self.timeout.unwrap_or_default()))
            }
        }
    }

    /// Rule 14: the session failed; the first reason stays.
    pub fn fail(&mut self, why: Failure) -> Vec<Action> {
        if why.is_protocol() {
            self.protocol_error = true;
        }
        if self.failure.is_none() {
            self.failure = Some(why);
        }
        vec![Action::Kill]
    }

    /// The request of the last [`Action::Request`] did not fit in the guest's outbox: no call
    /// is in progress, and the session fails.
    pub fn request_unsent(&mut self, e: OutboxFull) -> Vec<Action> {
        if self.phase == Phase::Calling {
            self.phase = Phase::Idle;
            self.deadline = None;
        }
        self.fail(Failure::RequestUnsent(e))
    }

    /// The guest answered (HELLO, RESULT, ERROR): idle, and stopped unless something waits.
    fn answered(&mut self, acts: &mut Vec<Action>) {
        self.phase = Phase::Idle;
        self.upcalls = 0;
        self.deadline = None;
        if self.queue.is_empty() && !self.close_requested {
            acts.push(Action::Stop);
        }
    }

    /// Rules 2 and 3: an idle guest gets the next call, or its end of input.
    fn advance(&mut self, now: Instant, acts: &mut Vec<Action>) {
        if self.phase != Phase::Idle {
            return;
        }
        if let Some((request, time)) = self.queue.pop_front() {
            self.queued_bytes -= request.len();
            if let Some(t) = time {
                acts.push(Action::SetClock(t));
            }
            acts.push(Action::Request(request));
            acts.push(Action::Resume);
            self.phase = Phase::Calling;
            self.deadline = self.timeout.map(|t| now + t);
        } else if self.close_requested {
            acts.push(Action::Resume);
            acts.push(Action::EndInput);
            self.phase = Phase::Closing;
            self.deadline = Some(now + EXIT_GRACE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Action::*;

    const TIMEOUT: Duration = Duration::from_secs(5);

    fn call(req: &[u8]) -> Frame {
        (worker::CALL, req.to_vec())
    }

    fn close() -> Frame {
        (worker::CLOSE, vec![])
    }

    fn error(kind: &str, message: &str) -> GuestError {
        GuestError {
            kind: kind.into(),
            message: message.into(),
            traceback: String::new(),
        }
    }

    fn result(bytes: &[u8]) -> Event {
        Event::Result(bytes.to_vec())
    }

    /// A session whose guest said HELLO at `t0` (the call timeout is [`TIMEOUT`]).
    fn open() -> (Phases, Instant) {
        let t0 = Instant::now();
        let mut s = Phases::new(Some(TIMEOUT), t0);
        assert_eq!(s.guest(Event::Hello, t0), vec![Stop, Opened]);
        (s, t0)
    }

    /// An open session in a call begun at `t0`.
    fn calling() -> (Phases, Instant) {
        let (mut s, t0) = open();
        assert_eq!(
            s.worker(vec![call(b"req")], false, t0),
            vec![Request(b"req".to_vec()), Resume]
        );
        (s, t0)
    }

    fn failure(s: &Phases) -> String {
        s.failure().map(ToString::to_string).unwrap_or_default()
    }

    #[test]
    fn upcalls_go_to_the_worker_and_its_replies_back_in_order_during_the_call_only() {
        let (mut s, t0) = calling();
        let up = |b: &[u8]| Event::Upcall(b.to_vec());
        let reply = |b: &[u8]| (worker::REPLY, b.to_vec());
        assert_eq!(s.guest(up(b"q1"), t0), vec![Upcall(b"q1".to_vec())]);
        assert_eq!(s.guest(up(b"q2"), t0), vec![Upcall(b"q2".to_vec())]);
        assert_eq!(
            s.worker(vec![reply(b"\0a1"), reply(b"\0a2")], false, t0),
            vec![Reply(b"\0a1".to_vec()), Reply(b"\0a2".to_vec())]
        );
        // A REPLY nobody waits for (more than were asked, or after the call) is dropped.
        assert_eq!(s.worker(vec![reply(b"\0extra")], false, t0), vec![]);
        assert_eq!(s.guest(up(b"q3"), t0), vec![Upcall(b"q3".to_vec())]);
        assert_eq!(s.guest(result(b"r"), t0), vec![Stop, Result(b"r".to_vec())]);
        assert_eq!(s.worker(vec![reply(b"\0late")], false, t0), vec![]);
        assert!(s.failure().is_none());
        // Outside a call an UPCALL breaks the protocol.
        assert_eq!(s.guest(up(b"idle"), t0), vec![Kill]);
        assert!(
            failure(&s).contains("unexpected UPCALL frame"),
            "{}",
            failure(&s)
        );
    }

    #[test]
    fn rule_16_a_time_sets_the_workflow_time_of_the_call_queued_after_it() {
        let (mut s, t0) = open();
        let time = |t: i64| (worker::TIME, t.to_le_bytes().to_vec());
        assert_eq!(
            s.worker(vec![time(7), call(b"a")], false, t0),
            vec![SetClock(7), Request(b"a".to_vec()), Resume]
        );
        assert_eq!(s.guest(result(b"r"), t0), vec![Stop, Result(b"r".to_vec())]);
        // The next call without a TIME keeps the time it had.
        assert_eq!(
            s.worker(vec![call(b"b")], false, t0),
            vec![Request(b"b".to_vec()), Resume]
        );
        // A TIME of another length fails the session.
        assert_eq!(
            s.worker(vec![(worker::TIME, vec![1, 2])], false, t0),
            vec![Kill]
        );
        assert!(failure(&s).contains("8 bytes"), "{}", failure(&s));
    }

    #[test]
    fn an_interrupt_reaches_the_guest_during_a_call_only() {
        let (mut s, t0) = open();
        let interrupt = || (worker::INTERRUPT, vec![]);
        assert_eq!(
            s.worker(vec![interrupt()], false, t0),
            vec![],
            "idle: nothing"
        );
        // Sent with the CALL, it comes before the call begins: nothing either.
        assert_eq!(
            s.worker(vec![call(b"r"), interrupt()], false, t0),
            vec![Request(b"r".to_vec()), Resume]
        );
        assert_eq!(s.worker(vec![interrupt()], false, t0), vec![Interrupt]);
        assert!(s.failure().is_none());
        assert_eq!(s.phase(), Phase::Calling);
    }

    #[test]
    fn a_guest_that_piles_up_upcalls_breaks_the_protocol() {
        let (mut s, t0) = calling();
        for _ in 0..MAX_UPCALLS {
            assert_eq!(s.guest(Event::Upcall(vec![]), t0).len(), 1);
        }
        assert_eq!(s.guest(Event::Upcall(vec![]), t0), vec![Kill]);
        assert!(
            failure(&s).contains("UPCALLs of one call wait"),
            "{}",
            failure(&s)
        );
    }

    #[test]
    fn rule_1_a_guest_has_the_call_timeout_but_at_least_start_wait_to_say_hello() {
        let t0 = Instant::now();
        let long = Duration::from_secs(90);
        assert_eq!(Phases::new(Some(long), t0).deadline(), Some(t0 + long));
        assert_eq!(
            Phases::new(Some(TIMEOUT), t0).deadline(),
            Some(t0 + START_WAIT)
        );
        assert_eq!(Phases::new(None, t0).deadline(), Some(t0 + START_WAIT));
        assert_eq!(Phases::new(None, t0).phase(), Phase::Starting);
    }

    #[test]
    fn rule_2_call_while_idle_writes_the_request_resumes_the_guest_and_starts_its_timeout() {
        let (mut s, t0) = open();
        let t = t0 + Duration::from_secs(1);
        assert_eq!(
            s.worker(vec![call(b"one")], false, t),
            vec![Request(b"one".to_vec()), Resume]
        );
        assert_eq!(s.phase(), Phase::Calling);
        assert_eq!(s.deadline(), Some(t + TIMEOUT));
    }

    #[test]
    fn rule_2_without_a_timeout_a_call_has_no_deadline() {
        let t0 = Instant::now();
        let mut s = Phases::new(None, t0);
        s.guest(Event::Hello, t0);
        s.worker(vec![call(b"x")], false, t0);
        assert_eq!((s.phase(), s.deadline()), (Phase::Calling, None));
    }

    #[test]
    fn rule_2_calls_while_calling_are_queued_and_issued_one_at_a_time_in_order() {
        let (mut s, t0) = calling();
        assert_eq!(s.worker(vec![call(b"a"), call(b"b")], false, t0), vec![]);
        assert_eq!(
            s.guest(result(b"r0"), t0),
            vec![Result(b"r0".to_vec()), Request(b"a".to_vec()), Resume],
            "the guest is not stopped: a call waits"
        );
        assert_eq!(
            s.guest(result(b"ra"), t0),
            vec![Result(b"ra".to_vec()), Request(b"b".to_vec()), Resume]
        );
        assert_eq!(
            s.guest(result(b"rb"), t0),
            vec![Stop, Result(b"rb".to_vec())]
        );
        assert_eq!(s.phase(), Phase::Idle);
    }

    #[test]
    fn rule_2_calls_sent_before_hello_wait_for_it() {
        let t0 = Instant::now();
        let mut s = Phases::new(Some(TIMEOUT), t0);
        assert_eq!(s.worker(vec![call(b"early")], false, t0), vec![]);
        assert_eq!(s.phase(), Phase::Starting);
        assert_eq!(
            s.guest(Event::Hello, t0),
            vec![Opened, Request(b"early".to_vec()), Resume],
            "the guest keeps running into its first call"
        );
        assert_eq!(s.phase(), Phase::Calling);
    }

    #[test]
    fn rule_2_a_worker_that_floods_calls_fails_its_session() {
        let (mut s, t0) = calling();
        let many = vec![call(b"x"); MAX_QUEUED_CALLS];
        assert_eq!(s.worker(many, false, t0), vec![]);
        assert_eq!(s.worker(vec![call(b"x")], false, t0), vec![Kill]);
        assert_eq!(s.failure(), Some(&Failure::CallQueueFull));
        assert!(failure(&s).starts_with("the worker queued more than 64 calls"));

        // Bytes: two of the largest calls wait, a third byte does not.
        let (mut s, t0) = calling();
        let big = (worker::CALL, vec![0u8; MAX_FRAME]);
        assert_eq!(s.worker(vec![big.clone(), big], false, t0), vec![]);
        assert_eq!(s.worker(vec![call(b"x")], false, t0), vec![Kill]);
        assert_eq!(s.failure(), Some(&Failure::CallQueueFull));
    }

    #[test]
    fn rule_2_issued_calls_leave_room_in_the_queue() {
        let (mut s, t0) = calling();
        for _ in 0..3 * MAX_QUEUED_CALLS {
            s.worker(vec![call(b"x")], false, t0);
            s.guest(result(b"r"), t0);
        }
        assert_eq!(s.failure(), None);
    }

    #[test]
    fn rule_3_close_while_idle_resumes_the_guest_ends_its_input_and_waits_for_its_exit() {
        let (mut s, t0) = open();
        assert_eq!(s.worker(vec![close()], false, t0), vec![Resume, EndInput]);
        assert_eq!(s.phase(), Phase::Closing);
        assert_eq!(s.deadline(), Some(t0 + EXIT_GRACE));
        assert!(s.closed());
        assert_eq!(s.end(), SessionEnd::Closed);
    }

    #[test]
    fn rule_3_close_waits_for_the_call_in_progress_and_the_calls_before_it() {
        let (mut s, t0) = calling();
        assert_eq!(s.worker(vec![call(b"a"), close()], false, t0), vec![]);
        assert_eq!(
            s.guest(result(b"r"), t0),
            vec![Result(b"r".to_vec()), Request(b"a".to_vec()), Resume]
        );
        assert_eq!(
            s.guest(result(b"ra"), t0),
            vec![Result(b"ra".to_vec()), Resume, EndInput],
            "not stopped: the close waits"
        );
        assert_eq!(s.phase(), Phase::Closing);
    }

    #[test]
    fn rule_3_a_call_sent_after_close_still_runs_if_the_session_is_not_closing_yet() {
        let (mut s, t0) = calling();
        assert_eq!(s.worker(vec![close(), call(b"late")], false, t0), vec![]);
        assert_eq!(
            s.guest(result(b"r"), t0),
            vec![Result(b"r".to_vec()), Request(b"late".to_vec()), Resume]
        );
    }

    #[test]
    fn rule_3_a_call_sent_once_closing_is_never_issued() {
        let (mut s, t0) = open();
        s.worker(vec![close()], false, t0);
        assert_eq!(s.worker(vec![call(b"late")], false, t0), vec![]);
        assert_eq!(s.phase(), Phase::Closing);
        assert!(s.closed());
    }

    #[test]
    fn rule_3_a_guest_that_does_not_exit_in_its_grace_is_killed_and_the_session_still_closed() {
        let (mut s, t0) = open();
        s.worker(vec![close()], false, t0);
        assert_eq!(s.tick(t0 + EXIT_GRACE), vec![Kill]);
        assert_eq!(s.failure(), None);
        assert!(s.closed());
        assert_eq!(s.end(), SessionEnd::Closed);
        // Said in its report (a timeout, not a crash), not as a failure of the session.
        assert!(s.exit_overdue());
        assert!(!s.timed_out());
    }

    #[test]
    fn rule_19_a_lingering_guest_displaced_is_killed_before_its_grace_ends() {
        let (mut s, t0) = open();
        s.worker(vec![close()], false, t0);
        assert_eq!(s.linger_displaced(3), vec![Kill]);
        assert_eq!(s.deadline(), None, "no grace left to wait for");
        assert_eq!(s.displaced_at(), Some(3));
        assert!(s.exit_overdue());
        assert!(s.closed());
        assert_eq!(s.failure(), None);
    }

    #[test]
    fn rule_19_only_a_closing_session_lingers() {
        let (mut s, _) = calling();
        assert_eq!(s.linger_displaced(3), vec![]);
        assert_eq!(s.displaced_at(), None);
        assert!(!s.exit_overdue());
    }

    #[test]
    fn rule_4_any_other_worker_frame_fails_the_session_and_drops_the_frames_behind_it() {
        let (mut s, t0) = open();
        let frames = vec![call(b"a"), (worker::OPEN, b"{}".to_vec()), call(b"b")];
        // The call queued before the bad frame is still issued (to a guest being killed).
        assert_eq!(
            s.worker(frames, false, t0),
            vec![Kill, Request(b"a".to_vec()), Resume]
        );
        assert_eq!(failure(&s), "unexpected OPEN frame from the worker");
        assert_eq!(
            s.guest(result(b"ra"), t0),
            vec![Stop, Result(b"ra".to_vec())]
        );
        assert!(!s.closed());
    }

    #[test]
    fn rule_5_hello_while_starting_opens_the_session_and_stops_the_idle_guest() {
        let t0 = Instant::now();
        let mut s = Phases::new(Some(TIMEOUT), t0);
        assert_eq!(s.guest(Event::Hello, t0), vec![Stop, Opened]);
        assert_eq!((s.phase(), s.deadline()), (Phase::Idle, None));
    }

    #[test]
    fn rule_5_hello_with_the_close_waiting_closes_at_once() {
        let t0 = Instant::now();
        let mut s = Phases::new(Some(TIMEOUT), t0);
        s.worker(vec![close()], false, t0);
        assert_eq!(s.guest(Event::Hello, t0), vec![Opened, Resume, EndInput]);
        assert!(s.closed());
    }

    #[test]
    fn rule_6_result_while_calling_stops_the_guest_then_answers_the_worker() {
        let (mut s, t0) = calling();
        assert_eq!(
            s.guest(result(b"answer"), t0),
            vec![Stop, Result(b"answer".to_vec())]
        );
        assert_eq!((s.phase(), s.deadline()), (Phase::Idle, None));
    }

    #[test]
    fn rule_7_error_while_calling_is_forwarded_and_the_session_goes_on() {
        let (mut s, t0) = calling();
        let e = error("ValueError", "bad input");
        assert_eq!(
            s.guest(Event::Error(e.clone()), t0),
            vec![SampleMemory, Stop, CallError(e.clone())]
        );
        assert_eq!(s.guest_error(), Some(&e));
        assert_eq!((s.phase(), s.failure()), (Phase::Idle, None));
        assert_eq!(
            s.worker(vec![call(b"next")], false, t0),
            vec![Request(b"next".to_vec()), Resume]
        );
    }

    #[test]
    fn rule_8_error_while_starting_is_a_start_the_guest_refused() {
        let t0 = Instant::now();
        let mut s = Phases::new(Some(TIMEOUT), t0);
        s.worker(vec![call(b"x")], false, t0);
        let e = error("ModuleNotFoundError", "No module named 'wf'");
        assert_eq!(s.guest(Event::Error(e.clone()), t0), vec![Kill]);
        assert_eq!(
            failure(&s),
            "the guest could not start: ModuleNotFoundError: No module named 'wf'"
        );
        assert_eq!(s.phase(), Phase::Starting, "the queued call is not issued");
        assert_eq!(s.guest_error(), Some(&e));
        assert_eq!(s.end(), SessionEnd::RefusedStart);
        assert!(!s.closed());
    }

    #[test]
    fn rule_9_query_while_calling_is_answered_and_the_call_goes_on() {
        let (mut s, t0) = calling();
        assert_eq!(s.guest(Event::Query, t0), vec![AnswerQuery]);
        assert_eq!(s.phase(), Phase::Calling);
        assert_eq!(s.deadline(), Some(t0 + TIMEOUT));
    }

    #[test]
    fn rule_10_log_is_echoed_in_every_phase() {
        let log = || Event::Log {
            level: 20,
            text: "hi".into(),
        };
        let echoed = vec![Log {
            level: 20,
            text: "hi".into(),
        }];
        let t0 = Instant::now();
        let mut s = Phases::new(None, t0);
        assert_eq!(s.guest(log(), t0), echoed);
        let (mut s, t0) = open();
        assert_eq!(s.guest(log(), t0), echoed);
        let (mut s, t0) = calling();
        assert_eq!(s.guest(log(), t0), echoed);
        s.worker(vec![close()], false, t0);
        s.guest(result(b"r"), t0);
        assert_eq!(s.phase(), Phase::Closing);
        assert_eq!(s.guest(log(), t0), echoed);
        assert_eq!(s.failure(), None);
    }

    #[test]
    fn rule_11_a_frame_the_conversation_rejects_is_a_protocol_error() {
        let (mut s, _) = calling();
        let e = ProtocolError("LOG frame without a level byte".into());
        assert_eq!(s.guest_broke(e), vec![Kill]);
        assert!(s.protocol_error());
        assert_eq!(
            failure(&s),
            "protocol error: LOG frame without a level byte"
        );
    }

    #[test]
    fn rule_11_a_guest_being_killed_may_stop_inside_a_frame() {
        let (mut s, _) = calling();
        s.fail(Failure::Output(1024));
        assert_eq!(s.guest_broke(ProtocolError("truncated".into())), vec![]);
        assert!(!s.protocol_error());
        assert_eq!(s.failure(), Some(&Failure::Output(1024)));
    }

    #[test]
    fn rule_11_hello_outside_starting_and_answers_outside_a_call_are_protocol_errors() {
        let cases: Vec<(Phases, Instant, Event, &str)> = vec![
            {
                let (s, t) = open();
                (
                    s,
                    t,
                    Event::Hello,
                    "HELLO frame from the guest while the session is idle",
                )
            },
            {
                let (s, t) = calling();
                (
                    s,
                    t,
                    Event::Hello,
                    "HELLO frame from the guest while the session is calling",
                )
            },
            {
                let (s, t) = open();
                (
                    s,
                    t,
                    result(b"r"),
                    "RESULT frame from the guest while the session is idle",
                )
            },
            {
                let t = Instant::now();
                (
                    Phases::new(None, t),
                    t,
                    result(b"r"),
                    "RESULT frame from the guest while the session is starting",
                )
            },
            {
                let (s, t) = open();
                (
                    s,
                    t,
                    Event::Error(error("E", "m")),
                    "ERROR frame from the guest while the session is idle",
                )
            },
            {
                let (s, t) = open();
                (
                    s,
                    t,
                    Event::Query,
                    "QUERY frame from the guest while the session is idle",
                )
            },
        ];
        for (mut s, t, event, says) in cases {
            let phase = s.phase();
            assert_eq!(s.guest(event, t), vec![Kill], "{says}");
            assert!(s.protocol_error(), "{says}");
            assert_eq!(failure(&s), format!("protocol error: unexpected {says}"));
            assert_eq!(s.phase(), phase, "{says}");
        }
    }

    #[test]
    fn rule_12_the_worker_gone_while_idle_closes_the_session() {
        let (mut s, t0) = open();
        assert_eq!(s.worker(vec![], true, t0), vec![Resume, EndInput]);
        assert_eq!(s.phase(), Phase::Closing);
        assert!(s.closed());
    }

    #[test]
    fn rule_12_the_worker_gone_during_a_call_gives_it_the_grace_then_fails_the_session() {
        let (mut s, t0) = calling();
        let t = t0 + Duration::from_secs(1);
        assert_eq!(s.worker(vec![], true, t), vec![]);
        assert_eq!(
            s.deadline(),
            Some(t + EXIT_GRACE),
            "sooner than the call's timeout"
        );
        assert_eq!(s.tick(t + EXIT_GRACE), vec![Kill]);
        assert_eq!(failure(&s), "the worker closed the session during a call");
        assert!(!s.timed_out());
        assert!(!s.closed());
    }

    #[test]
    fn rule_12_a_call_that_ends_within_the_grace_closes_the_session() {
        let (mut s, t0) = calling();
        s.worker(vec![], true, t0);
        assert_eq!(
            s.guest(result(b"r"), t0),
            vec![Result(b"r".to_vec()), Resume, EndInput]
        );
        assert!(s.closed());
    }

    #[test]
    fn rule_12_a_grace_never_extends_a_deadline() {
        let t0 = Instant::now();
        let mut s = Phases::new(Some(Duration::from_millis(100)), t0);
        s.guest(Event::Hello, t0);
        s.worker(vec![call(b"x")], false, t0);
        s.worker(vec![], true, t0);
        assert_eq!(s.deadline(), Some(t0 + Duration::from_millis(100)));
    }

    #[test]
    fn rule_12_the_worker_gone_during_the_start_ends_it_after_the_grace() {
        // Said as for a call: the message does not tell a start from a call.
        let t0 = Instant::now();
        let mut s = Phases::new(Some(TIMEOUT), t0);
        s.worker(vec![], true, t0);
        assert_eq!(s.deadline(), Some(t0 + EXIT_GRACE));
        assert_eq!(s.tick(t0 + EXIT_GRACE), vec![Kill]);
        assert_eq!(failure(&s), "the worker closed the session during a call");
    }

    #[test]
    fn rule_12_calls_queued_by_a_worker_that_left_get_the_call_timeout_each() {
        // The grace applies to the start or call in progress when the worker left; calls it
        // had queued behind it are still issued, each with the call timeout.
        let (mut s, t0) = calling();
        s.worker(vec![call(b"a")], true, t0);
        let t = t0 + Duration::from_secs(1);
        assert_eq!(
            s.guest(result(b"r"), t),
            vec![Result(b"r".to_vec()), Request(b"a".to_vec()), Resume]
        );
        assert_eq!(s.deadline(), Some(t + TIMEOUT));
        s.tick(t + TIMEOUT);
        assert_eq!(failure(&s), "the worker closed the session during a call");
    }

    #[test]
    fn rule_13_a_call_past_its_timeout_times_the_session_out() {
        let (mut s, t0) = calling();
        assert_eq!(s.tick(t0 + TIMEOUT - Duration::from_nanos(1)), vec![]);
        assert_eq!(s.tick(t0 + TIMEOUT), vec![Kill]);
        assert!(s.timed_out());
        assert_eq!(failure(&s), "the call took longer than 5s");
        assert_eq!(s.deadline(), None);
        assert_eq!(s.tick(t0 + TIMEOUT * 2), vec![], "a deadline fires once");
    }

    #[test]
    fn rule_13_a_start_without_hello_in_time_fails_the_session() {
        let t0 = Instant::now();
        let mut s = Phases::new(Some(TIMEOUT), t0);
        assert_eq!(s.tick(t0 + START_WAIT), vec![Kill]);
        assert_eq!(failure(&s), "the guest did not say HELLO in time");
        assert!(!s.timed_out());
        assert_eq!(s.end(), SessionEnd::EndedEarly);
    }

    #[test]
    fn rule_14_failures_of_the_io_side_kill_the_guest_and_the_first_reason_stays() {
        let (mut s, t0) = calling();
        assert_eq!(s.fail(Failure::Output(1 << 20)), vec![Kill]);
        assert_eq!(s.fail(Failure::NoStop(Duration::from_secs(2))), vec![Kill]);
        assert_eq!(
            failure(&s),
            "the guest's output and logs exceeded limits.output (1048576 bytes)"
        );
        assert!(!s.protocol_error());
        assert_eq!(s.tick(t0 + TIMEOUT), vec![Kill]);
        assert!(s.timed_out(), "the call's deadline still counts");
        assert_eq!(s.failure(), Some(&Failure::Output(1 << 20)));
    }

    #[test]
    fn rule_14_answers_left_unread_are_a_protocol_error() {
        let (mut s, _) = calling();
        s.fail(Failure::QueryUnread(OutboxFull { limit: 1 }));
        assert!(s.protocol_error());
    }

    #[test]
    fn rule_14_a_request_the_guest_cannot_take_leaves_no_call_in_progress() {
        let (mut s, t0) = open();
        s.worker(vec![call(b"x")], false, t0);
        assert_eq!(s.request_unsent(OutboxFull { limit: 9 }), vec![Kill]);
        assert_eq!((s.phase(), s.deadline()), (Phase::Idle, None));
        assert_eq!(
            s.failure(),
            Some(&Failure::RequestUnsent(OutboxFull { limit: 9 }))
        );
        assert!(!s.protocol_error());
    }

    #[test]
    fn rule_15_a_guest_that_ends_before_close_fails_the_session() {
        let (s, _) = open();
        assert!(!s.closed());
        assert_eq!(s.end(), SessionEnd::EndedEarly);
        let (s, _) = calling();
        assert!(!s.closed());
        let s = Phases::new(None, Instant::now());
        assert!(!s.closed());
        assert_eq!(s.end(), SessionEnd::EndedEarly);
    }

    #[test]
    fn rule_15_a_failure_while_closing_makes_the_end_failed() {
        let (mut s, t0) = open();
        s.worker(vec![close()], false, t0);
        s.fail(Failure::Output(1));
        assert!(!s.closed());
        assert_eq!(s.end(), SessionEnd::Closed);
    }
}
