//! The exec stop: before a guest's new image runs any code, its vDSO functions that read the
//! wall clock or draw randomness are overwritten with plain system calls.
//!
//! The kernel maps a vDSO into every process: `clock_gettime`, `gettimeofday` and `time`
//! read the clock from a shared page without a syscall, so no seccomp filter sees them (and
//! since Linux 6.11 `getrandom` may draw from a per-thread generator the same way). Under
//! `[time] clock = "virtual"` or `"deny"` (and `[random] getrandom` other than `"allow"`),
//! the supervisor traces the child across its initial exec (`PTRACE_O_TRACEEXEC`), and at the
//! exec stop — the new image mapped, the dynamic loader not yet run — writes over the entry of
//! each such function (`PTRACE_POKEDATA`, which copies the page like a debugger's breakpoint):
//!
//! * `clock_gettime`, `gettimeofday`, `time`: `mov eax, NR; syscall; ret`. The C library
//!   still calls the vDSO, and the vDSO now makes the real syscall, which the filter routes
//!   to the supervisor (`notify/mod.rs` answers it with the execution's virtual time).
//!   A program that calls the vDSO directly (Go, or C looking it up in the auxiliary vector)
//!   gets the same. Monotonic and CPU clocks become real syscalls too: under `virtual` the
//!   supervisor answers the monotonic ones from a virtual monotonic clock (`monotonic.rs`); the
//!   filter lets the others run.
//! * `getrandom`: `mov rax, -ENOSYS; ret`, so the C library falls back to the syscall.
//!
//! Under a seeded or denied `getrandom` the 16 bytes the auxiliary vector's `AT_RANDOM`
//! points at are overwritten too (`entropy::at_random`).
//!
//! Then the tracer lets go (`PTRACE_DETACH`). A zygote's sessions inherit the patched pages
//! through `fork`. What stays: the time data page (`[vvar]`) is still mapped, and a program
//! that decodes it itself reads real time (no known runtime does); see docs/security.md.
//!
//! The image is parsed from the child's own memory (its ELF dynamic symbol table), so whatever
//! this kernel's vDSO looks like, the right addresses are patched; a vDSO that cannot be
//! parsed is an error, never a silent pass.

use std::io;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use crate::sys::{self, Notif, Traced};

use super::answer;

pub use crate::policy::rules::VdsoPatch as Patch;

/// How the exec stop failed (the child is then killed: its clock or randomness would leak).
#[derive(Debug, thiserror::Error)]
pub enum VdsoError {
    #[error(
        "cannot trace the child across its exec ({0}); ptrace may be refused by the container's seccomp profile or by Yama (kernel.yama.ptrace_scope = 3)"
    )]
    Trace(io::Error),
    #[error("the child did not stop at its exec within {0:?}")]
    NoStop(Duration),
    #[error("cannot read the child's vDSO ({0}): {1}")]
    Read(&'static str, io::Error),
    #[error("the child's vDSO is not an ELF image wfjail can read: {0}")]
    Elf(&'static str),
    #[error("cannot patch the child's vDSO: {0}")]
    Write(io::Error),
}

impl VdsoError {
    /// The errno a start-up record carries for it.
    pub fn errno(&self) -> nix::errno::Errno {
        let raw = match self {
            VdsoError::Trace(e) | VdsoError::Read(_, e) | VdsoError::Write(e) => {
                e.raw_os_error().unwrap_or(libc::EIO)
            }
            VdsoError::NoStop(_) => libc::ETIMEDOUT,
            VdsoError::Elf(_) => libc::ENOEXEC,
        };
        nix::errno::Errno::from_raw(raw)
    }
}

/// How long the exec may take between its notification's answer and its stop.
const STOP_WITHIN: Duration = Duration::from_secs(5);

const AT_SYSINFO_EHDR: u64 = 33;
const AT_RANDOM: u64 = 25;

/// Lets the child's initial exec (notification `n`) run and, when `patch` asks, patches the
/// new image's vDSO at the exec stop before it runs. `Ok` also when the child died on the way
/// (its pidfd and the set-up channel tell the caller why). On `Err` the caller kills it.
pub fn exec(
    listener: BorrowedFd<'_>,
    n: &Notif,
    pid: libc::pid_t,
    patch: Option<Patch>,
) -> Result<(), VdsoError> {
    let Some(patch) = patch else {
        answer::allow(listener, n);
        return Ok(());
    };
    sys::ptrace_seize_for_exec(pid).map_err(VdsoError::Trace)?;
    answer::allow(listener, n);
    let deadline = Instant::now() + STOP_WITHIN;
    let mut nap = Duration::from_micros(20);
    loop {
        match sys::traced_state(pid) {
            Ok(Traced::ExecStop) => break,
            Ok(Traced::Gone) => return Ok(()),
            Ok(Traced::OtherStop(sig)) => {
                // Not ours to keep: pass it on and wait for the exec.
                let _ = sys::ptrace_cont(pid, sig);
            }
            Ok(Traced::Running) => {
                if Instant::now() >= deadline {
                    return Err(VdsoError::NoStop(STOP_WITHIN));
                }
                std::thread::sleep(nap);
                nap = (nap * 2).min(Duration::from_millis(2));
            }
            Err(e) => return Err(VdsoError::Trace(e)),
        }
    }
    patch_stopped(pid, patch)?;
    sys::ptrace_detach(pid).map_err(VdsoError::Trace)
}

/// Patches the vDSO of the tracee `pid`, stopped at its exec, and overwrites its `AT_RANDOM`
/// bytes when the patch is for randomness.
fn patch_stopped(pid: libc::pid_t, patch: Patch) -> Result<(), VdsoError> {
    if patch.random {
        // The 16 bytes the kernel put on the new stack: the C library's stack protector and
        // pointer guard, and anything that reads getauxval(AT_RANDOM). Nothing has read them
        // yet (no instruction of the image has run).
        let addr = sys::auxv_entry(pid, AT_RANDOM)
            .map_err(|e| VdsoError::Read("its auxv", e))?
            .ok_or(VdsoError::Elf("no AT_RANDOM in the auxiliary vector"))?;
        let bytes = super::entropy::at_random(patch.seed);
        for (i, word) in bytes.chunks_exact(8).enumerate() {
            let word: [u8; 8] = word.try_into().expect("8 bytes");
            sys::ptrace_poke(pid, addr + 8 * i as u64, word).map_err(VdsoError::Write)?;
        }
    }
    let Some(base) =
        sys::auxv_entry(pid, AT_SYSINFO_EHDR).map_err(|e| VdsoError::Read("its auxv", e))?
    else {
        return Ok(()); // no vDSO (booted with vdso=0): every read is a syscall already
    };
    let len = vdso_len(pid, base).map_err(|e| VdsoError::Read("its maps", e))?;
    let mut image = vec![0u8; len];
    let got = sys::read_process_memory(pid, base, &mut image)
        .map_err(|e| VdsoError::Read("its memory", e))?;
    image.truncate(got);
    let mut done: Vec<u64> = Vec::new();
    for (name, offset) in symbols(&image)? {
        let Some(code) = trampoline(&name, patch) else {
            continue;
        };
        let addr = base + offset;
        if done.contains(&addr) {
            continue; // `clock_gettime` and `__vdso_clock_gettime` are one function
        }
        sys::ptrace_poke(pid, addr, code).map_err(VdsoError::Write)?;
        done.push(addr);
    }
    Ok(())
}

/// The length of the `[vdso]` mapping at `base` (`/proc/PID/maps`).
fn vdso_len(pid: libc::pid_t, base: u64) -> io::Result<usize> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    for line in maps.lines().filter(|l| l.ends_with("[vdso]")) {
        let range = line.split_whitespace().next().unwrap_or("");
        let (a, b) = range.split_once('-').unwrap_or(("", ""));
        let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            continue;
        };
        if a == base && b > a && b - a <= 64 * 1024 {
            return Ok((b - a) as usize);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        "no [vdso] mapping at the auxiliary vector's address",
    ))
}

/// The code written over vDSO function `name` under `patch`, if it is one to patch.
fn trampoline(name: &str, patch: Patch) -> Option<[u8; 8]> {
    let bare = name.strip_prefix("__vdso_").unwrap_or(name);
    let syscall = |nr: u32| {
        let n = nr.to_le_bytes();
        // mov eax, nr ; syscall ; ret
        [0xb8, n[0], n[1], n[2], n[3], 0x0f, 0x05, 0xc3]
    };
    match bare {
        "clock_gettime" if patch.clock => Some(syscall(libc::SYS_clock_gettime as u32)),
        "gettimeofday" if patch.clock => Some(syscall(libc::SYS_gettimeofday as u32)),
        "time" if patch.clock => Some(syscall(libc::SYS_time as u32)),
        // mov rax, -ENOSYS ; ret (the C library then uses the syscall)
        "getrandom" if patch.random => Some([0x48, 0xc7, 0xc0, 0xda, 0xff, 0xff, 0xff, 0xc3]),
        _ => None,
    }
}

/// The dynamic symbols of an ELF64 little-endian image, as (name, offset from the image's
/// start). Every read is bounds-checked: the image comes from the guest's memory.
pub fn symbols(image: &[u8]) -> Result<Vec<(String, u64)>, VdsoError> {
    let u16_at = |o: usize| -> Option<u64> {
        Some(u16::from_le_bytes(image.get(o..o + 2)?.try_into().ok()?) as u64)
    };
    let u32_at = |o: usize| -> Option<u64> {
        Some(u32::from_le_bytes(image.get(o..o + 4)?.try_into().ok()?) as u64)
    };
    let u64_at = |o: usize| -> Option<u64> {
        Some(u64::from_le_bytes(image.get(o..o + 8)?.try_into().ok()?))
    };
    if image.get(..6) != Some(b"\x7fELF\x02\x01".as_slice()) {
        return Err(VdsoError::Elf("not a 64-bit little-endian ELF image"));
    }
    let bad = VdsoError::Elf;
    // The load bias: the first PT_LOAD's address is the image's start.
    let phoff = u64_at(0x20).ok_or(bad("truncated header"))? as usize;
    let phentsize = u16_at(0x36).ok_or(bad("truncated header"))? as usize;
    let phnum = u16_at(0x38).ok_or(bad("truncated header"))? as usize;
    let mut first_load = None;
    for i in 0..phnum.min(64) {
        let ph = phoff.saturating_add(i.saturating_mul(phentsize));
        if u32_at(ph) == Some(1) {
            first_load = Some(u64_at(ph + 0x10).ok_or(bad("truncated program header"))?);
            break;
        }
    }
    let vbase = first_load.ok_or(bad("no loadable segment"))?;
    let shoff = u64_at(0x28).ok_or(bad("truncated header"))? as usize;
    let shentsize = u16_at(0x3a).ok_or(bad("truncated header"))? as usize;
    let shnum = u16_at(0x3c).ok_or(bad("truncated header"))? as usize;
    let section = |i: usize| shoff.saturating_add(i.saturating_mul(shentsize));
    const SHT_DYNSYM: u64 = 11;
    let dynsym = (0..shnum.min(256))
        .map(section)
        .find(|&s| u32_at(s + 4) == Some(SHT_DYNSYM))
        .ok_or(bad("no dynamic symbol table"))?;
    let sym_off = u64_at(dynsym + 0x18).ok_or(bad("truncated section header"))? as usize;
    let sym_size = u64_at(dynsym + 0x20).ok_or(bad("truncated section header"))? as usize;
    let link = u32_at(dynsym + 0x28).ok_or(bad("truncated section header"))? as usize;
    let strtab = section(link);
    let str_off = u64_at(strtab + 0x18).ok_or(bad("truncated string table"))? as usize;
    let str_size = u64_at(strtab + 0x20).ok_or(bad("truncated string table"))? as usize;
    let strings = image
        .get(str_off..str_off.saturating_add(str_size))
        .ok_or(bad("string table outside the image"))?;
    let mut out = Vec::new();
    for i in 0..(sym_size / 24).min(1024) {
        let s = sym_off.saturating_add(i * 24);
        let name_at = u32_at(s).ok_or(bad("symbol outside the image"))? as usize;
        let shndx = u16_at(s + 6).ok_or(bad("symbol outside the image"))?;
        let value = u64_at(s + 8).ok_or(bad("symbol outside the image"))?;
        if shndx == 0 || name_at >= strings.len() {
            continue; // undefined, or no name
        }
        let end = strings[name_at..]
            .iter()
            .position(|&b| b == 0)
            .ok_or(bad("unterminated symbol name"))?;
        let name = String::from_utf8_lossy(&strings[name_at..name_at + end]).into_owned();
        let offset = value
            .checked_sub(vbase)
            .filter(|&o| (o as usize).saturating_add(8) <= image.len())
            .ok_or(bad("symbol outside the image"))?;
        out.push((name, offset));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process's own vDSO, read the way the supervisor reads a child's.
    fn own_vdso() -> Vec<u8> {
        let pid = sys::getpid();
        let base = sys::auxv_entry(pid, AT_SYSINFO_EHDR)
            .unwrap()
            .expect("a vDSO");
        let mut image = vec![0u8; vdso_len(pid, base).unwrap()];
        let n = sys::read_process_memory(pid, base, &mut image).unwrap();
        image.truncate(n);
        image
    }

    #[test]
    fn finds_the_clock_functions_of_this_kernels_vdso() {
        let syms = symbols(&own_vdso()).unwrap();
        let names: Vec<&str> = syms.iter().map(|(n, _)| n.as_str()).collect();
        for want in ["__vdso_clock_gettime", "__vdso_gettimeofday", "__vdso_time"] {
            assert!(names.contains(&want), "{want} in {names:?}");
        }
        let addr = |n: &str| syms.iter().find(|(s, _)| s == n).unwrap().1;
        assert_eq!(addr("clock_gettime"), addr("__vdso_clock_gettime"));
    }

    #[test]
    fn refuses_images_it_cannot_read() {
        assert!(matches!(symbols(b"not elf"), Err(VdsoError::Elf(_))));
        let mut truncated = own_vdso();
        truncated.truncate(200);
        assert!(matches!(symbols(&truncated), Err(VdsoError::Elf(_))));
    }

    #[test]
    fn trampolines_make_the_syscall() {
        let p = Patch {
            clock: true,
            random: false,
            seed: 0,
        };
        assert_eq!(
            trampoline("__vdso_clock_gettime", p),
            Some([0xb8, 228, 0, 0, 0, 0x0f, 0x05, 0xc3])
        );
        assert_eq!(trampoline("__vdso_getrandom", p), None);
        assert_eq!(trampoline("__vdso_getcpu", p), None);
    }
}
