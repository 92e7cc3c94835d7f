//! `wfjail serve` answers every connection with a frame before it closes it. A connection
//! whose session thread cannot start (here the server's address space is limited, with
//! prlimit(1), once it serves, so that a thread's stack no longer fits) gets FAILED saying
//! why. Before, its thread's closure was dropped with the connection in it, the worker's OPEN
//! unread: the worker's read failed with ECONNRESET, as a Replayer once saw (issue 20).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use wfjail::protocol::worker;

use crate::common::{Scratch, wfjail_bin};

/// What the worker reads on `conn` until it ends (end-of-file or an error: the bytes before
/// an ECONNRESET are kept), and how it ended.
fn read_all(conn: &mut UnixStream) -> (Vec<u8>, Option<std::io::ErrorKind>) {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match conn.read(&mut buf) {
            Ok(0) => return (bytes, None),
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return (bytes, Some(e.kind())),
        }
    }
}

fn vm_size_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// A `wfjail serve` (exec mode, no worker) on a socket in `s`, killed when dropped.
struct Serve(std::process::Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One try: a server whose address space leaves no room for a session thread's stack gets
/// an OPEN. What the worker read and how its read ended; None when the limit did not bite
/// (the thread started: the try says nothing).
fn open_on_a_server_out_of_room(
    s: &Scratch,
    name: &str,
) -> Option<(Vec<u8>, Option<std::io::ErrorKind>)> {
    let sock = s.path(name);
    let serve = Serve(
        Command::new(wfjail_bin())
            .args(["serve", "-q", "-p", "default", "--socket"])
            .arg(&sock)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sock.exists() {
        assert!(Instant::now() < deadline, "serve did not bind its socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200)); // in its accept loop, its memory settled
    // Half a MiB of address space to spare: a session thread's 2 MiB stack does not fit.
    let limit = (vm_size_kb(serve.0.id()) + 512) * 1024;
    let limited = Command::new("prlimit")
        .arg(format!("--pid={}", serve.0.id()))
        .arg(format!("--as={limit}"))
        .status()
        .unwrap();
    assert!(limited.success());

    let mut conn = UnixStream::connect(&sock).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    conn.set_write_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // The server answers FAILED at accept, before it reads the OPEN, and closes: a write
    // after that fails (EPIPE), and the answer is still there to read.
    if let Err(e) = conn.write_all(&worker::encode(worker::OPEN, br#"{"argv": ["/bin/true"]}"#)) {
        assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            ),
            "{e}"
        );
    }
    let (bytes, end) = read_all(&mut conn);
    // An answer that is not the refusal: the thread started after all (its session answers
    // for its guest, which is no wfjail guest).
    let started = !bytes.is_empty()
        && !String::from_utf8_lossy(&bytes).contains("cannot start a thread for this session");
    (!started).then_some((bytes, end))
}

#[test]
fn an_open_whose_session_thread_cannot_start_is_answered_failed() {
    if Command::new("prlimit").arg("--version").output().is_err() {
        eprintln!("skipped: no prlimit(1)");
        return;
    }
    let s = Scratch::new("unanswered");
    // The limit is set from a reading of the server's size: a try where it did not bite is
    // tried again.
    let (bytes, end) = (0..3)
        .find_map(|i| open_on_a_server_out_of_room(&s, &format!("serve-{i}.sock")))
        .expect("in three tries the server's session thread always started");
    let mut d = worker::decoder(1 << 20);
    d.feed(&bytes);
    let (kind, payload) = d
        .next_raw()
        .unwrap()
        .unwrap_or_else(|| panic!("no frame, the connection ended with {end:?}"));
    assert_eq!(kind, worker::FAILED);
    let report: Value = serde_json::from_slice(&payload).unwrap();
    assert_eq!(report["status"], "launch_error", "{report}");
    assert!(
        report["error"]
            .as_str()
            .unwrap()
            .starts_with("wfjail cannot start a thread for this session"),
        "{report}"
    );
    assert_eq!(d.next_raw().unwrap(), None, "one frame only");
}
