//! A zygote session's pinned pid answered in the guest: its C library's `getpid` and `gettid`
//! rewritten to return the pinned value without a system call.
//!
//! Under `[time] clock = "virtual"` a prefork session reads a pinned pid (`SESSION_PID`,
//! serve/zygote.rs): its `getpid` and `gettid` reach the router, which answers them once the
//! guest said HELLO. CPython 3.11's `asyncio.get_running_loop` calls `getpid()` on every call
//! and logging's records read `os.getpid()`: a workflow makes tens of them, each a seccomp
//! notification round trip. When the router answers the first of them, the caller waits on
//! that notification; if it is its process's only thread and the process has no child (no
//! other task can run that memory), the router writes over the entry of the C library's
//! `getpid` and `gettid` in that process (`/proc/PID/mem`, which copies the page for that
//! process only, like a debugger's breakpoint): `mov eax, PINNED; ret`. Its later calls then
//! return the value the router would have answered, in the guest.
//!
//! What is rewritten is checked first: each entry must be exactly the system-call stub
//! `mov eax, NR; syscall; ret` (optionally after `endbr64`), so the rewrite keeps what the
//! function means. The caller, waiting in that `syscall`, returns through the `ret` the
//! rewrite leaves in place. The filter stays as it is: a raw `syscall(SYS_getpid)`, or a
//! guest that restored the bytes, still reaches the router and gets the same value. Anything
//! that does not fit (no C library found, other code at the entry, a write refused) leaves
//! the process as it was: the router answers its calls, as before.
//!
//! The entries are found once per zygote, in the zygote's memory (every session is its fork,
//! with the same layout): its C library's mapping in `/proc/PID/maps`, then the ELF dynamic
//! segment, GNU hash table and symbol table in memory. Every read is bounded: the zygote ran
//! preloaded workflow code, and nothing read is trusted beyond the check of the entry's bytes
//! in the session's own process, made while its only thread waits.

use std::io;

use crate::guest_memory::{GuestMemory, ProcessMemory};

/// Where `getpid` and `gettid` start in a zygote's C library (the same in its sessions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entries {
    pub getpid: u64,
    pub gettid: u64,
}

/// Why a session's process was left as it was (the router answers its calls).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// No C library with `getpid` and `gettid` found in the zygote's memory.
    NoLibc,
    /// The process has other threads, or children (another task may run its memory).
    NotAlone,
    /// An entry is not the system-call stub expected.
    Code,
    /// The write was refused (`/proc/PID/mem`).
    Write,
}

impl Skip {
    pub const ALL: [Skip; 4] = [Skip::NoLibc, Skip::NotAlone, Skip::Code, Skip::Write];

    /// Its name in STATUS and the metrics.
    pub fn name(self) -> &'static str {
        match self {
            Skip::NoLibc => "no_libc",
            Skip::NotAlone => "not_alone",
            Skip::Code => "code",
            Skip::Write => "write",
        }
    }
}

const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// The C library's `NAME: mov eax, nr; syscall; ret`.
fn syscall_stub(nr: i64) -> [u8; 8] {
    let n = (nr as u32).to_le_bytes();
    [0xb8, n[0], n[1], n[2], n[3], 0x0f, 0x05, 0xc3]
}

/// `mov eax, value; ret`: six bytes, so the stub's final `ret` stays where a caller waiting
/// in its `syscall` returns to.
fn pinned_stub(value: i32) -> [u8; 6] {
    let v = value.to_le_bytes();
    [0xb8, v[0], v[1], v[2], v[3], 0xc3]
}

/// Where the stub of system call `nr` starts in the 12 bytes at a function's entry: at 0, or
/// after an `endbr64`; `None` if the entry is other code.
fn stub_offset(entry: &[u8], nr: i64) -> Option<u64> {
    let stub = syscall_stub(nr);
    if entry.get(..8) == Some(stub.as_slice()) {
        Some(0)
    } else if entry.get(..4) == Some(ENDBR64.as_slice()) && entry.get(4..12) == Some(&stub[..]) {
        Some(4)
    } else {
        None
    }
}

/// Finds `getpid` and `gettid` in the C library of process `pid` (a zygote).
pub fn locate(pid: libc::pid_t) -> Option<Entries> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let mem = ProcessMemory::new(pid as u32);
    libc_bases(&maps).into_iter().find_map(|base| {
        Some(Entries {
            getpid: dynamic_symbol(&mem, base, "getpid")?,
            gettid: dynamic_symbol(&mem, base, "gettid")?,
        })
    })
}

/// The start of each mapping of a C library's file at offset 0 in `maps` (glibc's
/// `libc.so.6`, musl's `libc.musl-*` or `ld-musl-*`).
fn libc_bases(maps: &str) -> Vec<u64> {
    let mut out = Vec::new();
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(_perms), Some(offset)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let Some(path) = f.nth(2) else { continue };
        let file = path.rsplit('/').next().unwrap_or("");
        let libc = file.starts_with("libc.so")
            || file.starts_with("libc-")
            || file.starts_with("libc.musl")
            || file.starts_with("ld-musl");
        if !libc || u64::from_str_radix(offset, 16) != Ok(0) {
            continue;
        }
        if let Some(Ok(start)) = range.split('-').next().map(|a| u64::from_str_radix(a, 16))
            && !out.contains(&start)
        {
            out.push(start);
        }
    }
    out
}

/// The address of function `name` among the dynamic symbols of the ELF image loaded at
/// `base` in `mem` (its dynamic segment and GNU hash table, as the dynamic loader finds it).
/// `None` when absent or unreadable; every read is bounded.
pub fn dynamic_symbol(mem: &impl GuestMemory, base: u64, name: &str) -> Option<u64> {
    let bytes = |addr: u64, len: usize| -> Option<Vec<u8>> {
        let b = mem.read_bytes(addr, len)?;
        (b.len() == len).then_some(b)
    };
    let u16_at = |addr: u64| -> Option<u64> {
        Some(u16::from_le_bytes(bytes(addr, 2)?.try_into().ok()?) as u64)
    };
    let u32_at = |addr: u64| -> Option<u64> {
        Some(u32::from_le_bytes(bytes(addr, 4)?.try_into().ok()?) as u64)
    };
    let u64_at =
        |addr: u64| -> Option<u64> { Some(u64::from_le_bytes(bytes(addr, 8)?.try_into().ok()?)) };
    if bytes(base, 6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    // A shared object: its first PT_LOAD is at address 0, so `base` is the load bias.
    let phoff = u64_at(base + 0x20)?;
    let phentsize = u16_at(base + 0x36)?;
    let phnum = u16_at(base + 0x38)?.min(64);
    let mut first_load = None;
    let mut dynamic = None;
    for i in 0..phnum {
        let ph = base.checked_add(phoff)?.checked_add(i * phentsize)?;
        match u32_at(ph)? {
            1 if first_load.is_none() => first_load = Some(u64_at(ph + 0x10)?),
            2 => dynamic = Some((u64_at(ph + 0x10)?, u64_at(ph + 0x28)?)),
            _ => {}
        }
    }
    if first_load? != 0 {
        return None;
    }
    let (dyn_addr, dyn_size) = dynamic?;
    // The dynamic loader may have relocated the table's addresses in place (glibc does): an
    // address at or above the bias is absolute, a smaller one an offset in the image.
    let at = |v: u64| {
        if v >= base {
            Some(v)
        } else {
            base.checked_add(v)
        }
    };
    let (mut symtab, mut strtab, mut strsz, mut gnu_hash) = (None, None, None, None);
    for i in 0..(dyn_size / 16).min(128) {
        let d = base.checked_add(dyn_addr)?.checked_add(i * 16)?;
        let (tag, val) = (u64_at(d)?, u64_at(d + 8)?);
        match tag {
            0 => break,
            5 => strtab = at(val),
            6 => symtab = at(val),
            10 => strsz = Some(val),
            0x6fff_fef5 => gnu_hash = at(val),
            _ => {}
        }
    }
    let (symtab, strtab, strsz, table) = (symtab?, strtab?, strsz?, gnu_hash?);
    let nbuckets = u32_at(table)?;
    let symoffset = u32_at(table + 4)?;
    let bloom_size = u32_at(table + 8)?;
    if nbuckets == 0 {
        return None;
    }
    let buckets = table
        .checked_add(16)?
        .checked_add(bloom_size.checked_mul(8)?)?;
    let chains = buckets.checked_add(nbuckets * 4)?;
    let hash = name
        .bytes()
        .fold(5381u32, |h, c| h.wrapping_mul(33).wrapping_add(c as u32)) as u64;
    let first = u32_at(buckets + (hash % nbuckets) * 4)?;
    if first < symoffset {
        return None;
    }
    for index in first..first + 4096 {
        let chained = u32_at(chains.checked_add((index - symoffset) * 4)?)?;
        if chained | 1 == hash | 1 {
            let sym = symtab.checked_add(index * 24)?;
            let name_at = u32_at(sym)?;
            let info = bytes(sym + 4, 1)?[0];
            let shndx = u16_at(sym + 6)?;
            let value = u64_at(sym + 8)?;
            if name_at < strsz
                && let Some(found) = bytes(strtab.checked_add(name_at)?, name.len() + 1)
                && found[..name.len()] == *name.as_bytes()
                && found[name.len()] == 0
                // A function (not an indirect one, whose value is its resolver), defined.
                && info & 0xf == 2
                && shndx != 0
            {
                return base.checked_add(value);
            }
        }
        if chained & 1 == 1 {
            return None;
        }
    }
    None
}

/// Rewrites `getpid` and `gettid` at `entries` in the process whose memory `mem` is
/// ([`crate::sys::open_process_memory`]) to return `pinned`. The caller has checked that no other
/// task runs that memory (its only thread waits on a notification the router holds). Each
/// entry is read and checked first; nothing is written unless both are the stubs expected.
pub fn patch(mem: &std::fs::File, entries: Entries, pinned: i32) -> Result<(), Skip> {
    use std::os::unix::fs::FileExt;
    let mut at = [0u64; 2];
    for (slot, (addr, nr)) in at.iter_mut().zip([
        (entries.getpid, libc::SYS_getpid),
        (entries.gettid, libc::SYS_gettid),
    ]) {
        let mut entry = [0u8; 12];
        let n = mem.read_at(&mut entry, addr).map_err(|_| Skip::Code)?;
        let offset = stub_offset(&entry[..n], nr).ok_or(Skip::Code)?;
        *slot = addr + offset;
    }
    let code = pinned_stub(pinned);
    for addr in at {
        match mem.write_at(&code, addr) {
            Ok(n) if n == code.len() => {}
            _ => return Err(Skip::Write),
        }
    }
    Ok(())
}

/// Whether process `pid`'s memory is run by no other task than its thread `pid`: one thread,
/// `parent`'s child (a zygote's: its own memory is another, copied at the fork; a process a
/// session made with `CLONE_VM` would share its parent's), and no child (which could share
/// its own).
pub fn alone(pid: libc::pid_t, parent: libc::pid_t) -> io::Result<bool> {
    let status = crate::procfs::Status::of(pid as u32)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))?;
    if status.number("Threads") != Some(1)
        || status.number("Tgid") != Some(pid as u64)
        || status.number("PPid") != Some(parent as u64)
    {
        return Ok(false);
    }
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))?;
    Ok(children.trim().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys;

    /// A dynamically linked process to look into (wfjail itself links its C library
    /// statically), killed when dropped.
    struct Peer(std::process::Child);

    impl Peer {
        fn start() -> Peer {
            let child = std::process::Command::new("/bin/sleep")
                .arg("30")
                .spawn()
                .expect("/bin/sleep");
            // Until its exec is done its maps are ours.
            for _ in 0..1000 {
                let maps = std::fs::read_to_string(format!("/proc/{}/maps", child.id()));
                if maps.is_ok_and(|m| !libc_bases(&m).is_empty()) {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Peer(child)
        }

        fn pid(&self) -> libc::pid_t {
            self.0.id() as libc::pid_t
        }
    }

    impl Drop for Peer {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn finds_getpid_and_gettid_in_a_processs_c_library() {
        let peer = Peer::start();
        let e = locate(peer.pid()).expect("the C library of /bin/sleep");
        // The stubs a patch expects, at each (Debian's glibc: no endbr64).
        for (addr, nr) in [(e.getpid, libc::SYS_getpid), (e.gettid, libc::SYS_gettid)] {
            let mut entry = [0u8; 12];
            sys::read_process_memory(peer.pid(), addr, &mut entry).unwrap();
            assert!(stub_offset(&entry, nr).is_some(), "{nr}: {entry:x?}");
        }
        assert_ne!(e.getpid, e.gettid);
    }

    #[test]
    fn patching_a_process_makes_its_getpid_return_the_pinned_value() {
        let peer = Peer::start();
        let e = locate(peer.pid()).unwrap();
        let mem = sys::open_process_memory(peer.pid()).unwrap();
        patch(&mem, e, 4_194_303).unwrap();
        for addr in [e.getpid, e.gettid] {
            let mut entry = [0u8; 8];
            sys::read_process_memory(peer.pid(), addr, &mut entry).unwrap();
            assert_eq!(entry, [0xb8, 0xff, 0xff, 0x3f, 0x00, 0xc3, 0x05, 0xc3]);
        }
        // A second patch finds other code at the entries and writes nothing.
        assert_eq!(patch(&mem, e, 7), Err(Skip::Code));
        let mut entry = [0u8; 8];
        sys::read_process_memory(peer.pid(), e.getpid, &mut entry).unwrap();
        assert_eq!(entry[1..5], 4_194_303i32.to_le_bytes());
        // Only that process's copy of the page changed: another process of the same file
        // still has the stub.
        let other = Peer::start();
        let mut entry = [0u8; 12];
        sys::read_process_memory(other.pid(), locate(other.pid()).unwrap().getpid, &mut entry)
            .unwrap();
        assert!(stub_offset(&entry, libc::SYS_getpid).is_some());
    }

    #[test]
    fn a_process_is_alone_as_its_parents_child_with_one_thread_and_no_child() {
        let peer = Peer::start();
        assert!(alone(peer.pid(), sys::getpid()).unwrap());
        assert!(!alone(peer.pid(), 1).unwrap(), "another parent");
        // This test process: several threads (the test harness's).
        let me = sys::getpid();
        let parent = crate::procfs::Status::of(me as u32)
            .and_then(|s| s.number("PPid"))
            .unwrap() as libc::pid_t;
        if crate::procfs::Status::of(me as u32).and_then(|s| s.number("Threads")) != Some(1) {
            assert!(!alone(me, parent).unwrap(), "threads");
        }
    }

    #[test]
    fn an_absent_symbol_or_an_image_that_is_not_elf_is_none() {
        let peer = Peer::start();
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", peer.pid())).unwrap();
        let base = libc_bases(&maps)[0];
        let mem = ProcessMemory::new(peer.pid() as u32);
        assert_eq!(dynamic_symbol(&mem, base, "no_such_function_here"), None);
        assert!(dynamic_symbol(&mem, base, "getpid").is_some());
        let junk = crate::guest_memory::MemoryImage::new(0x1000, vec![0x7f; 4096]);
        assert_eq!(dynamic_symbol(&junk, 0x1000, "getpid"), None);
        let mut truncated = vec![0u8; 200];
        mem.read_at(base, &mut truncated).unwrap();
        let truncated = crate::guest_memory::MemoryImage::new(0x1000, truncated);
        assert_eq!(dynamic_symbol(&truncated, 0x1000, "getpid"), None);
    }

    #[test]
    fn only_the_syscall_stub_is_recognised() {
        let stub = syscall_stub(libc::SYS_getpid);
        assert_eq!(stub_offset(&stub, libc::SYS_getpid), Some(0));
        assert_eq!(stub_offset(&stub, libc::SYS_gettid), None);
        let mut cet = ENDBR64.to_vec();
        cet.extend_from_slice(&stub);
        assert_eq!(stub_offset(&cet, libc::SYS_getpid), Some(4));
        assert_eq!(stub_offset(&stub[..7], libc::SYS_getpid), None);
        let mut other = stub;
        other[7] = 0x90;
        assert_eq!(stub_offset(&other, libc::SYS_getpid), None);
        // The rewrite leaves the stub's `ret` (offset 7) in place.
        assert_eq!(pinned_stub(4_194_303), [0xb8, 0xff, 0xff, 0x3f, 0x00, 0xc3]);
    }

    #[test]
    fn the_c_library_is_found_by_its_file_name_at_offset_0() {
        let maps = "\
7f0000000000-7f0000028000 r--p 00000000 08:01 123 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000028000-7f000019d000 r-xp 00028000 08:01 123 /usr/lib/x86_64-linux-gnu/libc.so.6
7f1000000000-7f1000001000 r--p 00000000 08:01 124 /usr/lib/libcrypt.so.1
7f2000000000-7f2000001000 r--p 00000000 08:01 125 /lib/ld-musl-x86_64.so.1
7f3000000000-7f3000001000 rw-p 00000000 00:00 0
";
        assert_eq!(libc_bases(maps), vec![0x7f00_0000_0000, 0x7f20_0000_0000]);
    }
}
