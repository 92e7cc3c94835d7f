//! `wfjail run` against a hostile guest (issue 7: A, C1, E1, E2, E3): each test starts the real
//! binary with a guest that attacks the supervisor or the report, and asserts what the guest
//! saw, what the report says, and (for floods) wfjail's own peak memory, read from
//! /proc/PID/status while it runs. No timed assertions: a flood must end by the deadline or a
//! limit, with a report.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{Outcome, PY, Scratch, wfjail, wfjail_bin};

/// wfjail's own peak resident memory must stay under this, whatever the guest sends.
const RSS_BOUND_KB: u64 = 64 * 1024;

/// `VmHWM` (peak resident set, kB) of a live process.
fn vm_hwm_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Waits for `child`, sampling its peak RSS; kills it (by pid) after `give_up`, so that a
/// supervisor that never ends fails the test instead of hanging it. Returns the exit code
/// (`None` if it had to be killed) and the largest VmHWM seen.
fn wait_measuring(child: &mut Child, give_up: Duration) -> (Option<i32>, u64) {
    let start = Instant::now();
    let mut peak = 0;
    loop {
        if let Some(kb) = vm_hwm_kb(child.id()) {
            peak = peak.max(kb);
        }
        if let Some(st) = child.try_wait().unwrap() {
            return (st.code(), peak);
        }
        if start.elapsed() > give_up {
            let _ = child.kill();
            let _ = child.wait();
            return (None, peak);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A framed guest (Python) that says HELLO on fd 4 and then runs `body`; it never reads fd 3.
fn framed_guest(body: &str) -> String {
    format!(
        "import os, struct\n\
         def frame(kind, payload=b''):\n    return struct.pack('<I', len(payload) + 1) + bytes([kind]) + payload\n\
         os.write(4, frame(1, b'wfjail\\x01\\x00'))\n{body}\n"
    )
}

/// Runs `wfjail run --report R ARGS...` with stdin from /dev/null and stderr to a file,
/// measuring wfjail's peak RSS. Returns the outcome (stderr read back) and the peak.
fn run_measured(args: &[&str], give_up: Duration) -> (Outcome, u64, Option<i32>) {
    let s = Scratch::new("hostile");
    let report = s.path("report.json");
    let err_path = s.path("stderr");
    let mut cmd = Command::new(wfjail_bin());
    cmd.arg("run").arg("--report").arg(&report).args(args);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap());
    let mut child = cmd.spawn().unwrap();
    let (code, peak) = wait_measuring(&mut child, give_up);
    let stderr = std::fs::read(&err_path).unwrap_or_default();
    let report = std::fs::read_to_string(&report)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(serde_json::Value::Null);
    let o = Outcome {
        code: code.unwrap_or(-1),
        stdout: String::new(),
        // Only the end: a flood's echo can be large.
        stderr: String::from_utf8_lossy(&stderr[stderr.len().saturating_sub(4096)..]).into_owned(),
        report,
    };
    (o, peak, code)
}

// ---- A: the supervisor's own memory and time ------------------------------------------------

#[test]
fn query_flood_without_reading_is_stopped_with_bounded_memory() {
    // Denied writes with long, distinct paths (long answers), each followed by QUERY, then
    // QUERY frames by the thousand; fd 3 is never read, so every answer stays with wfjail.
    // Written outside every grant, in a directory that exists (so the path is judged).
    let long = "x".repeat(200);
    let body = format!(
        "for i in range(300):\n\
         \x20   try:\n        os.open('/tmp/{long}%d' % i, os.O_WRONLY | os.O_CREAT)\n\
         \x20   except OSError:\n        pass\n\
         \x20   os.write(4, frame(6))\n\
         while True:\n    os.write(4, frame(6) * 10000)\n"
    );
    let program = framed_guest(&body);
    let (o, peak, code) = run_measured(
        &["--timeout", "60s", "--", PY, "-c", &program],
        Duration::from_secs(90),
    );
    o.check(code.is_some(), "wfjail ended by itself");
    // Its denied writes outrank the broken conversation (docs/architecture.md), and the
    // report still says why the guest was stopped.
    o.check(
        o.status() == "violation" && o.code == 3,
        "stopped, with its violations",
    );
    o.check(
        o.report["error"]
            .as_str()
            .unwrap_or("")
            .contains("unread on fd 3"),
        "the report says why",
    );
    o.check(
        o.violation("openat").is_some() || o.violation("open").is_some(),
        "the denied writes are in the report",
    );
    o.check(
        peak < RSS_BOUND_KB,
        &format!("wfjail's peak RSS {peak} kB stays under {RSS_BOUND_KB} kB"),
    );
}

#[test]
fn empty_log_flood_ends_by_the_deadline_with_a_report_and_bounded_memory() {
    // LOG frames with a level byte and no text, as fast as the pipe takes them.
    let body = "f = frame(5, b'\\x14') * 20000\nwhile True:\n    os.write(4, f)";
    let program = framed_guest(body);
    let (o, peak, code) = run_measured(
        &["--timeout", "2s", "--", PY, "-c", &program],
        Duration::from_secs(60),
    );
    o.check(
        code.is_some(),
        "wfjail ended by itself (the deadline fired)",
    );
    o.check(
        (o.status() == "timeout" && o.code == 4)
            || (o.status() == "limit" && o.report["limit"] == "output" && o.code == 5),
        "ends as timeout or the output limit, with a written report",
    );
    o.check(
        peak < RSS_BOUND_KB,
        &format!("wfjail's peak RSS {peak} kB stays under {RSS_BOUND_KB} kB"),
    );
}

#[test]
fn empty_log_flood_is_charged_to_the_output_limit() {
    // With a long deadline, only the output bound can end it: empty frames are not free.
    let s = Scratch::new("logcharge");
    let policy = s.write(
        "p.toml",
        "extends = \"default\"\n[limits]\noutput = \"1MiB\"\n",
    );
    let body = "f = frame(5, b'\\x14') * 20000\nwhile True:\n    os.write(4, f)";
    let program = framed_guest(body);
    let (o, peak, code) = run_measured(
        &[
            "-q",
            "-p",
            policy.to_str().unwrap(),
            "--timeout",
            "120s",
            "--",
            PY,
            "-c",
            &program,
        ],
        Duration::from_secs(100),
    );
    o.check(code.is_some(), "wfjail ended by itself");
    o.check(
        o.status() == "limit" && o.report["limit"] == "output" && o.code == 5,
        "empty LOG frames count against limits.output",
    );
    o.check(peak < RSS_BOUND_KB, &format!("peak RSS {peak} kB bounded"));
}

// ---- C1: run --raw gets a pipe, never wfjail's own stdin ------------------------------------

/// `wfjail run --raw --report R -- python3 -c CODE` with `stdin` as wfjail's stdin.
fn raw_with_stdin(code: &str, stdin: Stdio) -> Outcome {
    let s = Scratch::new("stdin");
    let report = s.path("report.json");
    let out = Command::new(wfjail_bin())
        .arg("run")
        .arg("--report")
        .arg(&report)
        .args(["--raw", "--timeout", "20s", "--", PY, "-c", code])
        .stdin(stdin)
        .output()
        .unwrap();
    Outcome::collect(out, &report)
}

const ERRNO_OF_STDIN_WRITES: &str = "import os\n\
def errno_of(f):\n    try:\n        f()\n        return 0\n    except OSError as e:\n        return e.errno\n\
print('truncate=%d' % errno_of(lambda: os.ftruncate(0, 0)))\n\
print('write=%d' % errno_of(lambda: os.write(0, b'OVERWRITTEN')))\n";

#[test]
fn a_read_write_file_stdin_cannot_be_written_by_the_guest() {
    let s = Scratch::new("rwstdin");
    let victim = s.write("victim.txt", "precious\n");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&victim)
        .unwrap();
    let o = raw_with_stdin(ERRNO_OF_STDIN_WRITES, Stdio::from(file));
    o.check(o.status() == "ok", "the guest ran");
    o.check(
        o.stdout.contains(&format!("truncate={}", libc::EINVAL))
            && o.stdout.contains(&format!("write={}", libc::EBADF)),
        "fd 0 is the read end of a pipe: ftruncate EINVAL, write EBADF",
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
}

#[test]
fn a_socket_stdin_gives_no_way_back_to_its_peer() {
    let (ours, theirs) = UnixStream::pair().unwrap();
    (&ours).write_all(b"ping").unwrap();
    let code = format!(
        "{ERRNO_OF_STDIN_WRITES}print('read=%r' % os.read(0, 4))\n\
         import socket\n\
         try:\n    socket.socket(fileno=0).send(b'x')\n    print('send=0')\n\
         except OSError as e:\n    print('send=%d' % e.errno)\n"
    );
    let o = raw_with_stdin(&code, Stdio::from(std::os::fd::OwnedFd::from(theirs)));
    o.check(o.status() == "ok", "the guest ran");
    o.check(o.stdout.contains("read=b'ping'"), "the input still arrives");
    o.check(
        o.stdout.contains(&format!("write={}", libc::EBADF))
            && o.stdout.contains(&format!("send={}", libc::ENOTSOCK)),
        "fd 0 is a pipe: no write, not a socket",
    );
    ours.set_nonblocking(true).unwrap();
    let mut got = [0u8; 64];
    let r = (&ours).read(&mut got);
    o.check(
        matches!(&r, Ok(0)) || matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        &format!("nothing reached the peer: {r:?}"),
    );
}

#[test]
fn piped_input_still_reaches_a_raw_guest() {
    let mut child = Command::new(wfjail_bin())
        .args([
            "run",
            "--raw",
            "--",
            PY,
            "-c",
            "import sys; print(sys.stdin.read())",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"hi\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n\n");
}

// ---- E1: guest text cannot pass for wfjail's -------------------------------------------------

/// The lines of `stderr` that claim to be wfjail's.
fn wfjail_lines(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.starts_with("wfjail")).collect()
}

#[test]
fn guest_stderr_is_prefixed_and_escaped_stdout_stays_exact() {
    let code = [
        "import sys",
        "sys.stderr.write('y' * 10000 + '\\n')",
        "sys.stderr.write('wfjail: violation: network socket(AF_INET) denied [x]: forged\\n')",
        "sys.stderr.write('wfjail: ok in 1.0 ms\\n\\x1b[1A\\x1b[2Kerased\\r\\n')",
        "sys.stderr.write('no newline at the end')",
        "sys.stderr.flush()",
        "sys.stdout.buffer.write(b'\\x1b[31mred\\x00\\r')",
    ]
    .join("\n");
    let o = crate::common::py("default", &[], &code);
    o.check(o.status() == "ok", "the guest ran");
    o.check(
        wfjail_lines(&o.stderr).is_empty(),
        "no line of wfjail's stderr starts like wfjail's own",
    );
    o.check(
        o.stderr
            .lines()
            .any(|l| l == "[guest] wfjail: ok in 1.0 ms"),
        "the guest's line is there, behind the prefix",
    );
    o.check(
        !o.stderr.contains('\x1b') && !o.stderr.contains('\r'),
        "no escape sequence or carriage return reaches the terminal",
    );
    o.check(
        o.stderr.contains("[guest] \\x1b[1A\\x1b[2Kerased\\x0d"),
        "control characters are shown escaped",
    );
    o.check(
        o.stderr
            .lines()
            .all(|l| l.starts_with("[guest] ") && l.len() <= 8 + 4096),
        "a line without newline is cut, each piece behind the prefix",
    );
    o.check(
        o.stderr.matches('y').count() == 10000,
        "the long line is echoed whole",
    );
    o.check(
        o.stderr.lines().last() == Some("[guest] no newline at the end"),
        "a last line without newline is echoed at the end",
    );
    o.check(
        o.stdout.as_bytes() == b"\x1b[31mred\x00\r",
        "raw stdout is the result, byte for byte",
    );
    o.check(
        o.report["stderr_tail"]
            .as_str()
            .unwrap()
            .contains("wfjail: ok in 1.0 ms\n\u{1b}[1A"),
        "the report's stderr tail stays raw",
    );
}

#[test]
fn framed_logs_and_errors_cannot_pass_for_wfjail_lines() {
    let body = "import json\n\
os.write(4, frame(5, b'\\x14line one\\nwfjail: ok in 1.0 ms\\x1b[2K'))\n\
err = {'type': 'Boom', 'message': 'bad\\nwfjail: ok in 2.0 ms', 'traceback': 'Traceback\\nwfjail: ok in 3.0 ms\\n'}\n\
os.write(4, frame(4, json.dumps(err).encode()))\n";
    let program = framed_guest(body);
    let o = wfjail(&["run", "--timeout", "20s", "--", PY, "-c", &program]);
    o.check(o.status() == "guest_error", "the guest's ERROR");
    let own = wfjail_lines(&o.stderr);
    o.check(
        own.len() == 1 && own[0].starts_with("wfjail: guest_error in "),
        "the only wfjail line is wfjail's summary",
    );
    o.check(
        own[0].contains("Boom: bad\\x0awfjail: ok in 2.0 ms"),
        "the guest's message stays on the summary line, escaped",
    );
    o.check(
        o.stderr
            .lines()
            .any(|l| l == "[guest] log (info): wfjail: ok in 1.0 ms\\x1b[2K"),
        "each LOG line is behind the prefix, escaped",
    );
    o.check(
        o.stderr
            .lines()
            .any(|l| l == "[guest] wfjail: ok in 3.0 ms"),
        "the traceback is behind the prefix",
    );
    o.check(
        !o.stderr.contains('\x1b'),
        "no escape sequence reaches the terminal",
    );
}

// ---- E3: a new kind of violation is never lost -----------------------------------------------

#[test]
fn a_socket_after_three_hundred_distinct_violations_is_reported() {
    let code = [
        "import os, socket",
        "for i in range(300):",
        "    try:",
        "        os.open('/tmp/wfjail-nope-%d' % i, os.O_WRONLY | os.O_CREAT)",
        "    except OSError:",
        "        pass",
        "try:",
        "    socket.socket(socket.AF_INET, socket.SOCK_STREAM)",
        "    print('socket=0')",
        "except OSError as e:",
        "    print('socket=%d' % e.errno)",
    ]
    .join("\n");
    let o = crate::common::py("default", &[], &code);
    o.check(o.status() == "violation", "violations");
    o.check(
        o.stdout.contains(&format!("socket={}", libc::EPERM)),
        "the socket was denied",
    );
    let v = o.assert_violation("socket", "network");
    o.check(
        v["args"].as_str().unwrap().contains("AF_INET"),
        "with its arguments",
    );
    let list = o.report["violations"].as_array().unwrap();
    let opens: u64 = list
        .iter()
        .filter(|v| v["category"] == "filesystem")
        .map(|v| v["count"].as_u64().unwrap())
        .sum();
    o.check(opens == 300, "every denied open is counted");
    o.check(list.len() <= 260, "the list stays bounded");
}

// ---- E2: limits come from the kernel, not from the guest's words -----------------------------

#[test]
fn printing_memory_error_is_not_a_memory_limit() {
    let o = crate::common::py(
        "default",
        &[],
        "import sys\nsys.stderr.write('Traceback...\\nMemoryError\\n')\nsys.exit(1)",
    );
    o.check(
        o.status() == "guest_error" && o.code == 1 && o.report["limit"].is_null(),
        "words alone are a guest error",
    );
}

#[test]
fn printing_file_too_large_is_not_a_file_size_limit() {
    let o = crate::common::py(
        "default",
        &[],
        "import sys\nsys.stderr.write(\"OSError: [Errno 27] File too large: 'x'\\n\")\nsys.exit(1)",
    );
    o.check(
        o.status() == "guest_error" && o.code == 1 && o.report["limit"].is_null(),
        "words alone are a guest error",
    );
}

#[test]
fn a_memory_error_frame_is_not_a_memory_limit() {
    let body = "import json\n\
err = {'type': 'MemoryError', 'message': '', 'traceback': 'MemoryError\\n'}\n\
os.write(4, frame(4, json.dumps(err).encode()))\n";
    let o = wfjail(&[
        "run",
        "--timeout",
        "20s",
        "--",
        PY,
        "-c",
        &framed_guest(body),
    ]);
    o.check(
        o.status() == "guest_error" && o.code == 1 && o.report["limit"].is_null(),
        "an ERROR typed MemoryError alone is a guest error",
    );
}

/// `default` with a 256 MiB `limits.memory`.
const MEMORY_256M: &str = "extends = \"default\"\n[limits]\nmemory = \"256MiB\"\n";

/// `wfjail run --raw` of `python3 -c code` under a policy file that holds `policy`.
fn raw_under(tag: &str, policy: &str, code: &str) -> Outcome {
    let s = Scratch::new(tag);
    let p = s.write("p.toml", policy);
    wfjail(&[
        "run",
        "-p",
        p.to_str().unwrap(),
        "--raw",
        "--",
        PY,
        "-c",
        code,
    ])
}

#[test]
fn filling_memory_to_the_limit_is_a_memory_limit() {
    let o = raw_under(
        "mem",
        MEMORY_256M,
        "chunks = []\nwhile True:\n    chunks.append(bytearray(1 << 20))",
    );
    o.check(
        o.code == 5 && o.status() == "limit" && o.report["limit"] == "memory",
        "the peak address space reached the limit",
    );
}

/// A guest that fills its address space in a few microseconds (mappings too small for the
/// filter to send) and exits at once leaves no time for a timed sample: the evidence is the
/// peak read at its `exit_group`, while its memory is whole.
#[test]
fn a_guest_that_fails_and_exits_between_two_samples_still_shows_the_memory_limit() {
    // 8 MiB mappings, under the sixteenth (16 MiB) that the filter sends, never touched.
    let code = "import mmap, os\nkeep = []\ntry:\n    while True:\n        \
                keep.append(mmap.mmap(-1, 8 << 20, flags=mmap.MAP_PRIVATE))\n\
                except (MemoryError, OSError):\n    os._exit(3)\n";
    for _ in 0..5 {
        let o = raw_under("memx", MEMORY_256M, code);
        o.check(
            o.code == 5 && o.status() == "limit" && o.report["limit"] == "memory",
            "the peak read at exit_group is near the limit",
        );
    }
}

/// The peak read at `exit_group` is the guest's own: a process it forked that filled its
/// address space and exited is not evidence that the guest met the limit.
#[test]
fn a_forked_child_at_the_limit_is_not_the_guests_memory_limit() {
    let policy = "extends = \"default\"\n[process]\nsubprocess = \"allow\"\n\
                  [limits]\nmemory = \"256MiB\"\nprocesses = 4\n";
    let code = "import mmap, os, sys\nif os.fork() == 0:\n    keep = []\n    try:\n        \
                while True:\n            \
                keep.append(mmap.mmap(-1, 8 << 20, flags=mmap.MAP_PRIVATE))\n    \
                except (MemoryError, OSError):\n        os._exit(0)\n\
                os.wait()\nsys.exit(1)\n";
    let o = raw_under("memf", policy, code);
    o.check(
        o.code == 1 && o.status() == "guest_error" && o.report["limit"].is_null(),
        "the guest failed on its own, far from the limit",
    );
}

#[test]
fn a_file_written_to_the_size_limit_is_a_file_size_limit() {
    let s = Scratch::new("fsz");
    let policy = s.write(
        "p.toml",
        "extends = \"default\"\n[limits]\nfile_size = \"1MiB\"\n",
    );
    let target = s.path("out");
    let code = format!(
        "import sys\nwith open({:?}, 'wb') as f:\n    f.write(b'x' * (2 << 20))\n",
        target.display()
    );
    let o = wfjail(&[
        "run",
        "-p",
        policy.to_str().unwrap(),
        "--rw",
        s.0.to_str().unwrap(),
        "--raw",
        "--",
        PY,
        "-c",
        &code,
    ]);
    o.check(
        o.code == 5 && o.status() == "limit" && o.report["limit"] == "file_size",
        "a file at exactly the limit is the evidence",
    );
    assert_eq!(
        std::fs::metadata(Path::new(&target)).unwrap().len(),
        1 << 20
    );
}
