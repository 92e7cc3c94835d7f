//! `/proc/PID/status` and `/proc/PID/stat`, parsed in one place: the supervisor's memory
//! evidence (`VmSize`, `VmPeak`), the pid translations of the namespace-aware checks
//! (`NSpid`, `NStgid`), the zygote router's walk up to a session (`PPid`), the opener's
//! `Umask`, the seccomp mode wfjail itself runs under (`Seccomp`: a container's filter), and
//! a session's look at its guest (its state letter, its CPU time). Each reader
//! takes one read of the file; the text is parsed by [`Status`] and [`Stat`], which the tests
//! feed directly.

/// The text of one task's `/proc/PID/status`.
#[derive(Debug, Clone)]
pub struct Status(String);

impl Status {
    /// Reads `/proc/{pid}/status` (`None`: the task is gone, or `/proc` is not readable).
    pub fn of(pid: u32) -> Option<Status> {
        // One read into a page-sized buffer: `fs::read_to_string` sizes its buffer from the
        // file's size, which `/proc` says is 0, and reads in small steps (~9 calls a file).
        ProcFile::open(pid as libc::pid_t, "status")?.status()
    }

    /// Reads this process's own `/proc/self/status`.
    pub fn own() -> Option<Status> {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .map(Status)
    }

    /// Status text as read (for tests and for a caller that has it).
    pub fn parse(text: impl Into<String>) -> Status {
        Status(text.into())
    }

    /// The value of field `key` (without its colon), trimmed.
    pub fn field(&self, key: &str) -> Option<&str> {
        self.0.lines().find_map(|l| {
            l.strip_prefix(key)
                .and_then(|rest| rest.strip_prefix(':'))
                .map(str::trim)
        })
    }

    /// A plain number field (`Tgid`, `PPid`).
    pub fn number(&self, key: &str) -> Option<u64> {
        self.field(key)?.parse().ok()
    }

    /// A `kB` field (`VmSize`, `VmPeak`), in bytes.
    pub fn bytes(&self, key: &str) -> Option<u64> {
        let kb: u64 = self
            .field(key)?
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kb * 1024)
    }

    /// The seccomp mode of the task (`Seccomp`): 0 none, 1 strict, 2 filter.
    pub fn seccomp(&self) -> Option<u32> {
        self.field("Seccomp")?.parse().ok()
    }

    /// The last number of a per-namespace field (`NSpid`, `NStgid`): the task's id in its own
    /// (innermost) PID namespace.
    pub fn innermost(&self, key: &str) -> Option<i64> {
        self.field(key)?.split_whitespace().last()?.parse().ok()
    }
}

/// The seccomp mode this process runs under: 0 none, 1 strict, 2 filter (a container's
/// profile, under which wfjail's filters stack).
pub fn seccomp_mode() -> Option<u32> {
    Status::own()?.seccomp()
}

/// The pid of global task `pid` in its own (innermost) PID namespace (the last of `NSpid`).
pub fn ns_pid(pid: u32) -> Option<i32> {
    Status::of(pid)?.innermost("NSpid").map(|p| p as i32)
}

/// The process id (thread group) of global task `tid` in its own PID namespace (`NStgid`).
pub fn ns_tgid(tid: u32) -> Option<i32> {
    Status::of(tid)?.innermost("NStgid").map(|p| p as i32)
}

/// A process's current address space in bytes (`VmSize`).
pub fn vm_size(pid: u32) -> Option<u64> {
    Status::of(pid)?.bytes("VmSize")
}

/// A process's peak address space in bytes (`VmPeak`).
pub fn vm_peak(pid: u32) -> Option<u64> {
    Status::of(pid)?.bytes("VmPeak")
}

/// Clock ticks per second in `/proc/PID/stat` (USER_HZ, fixed at 100 in the x86_64 ABI).
const CLOCK_TICKS: f64 = 100.0;

/// What `/proc/PID/stat` says of a process: its state letter (`R`, `S`, `T`...) and its user
/// + system CPU time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stat {
    pub state: u8,
    /// In milliseconds; `None` when the fields after the state do not parse.
    pub cpu_ms: Option<f64>,
}

impl Stat {
    /// Reads `/proc/{pid}/stat` (`None`: the process is gone).
    pub fn of(pid: libc::pid_t) -> Option<Stat> {
        ProcFile::open(pid, "stat")?.stat()
    }

    /// Parses stat text. The command (field 2) is in parentheses and may hold anything, so
    /// the fields are counted from the last `)`.
    pub fn parse(stat: &[u8]) -> Option<Stat> {
        let close = stat.iter().rposition(|&b| b == b')')?;
        let state = *stat.get(close + 2)?;
        let fields: Vec<&[u8]> = stat.get(close + 2..)?.split(|&b| b == b' ').collect();
        // After the command: state is field 3, utime 14 and stime 15 (1-based).
        let tick =
            |i: usize| -> Option<f64> { std::str::from_utf8(fields.get(i)?).ok()?.parse().ok() };
        let cpu_ms = tick(11)
            .zip(tick(12))
            .map(|(u, s)| (u + s) * 1000.0 / CLOCK_TICKS);
        Some(Stat { state, cpu_ms })
    }
}

/// One process's `/proc/PID/stat` or `/proc/PID/status`, opened once and read again at
/// offset 0 (the kernel regenerates the text on a read from offset 0): one `pread` a look
/// instead of open, stat, two reads and close. The open file stays bound to the process it
/// was opened for, so a later read never sees another process that reused the pid: once that
/// process is reaped, reads fail (`None`).
#[derive(Debug)]
pub struct ProcFile(std::fs::File);

impl ProcFile {
    /// Opens `/proc/{pid}/{name}` (`stat` or `status`). The caller checks the process did not
    /// exit before the open returned (its pidfd): until it is reaped its pid is its own.
    pub fn open(pid: libc::pid_t, name: &str) -> Option<ProcFile> {
        std::fs::File::open(format!("/proc/{pid}/{name}"))
            .ok()
            .map(ProcFile)
    }

    /// The file's text now (`None`: the process is gone).
    pub fn read(&self) -> Option<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0u8; 4096];
        let mut len = 0;
        loop {
            let n = self.0.read_at(&mut buf[len..], len as u64).ok()?;
            len += n;
            // The whole text is made at a read from offset 0 and handed out as far as the
            // buffer takes it: a read that did not fill the buffer had all of it.
            if len < buf.len() {
                break;
            }
            buf.resize(buf.len() * 2, 0);
        }
        buf.truncate(len);
        Some(buf)
    }

    /// The text as [`Stat`] (for a `stat` file).
    pub fn stat(&self) -> Option<Stat> {
        Stat::parse(&self.read()?)
    }

    /// The text as [`Status`] (for a `status` file).
    pub fn status(&self) -> Option<Status> {
        String::from_utf8(self.read()?).ok().map(Status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NESTED: &str = "Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t4242\n\
        Ngid:\t0\nPid:\t4243\nPPid:\t4200\nNStgid:\t4242\t7\nNSpid:\t4243\t8\n\
        VmPeak:\t  123456 kB\nVmSize:\t  120000 kB\n";

    #[test]
    fn a_field_is_found_by_its_whole_key_not_a_prefix_of_another() {
        let s = Status::parse(NESTED);
        assert_eq!(s.number("Pid"), Some(4243), "not PPid's");
        assert_eq!(s.number("PPid"), Some(4200));
        assert_eq!(s.number("Tgid"), Some(4242), "not NStgid's");
        assert_eq!(s.field("Umask"), Some("0022"));
        assert_eq!(s.field("Missing"), None);
    }

    #[test]
    fn the_seccomp_mode_is_its_own_line_not_seccomp_filters() {
        let s = Status::parse("Seccomp:\t2\nSeccomp_filters:\t3\n");
        assert_eq!(s.seccomp(), Some(2));
        assert_eq!(Status::parse("Seccomp_filters:\t3\n").seccomp(), None);
    }

    #[test]
    fn kb_fields_are_read_in_bytes() {
        let s = Status::parse(NESTED);
        assert_eq!(s.bytes("VmPeak"), Some(123_456 * 1024));
        assert_eq!(s.bytes("VmSize"), Some(120_000 * 1024));
    }

    #[test]
    fn namespace_ids_are_the_innermost_ones() {
        let s = Status::parse(NESTED);
        assert_eq!(s.innermost("NSpid"), Some(8));
        assert_eq!(s.innermost("NStgid"), Some(7));
        let flat = Status::parse("NSpid:\t99\n");
        assert_eq!(flat.innermost("NSpid"), Some(99));
    }

    #[test]
    fn this_process_reads_as_itself() {
        let me = std::process::id();
        let s = Status::of(me).unwrap();
        assert_eq!(s.number("Tgid"), Some(u64::from(me)));
        assert!(ns_tgid(me).is_some() && ns_pid(me).is_some());
        assert!(vm_peak(me).unwrap() >= vm_size(me).unwrap());
    }

    #[test]
    fn a_proc_file_reads_its_process_afresh_and_fails_once_it_is_reaped() {
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .unwrap();
        let pid = child.id() as libc::pid_t;
        let stat = ProcFile::open(pid, "stat").unwrap();
        let status = ProcFile::open(pid, "status").unwrap();
        assert_ne!(stat.stat().unwrap().state, b'T');
        assert!(status.status().unwrap().bytes("VmPeak").is_some());
        // Our own child, not reaped yet: its pid is its own.
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGSTOP,
        )
        .unwrap();
        let mut state = 0;
        for _ in 0..1000 {
            state = stat.stat().unwrap().state;
            if state == b'T' {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(state, b'T', "the same open file shows the stop");
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(stat.stat().is_none(), "a reaped process reads as gone");
        assert!(status.status().is_none());
    }

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let text = b"42 (a) b) (c) T 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0\n";
        let s = Stat::parse(text).unwrap();
        assert_eq!(s.state, b'T');
        assert_eq!(s.cpu_ms, Some(3000.0), "(250 + 50) ticks of 10 ms");
        let short = Stat::parse(b"42 (x) R 1").unwrap();
        assert_eq!((short.state, short.cpu_ms), (b'R', None));
        assert_eq!(Stat::parse(b"42 (x"), None);
        let me = Stat::of(std::process::id() as libc::pid_t).unwrap();
        // The main thread's state: running, or asleep while a test thread reads it.
        assert!(matches!(me.state, b'R' | b'S'), "{}", me.state as char);
        assert!(me.cpu_ms.is_some());
    }
}
