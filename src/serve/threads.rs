//! The session threads, kept for the next session: a thread that served one waits for the
//! next connection instead of exiting, so that a session costs no thread creation and
//! teardown (the stack's mmap, guard page and alternate signal stack, then their unmapping).
//! A thread idle for [`IDLE`] exits, and at most [`MAX_IDLE`] wait at once, so that a
//! burst's threads do not stay forever.

use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a session thread waits for its next session before it exits.
const IDLE: Duration = Duration::from_secs(10);
/// How many session threads wait for a session at most; a thread that would be one more
/// exits.
const MAX_IDLE: usize = 64;

/// One session's work, run on a session thread.
pub type Job = Box<dyn FnOnce() + Send + 'static>;

/// The idle session threads: each waits on its own channel for one job at a time.
#[derive(Default, Clone)]
pub struct SessionThreads {
    idle: Arc<Mutex<Vec<Idle>>>,
}

struct Idle {
    id: u64,
    job: SyncSender<Job>,
}

impl SessionThreads {
    /// Runs `job` on an idle session thread, or on a new one. Err: no thread could be
    /// started (the job is dropped, with what it owes).
    pub fn run(&self, mut job: Job) -> std::io::Result<()> {
        loop {
            let Some(idle) = self.idle.lock().unwrap().pop() else {
                break;
            };
            // A thread taken off the list waits for this send (or for its sender's end):
            // only a thread that ended another way (a panic in its last session) refuses it.
            match idle.job.send(job) {
                Ok(()) => return Ok(()),
                Err(mpsc::SendError(back)) => job = back,
            }
        }
        let idle = self.idle.clone();
        std::thread::Builder::new()
            .name("session".into())
            .spawn(move || serve_jobs(job, &idle))
            .map(|_| ())
    }
}

/// A session thread's life: its first job, then each one handed to it while it waits.
fn serve_jobs(first: Job, idle: &Mutex<Vec<Idle>>) {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let (tx, rx) = mpsc::sync_channel::<Job>(1);
    let mut job = first;
    loop {
        job();
        {
            let mut list = idle.lock().unwrap();
            if list.len() >= MAX_IDLE {
                return;
            }
            list.push(Idle {
                id,
                job: tx.clone(),
            });
        }
        job = match rx.recv_timeout(IDLE) {
            Ok(j) => j,
            Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {
                // Leave the list. A thread no longer on it was taken by `run`, which sends
                // it a job (or drops its sender): wait for that, so that no job is lost.
                let mut list = idle.lock().unwrap();
                if let Some(i) = list.iter().position(|t| t.id == id) {
                    list.swap_remove(i);
                    return;
                }
                drop(list);
                match rx.recv() {
                    Ok(j) => j,
                    Err(_) => return,
                }
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    #[test]
    fn a_thread_that_served_a_session_serves_the_next() {
        let threads = SessionThreads::default();
        let (tx, rx) = channel();
        let mut ran_on = std::collections::HashSet::new();
        for _ in 0..3 {
            let tx = tx.clone();
            threads
                .run(Box::new(move || {
                    tx.send(std::thread::current().id()).unwrap();
                }))
                .unwrap();
            ran_on.insert(rx.recv().unwrap());
            // The job has ended; its thread goes back to wait for the next.
            while threads.idle.lock().unwrap().is_empty() {
                std::thread::yield_now();
            }
        }
        assert_eq!(ran_on.len(), 1, "one thread served the three sessions");
        assert_eq!(threads.idle.lock().unwrap().len(), 1);
    }

    #[test]
    fn sessions_at_once_get_threads_of_their_own() {
        let threads = SessionThreads::default();
        let gate = Arc::new(std::sync::Barrier::new(5));
        let (tx, rx) = channel();
        for _ in 0..4 {
            let (gate, tx) = (gate.clone(), tx.clone());
            threads
                .run(Box::new(move || {
                    gate.wait(); // all four run at once, or none finishes
                    tx.send(()).unwrap();
                }))
                .unwrap();
        }
        gate.wait();
        for _ in 0..4 {
            rx.recv().unwrap();
        }
    }

    #[test]
    fn a_thread_whose_session_panicked_is_not_handed_another() {
        let threads = SessionThreads::default();
        threads
            .run(Box::new(|| panic!("a bug in a session")))
            .unwrap();
        let (tx, rx) = channel();
        threads
            .run(Box::new(move || {
                tx.send(()).unwrap();
            }))
            .unwrap();
        rx.recv().unwrap();
    }
}
