//! File times under `[time] clock = "virtual"`: a guest's stat of a descriptor (`fstat`, or
//! `newfstatat`/`statx` with `AT_EMPTY_PATH` and an empty path) reaches the supervisor,
//! which stats the same file (through `/proc/PID/fd/N`, opened `O_PATH`: no pipe end is
//! opened, nothing changes) and, for a file whose times are set by the kernel as things
//! happen — a pipe, a socket, a character device, an anonymous inode, anything on `/proc` —
//! answers with the workflow time in place of its access, change, modification (and birth)
//! times. A regular file or a directory keeps its own times (they are the install's, and
//! Python's bytecode cache compares them), and its call runs in the kernel.
//!
//! The inode number of a pipe, a socket or an anonymous inode is a host-wide counter (how
//! many the host made before): it reads a number of the execution's own ([`Inodes`]), the
//! same for the same file, so code that tells descriptors apart by it still can.
//!
//! `statfs`/`fstatfs` reach the supervisor too, which makes the call and answers every block
//! and inode free (what others use of the disk moves between a run and its replay), as
//! `sysinfo` answers all memory free.
//!
//! Stats by path are not seen (every import makes dozens); docs/security.md says what that
//! leaves open.

use std::os::fd::{AsFd, OwnedFd};

use crate::sys::Notif;

use super::answer::Answer;
use crate::guest_memory::GuestMemory;

const PROC_SUPER_MAGIC: i64 = 0x9fa0;
const PIPEFS_MAGIC: i64 = 0x5049_5045;
const SOCKFS_MAGIC: i64 = 0x534f_434b;
const ANON_INODE_FS_MAGIC: i64 = 0x0904_1934;

/// Where the inode numbers of an execution's pipes, sockets and anonymous inodes start.
pub const INODE_ORIGIN: u64 = 1_000;
/// The most files an [`Inodes`] remembers (its memory is the supervisor's); past it, each
/// first look at a file gets a new number that is not kept.
pub const MAX_INODES: usize = 16_384;

/// The inode numbers of one execution's pipes, sockets and anonymous inodes: numbered
/// from [`INODE_ORIGIN`] in the order its stats first see them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Inodes {
    seen: std::collections::HashMap<(u64, u64), u64>,
    next: u64,
}

impl Inodes {
    /// The number that the host's inode `ino` on device `dev` reads in this execution.
    pub fn number(&mut self, dev: u64, ino: u64) -> u64 {
        if let Some(&n) = self.seen.get(&(dev, ino)) {
            return n;
        }
        let n = INODE_ORIGIN + self.next;
        self.next += 1;
        if self.seen.len() < MAX_INODES {
            self.seen.insert((dev, ino), n);
        }
        n
    }
}

/// The answer to stat call `name` of notification `n` at workflow time `now` (nanoseconds
/// since the epoch): a value with the times replaced, or `Continue` (the kernel's own answer)
/// when the file's times are not the clock's or the call is not about a descriptor.
/// `statfs` and `fstatfs` are answered by [`statfs_answer`].
pub fn answer(
    n: &Notif,
    mem: &dyn GuestMemory,
    name: &str,
    now: i64,
    inodes: &mut Inodes,
) -> Answer {
    if name == "statfs" || name == "fstatfs" {
        return statfs_answer(n, mem, name);
    }
    let a = &n.args;
    let empty = |addr: u64| addr == 0 || mem.read_bytes(addr, 1).as_deref() == Some(&[0u8][..]);
    let (fd, buf, statx) = match name {
        "fstat" => (a[0] as i32, a[1], None),
        "newfstatat" if empty(a[1]) => (a[0] as i32, a[2], None),
        "statx" if empty(a[1]) => (a[0] as i32, a[4], Some((a[2] as u32, a[3] as u32))),
        _ => return Answer::Continue,
    };
    let target = match fd {
        libc::AT_FDCWD => format!("/proc/{}/cwd", n.pid),
        fd if fd >= 0 => format!("/proc/{}/fd/{fd}", n.pid),
        _ => return Answer::Continue, // EBADF: the kernel says so
    };
    let Some(file) = open_path(&target) else {
        return Answer::Continue; // not open, or the guest is gone: the kernel answers
    };
    let raw = match statx {
        None => crate::sys::fstat_raw(file.as_fd()).map(|b| b.to_vec()),
        Some((flags, mask)) => crate::sys::statx_raw(file.as_fd(), flags, mask).map(|b| b.to_vec()),
    };
    let Ok(mut raw) = raw else {
        return Answer::Continue;
    };
    let mode = if statx.is_some() {
        u16::from_ne_bytes([raw[28], raw[29]]) as u32
    } else {
        u32::from_ne_bytes(raw[24..28].try_into().expect("4 bytes"))
    };
    let kind = mode & libc::S_IFMT;
    // f_type, the first word of the kernel's struct statfs (not libc's type for it, which
    // differs between C libraries).
    let fs = crate::sys::fstatfs_raw(file.as_fd())
        .map(|st| i64::from_ne_bytes(st[0..8].try_into().expect("8 bytes")))
        .ok();
    let on_proc = fs == Some(PROC_SUPER_MAGIC);
    if (kind == libc::S_IFREG || kind == libc::S_IFDIR) && !on_proc {
        return Answer::Continue;
    }
    set_times(&mut raw, statx.is_some(), now);
    if matches!(fs, Some(PIPEFS_MAGIC | SOCKFS_MAGIC | ANON_INODE_FS_MAGIC)) {
        set_inode(&mut raw, statx.is_some(), inodes);
    }
    Answer::Value {
        ret: 0,
        writes: vec![(buf, raw)],
    }
}

/// Replaces the inode number of a raw `struct stat` or (`statx`) `struct statx` with the
/// execution's own for it.
fn set_inode(raw: &mut [u8], statx: bool, inodes: &mut Inodes) {
    let u64_at = |raw: &[u8], at: usize| u64::from_ne_bytes(raw[at..at + 8].try_into().expect("8"));
    let u32_at = |raw: &[u8], at: usize| u32::from_ne_bytes(raw[at..at + 4].try_into().expect("4"));
    let (ino_at, dev) = if statx {
        // stx_ino at 0x20; stx_dev_major, stx_dev_minor at 0x88, 0x8c.
        let dev = libc::makedev(u32_at(raw, 0x88), u32_at(raw, 0x8c));
        (0x20, dev)
    } else {
        // st_dev at 0, st_ino at 8.
        (8, u64_at(raw, 0))
    };
    let n = inodes.number(dev, u64_at(raw, ino_at));
    raw[ino_at..ino_at + 8].copy_from_slice(&n.to_ne_bytes());
}

/// The answer to `statfs` (by path) or `fstatfs` of notification `n`: the supervisor makes
/// the call on the guest's file and answers with every block and inode free. A descriptor
/// is reached through `/proc/PID/fd/N`; a path from the guest's root (`/proc/PID/root`, its
/// cwd's path joined to a relative one) with `RESOLVE_IN_ROOT`, so that absolute symbolic
/// links and `/proc` are the guest's, and without magic links. What the supervisor cannot
/// reach so (a missing file, `/proc/self`, which names no process of the supervisor's, a
/// magic link, a guest gone) is left to the kernel: its errors are the guest's own, and
/// the file systems behind those paths (`proc`, `pipefs`) report no free space that moves.
pub fn statfs_answer(n: &Notif, mem: &dyn GuestMemory, name: &str) -> Answer {
    let file = if name == "fstatfs" {
        let fd = n.args[0] as i32;
        if fd < 0 {
            return Answer::Continue; // EBADF: the kernel says so
        }
        open_path(&format!("/proc/{}/fd/{fd}", n.pid))
    } else {
        let Ok(path) = mem.read_path(n.args[0]) else {
            return Answer::Continue; // EFAULT, ENAMETOOLONG: the kernel says so
        };
        in_guest_root(n.pid, &path)
    };
    let Some(file) = file else {
        return Answer::Continue;
    };
    let Ok(mut st) = crate::sys::fstatfs_raw(file.as_fd()) else {
        return Answer::Continue;
    };
    set_all_free(&mut st);
    Answer::Value {
        ret: 0,
        writes: vec![(n.args[1], st.to_vec())],
    }
}

/// `path` as guest `pid` names it, opened `O_PATH` from its root (`None`: not reachable
/// that way).
fn in_guest_root(pid: u32, path: &[u8]) -> Option<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    if path.is_empty() {
        return None;
    }
    let mut full = if path.starts_with(b"/") {
        Vec::new()
    } else {
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok()?;
        let mut c = cwd.as_os_str().as_bytes().to_vec();
        if !c.starts_with(b"/") {
            return None; // not reachable from its root
        }
        c.push(b'/');
        c
    };
    full.extend_from_slice(path);
    let full = std::ffi::CString::new(full).ok()?;
    let root = open_path(&format!("/proc/{pid}/root"))?;
    crate::sys::openat2(
        root.as_fd(),
        &full,
        (libc::O_PATH | libc::O_CLOEXEC) as u64,
        0,
        libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
    )
    .ok()
}

/// Makes a raw `struct statfs` say every block and inode is free.
pub fn set_all_free(st: &mut [u8]) {
    // f_blocks 16, f_bfree 24, f_bavail 32, f_files 40, f_ffree 48.
    let blocks: [u8; 8] = st[16..24].try_into().expect("8 bytes");
    let files: [u8; 8] = st[40..48].try_into().expect("8 bytes");
    st[24..32].copy_from_slice(&blocks);
    st[32..40].copy_from_slice(&blocks);
    st[48..56].copy_from_slice(&files);
}

/// Writes `now` over every time of a raw `struct stat` or (`statx`) `struct statx`.
pub fn set_times(raw: &mut [u8], statx: bool, now: i64) {
    let secs = now.div_euclid(1_000_000_000);
    let nanos = now.rem_euclid(1_000_000_000);
    if statx {
        // stx_atime, stx_btime, stx_ctime, stx_mtime: { i64 sec; u32 nsec; i32 reserved }
        for at in [0x40, 0x50, 0x60, 0x70] {
            raw[at..at + 8].copy_from_slice(&secs.to_ne_bytes());
            raw[at + 8..at + 12].copy_from_slice(&(nanos as u32).to_ne_bytes());
        }
    } else {
        // st_atim, st_mtim, st_ctim: { i64 sec; i64 nsec }
        for at in [72, 88, 104] {
            raw[at..at + 8].copy_from_slice(&secs.to_ne_bytes());
            raw[at + 8..at + 16].copy_from_slice(&nanos.to_ne_bytes());
        }
    }
}

/// `path` opened `O_PATH` (`crate::sys::open_path`: std's `custom_flags` loses `O_PATH` on
/// musl); `None` when it cannot be.
fn open_path(path: &str) -> Option<OwnedFd> {
    crate::sys::open_path(&std::ffi::CString::new(path).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipes_inode_reads_the_executions_number_in_both_layouts() {
        let mut inodes = Inodes::default();
        let mut st = vec![0u8; 144];
        st[0..8].copy_from_slice(&12u64.to_ne_bytes());
        st[8..16].copy_from_slice(&987_654u64.to_ne_bytes());
        set_inode(&mut st, false, &mut inodes);
        assert_eq!(
            u64::from_ne_bytes(st[8..16].try_into().unwrap()),
            INODE_ORIGIN
        );
        let mut stx = vec![0u8; 256];
        stx[0x20..0x28].copy_from_slice(&987_654u64.to_ne_bytes());
        stx[0x8c..0x90].copy_from_slice(&12u32.to_ne_bytes()); // minor 12, major 0
        set_inode(&mut stx, true, &mut inodes);
        assert_eq!(
            u64::from_ne_bytes(stx[0x20..0x28].try_into().unwrap()),
            INODE_ORIGIN,
            "the same file by statx: the same number"
        );
        assert_eq!(inodes.number(12, 5), INODE_ORIGIN + 1);
        assert_eq!(
            inodes.number(13, 987_654),
            INODE_ORIGIN + 2,
            "another device"
        );
    }

    #[test]
    fn past_its_bound_an_inode_map_keeps_numbering_without_growing() {
        let mut inodes = Inodes::default();
        for i in 0..MAX_INODES as u64 + 10 {
            inodes.number(1, i);
        }
        assert_eq!(inodes.seen.len(), MAX_INODES);
        assert_eq!(inodes.number(1, 0), INODE_ORIGIN, "a kept one");
        assert_eq!(
            inodes.number(1, MAX_INODES as u64 + 20),
            INODE_ORIGIN + MAX_INODES as u64 + 10
        );
    }

    #[test]
    fn a_file_systems_blocks_and_inodes_read_all_free() {
        let mut st = [0u8; 120];
        for (i, at) in [16, 24, 32, 40, 48, 56].iter().enumerate() {
            st[*at..at + 8].copy_from_slice(&(100 * (i as u64 + 1)).to_ne_bytes());
        }
        set_all_free(&mut st);
        let at = |o: usize| u64::from_ne_bytes(st[o..o + 8].try_into().unwrap());
        assert_eq!(
            [at(16), at(24), at(32)],
            [100; 3],
            "blocks, free, available"
        );
        assert_eq!([at(40), at(48)], [400; 2], "inodes, free");
        assert_eq!(at(56), 600, "the fsid untouched");
    }

    #[test]
    fn every_time_of_both_layouts_is_replaced() {
        let now = 1_796_117_400_250_000_000;
        let mut st = vec![0xffu8; 144];
        set_times(&mut st, false, now);
        for at in [72, 88, 104] {
            assert_eq!(
                i64::from_ne_bytes(st[at..at + 8].try_into().unwrap()),
                1_796_117_400
            );
            assert_eq!(
                i64::from_ne_bytes(st[at + 8..at + 16].try_into().unwrap()),
                250_000_000
            );
        }
        assert_eq!(st[64..72], [0xff; 8], "st_blocks untouched");
        assert_eq!(st[120..], [0xff; 24], "the reserved words untouched");
        let mut stx = vec![0xffu8; 256];
        set_times(&mut stx, true, now);
        for at in [0x40, 0x50, 0x60, 0x70] {
            assert_eq!(
                i64::from_ne_bytes(stx[at..at + 8].try_into().unwrap()),
                1_796_117_400
            );
            assert_eq!(
                u32::from_ne_bytes(stx[at + 8..at + 12].try_into().unwrap()),
                250_000_000
            );
            assert_eq!(
                stx[at + 12..at + 16],
                [0xff; 4],
                "the reserved word untouched"
            );
        }
    }
}
