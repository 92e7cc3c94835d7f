//! File times under `[time] clock = "virtual"`: a guest's stat of a descriptor (`fstat`, or
//! `newfstatat`/`statx` with `AT_EMPTY_PATH` and an empty path) reaches the supervisor,
//! which stats the same file (through `/proc/PID/fd/N`, opened `O_PATH`: no pipe end is
//! opened, nothing changes) and, for a file whose times are set by the kernel as things
//! happen — a pipe, a socket, a character device, an anonymous inode, anything on `/proc` —
//! answers with the workflow time in place of its access, change, modification (and birth)
//! times. A regular file or a directory keeps its own times (they are the install's, and
//! Python's bytecode cache compares them), and its call runs in the kernel.
//!
//! Stats by path are not seen (every import makes dozens); docs/security.md says what that
//! leaves open.

use std::os::fd::{AsFd, OwnedFd};

use crate::sys::Notif;

use super::answer::Answer;
use crate::guest_memory::GuestMemory;

const PROC_SUPER_MAGIC: i64 = 0x9fa0;

/// The answer to stat call `name` of notification `n` at workflow time `now` (nanoseconds
/// since the epoch): a value with the times replaced, or `Continue` (the kernel's own answer)
/// when the file's times are not the clock's or the call is not about a descriptor.
pub fn answer(n: &Notif, mem: &dyn GuestMemory, name: &str, now: i64) -> Answer {
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
    let on_proc =
        nix::sys::statfs::fstatfs(&file).is_ok_and(|s| s.filesystem_type().0 == PROC_SUPER_MAGIC);
    if (kind == libc::S_IFREG || kind == libc::S_IFDIR) && !on_proc {
        return Answer::Continue;
    }
    set_times(&mut raw, statx.is_some(), now);
    Answer::Value {
        ret: 0,
        writes: vec![(buf, raw)],
    }
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

fn open_path(path: &str) -> Option<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(path)
        .ok()
        .map(OwnedFd::from)
}

#[cfg(test)]
mod tests {
    use super::*;

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
