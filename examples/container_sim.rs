//! `container_sim`: runs a command the way a container runtime would confine it, so that
//! wfjail's behaviour under Docker, Kubernetes and older runtimes can be tested on a bare host.
//!
//! ```text
//! container_sim [--deny-namespaces] [--deny-landlock] [--deny-notify] [--deny-process-vm]
//!               [--deny-ptrace] [--deny-sethostname] [--deny-personality] [--drop-sys-admin]
//!               -- CMD [ARG...]
//! ```
//!
//! It sets no_new_privs, installs a classic-BPF seccomp filter (x86_64 only) built from the
//! flags below, optionally drops CAP_SYS_ADMIN, then execs CMD (searched in PATH like
//! `execvp`). The filter applies to CMD and everything it starts, exactly like a runtime's
//! profile applies to every process of a container; wfjail's own filter stacks on top of it,
//! and for each syscall the kernel takes the most restrictive answer of the two.
//!
//! Flags, and what each imitates:
//!
//! * `--deny-namespaces` — Docker's default seccomp profile (moby `profiles/seccomp/default.json`)
//!   for a container without CAP_SYS_ADMIN, which is also what Kubernetes applies with
//!   `seccompProfile: RuntimeDefault` (containerd and CRI-O ship the same rules):
//!   `unshare` and `setns` fail with EPERM (the profile's default action); `clone` fails with
//!   EPERM when its flags (arg0) contain any of CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC,
//!   CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET or CLONE_NEWCGROUP (the profile's
//!   `SCMP_CMP_MASKED_EQ 0x7E020000 == 0` rule); `clone3` fails with ENOSYS (the profile's
//!   `errnoRet: 38`, because a filter cannot read clone3's flags, which live in memory: libc
//!   then falls back to `clone`).
//! * `--deny-landlock` — a runtime whose profile predates Landlock (Docker < 23, older
//!   containerd/CRI-O): `landlock_create_ruleset`, `landlock_add_rule` and
//!   `landlock_restrict_self` fail with ENOSYS, which runc answers for syscalls newer than
//!   any the profile names, so that programs treat them as "not in this kernel".
//! * `--deny-notify` — a runtime that already holds a seccomp user-notification listener on
//!   the container (an OCI `listenerPath` seccomp agent, LXD/Incus syscall interception,
//!   Sysbox, a Kubernetes seccomp notifier): the kernel allows one listener per filter
//!   chain, so `seccomp(SECCOMP_SET_MODE_FILTER, flags with SECCOMP_FILTER_FLAG_NEW_LISTENER)`
//!   fails with EBUSY. Other `seccomp` calls are allowed.
//! * `--deny-process-vm` — Docker <= 22 and containerd < 1.7 profiles (Debian's docker.io
//!   included), which allow `process_vm_readv`/`process_vm_writev` only with
//!   CAP_SYS_PTRACE: both fail with EPERM.
//! * `--deny-ptrace` — Docker's profile before 19.03, or on kernels before 4.8: `ptrace`
//!   fails with EPERM.
//! * `--deny-sethostname` — podman's default profile (containers-common): namespaces are
//!   allowed but `sethostname` fails with EPERM, so a guest's UTS namespace keeps the
//!   container's hostname.
//! * `--deny-personality` — podman's and Docker's default profiles (hence Kubernetes'
//!   `RuntimeDefault`): `personality` is allowed only with 0x0, 0x8, 0x20000, 0x20008 or
//!   0xffffffff (a query) and fails with EPERM otherwise, `ADDR_NO_RANDOMIZE` (0x40000)
//!   included.
//! * `--drop-sys-admin` — a container's root user, which Docker and Kubernetes run without
//!   CAP_SYS_ADMIN: the capability leaves the bounding, inheritable, permitted and effective
//!   sets (and the ambient set is cleared), so it does not come back when CMD is executed.
//!   Dropping it from the bounding set needs CAP_SETPCAP: an unprivileged user cannot use
//!   this flag (and has no CAP_SYS_ADMIN to drop anyway).
//!
//! With none of the `--deny-*` flags, `--deny-namespaces` is implied: the default is Docker's
//! default profile. Give `--deny-landlock` or `--deny-notify` alone to simulate only that
//! restriction. Everything not listed above is allowed. Syscalls of a foreign architecture
//! (i386 through `int 0x80`) and of the x32 ABI fail with EPERM: the filter's numbers are
//! x86_64's, and wfjail rejects those calls itself anyway.
//!
//! Exit status: 2 for a usage error, 125 when the confinement cannot be set up, 127/126 when
//! CMD cannot be executed; otherwise CMD replaces this process.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};

// Classic BPF opcodes (linux/bpf_common.h).
const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const BPF_JMP_JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const BPF_JMP_JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const BPF_JMP_JSET_K: u16 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
const BPF_RET_K: u16 = 0x06; // BPF_RET | BPF_K

// Seccomp return values (linux/seccomp.h).
const RET_ALLOW: u32 = 0x7fff_0000;
const RET_ERRNO: u32 = 0x0005_0000;

/// `AUDIT_ARCH_X86_64`: EM_X86_64 (62) | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE.
const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

// Offsets into `struct seccomp_data`: nr, arch, instruction_pointer, args[6] (little endian,
// so the low 32 bits of args[i] are at 16 + 8 * i).
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
const OFF_ARG0_LO: u32 = 16;
const OFF_ARG1_LO: u32 = 24;

// x86_64 syscall numbers.
const NR_CLONE: u32 = 56;
const NR_UNSHARE: u32 = 272;
const NR_SETNS: u32 = 308;
const NR_SECCOMP: u32 = 317;
const NR_CLONE3: u32 = 435;
const NR_LANDLOCK_CREATE_RULESET: u32 = 444;
const NR_LANDLOCK_ADD_RULE: u32 = 445;
const NR_LANDLOCK_RESTRICT_SELF: u32 = 446;

/// The namespace flags Docker's profile refuses on `clone`: CLONE_NEWNS | CLONE_NEWCGROUP |
/// CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET (0x7E020000).
const CLONE_NAMESPACE_FLAGS: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u32;

const NR_SETHOSTNAME: u32 = 170;
const NR_PERSONALITY: u32 = 135;
/// The personas Docker's and podman's profiles allow (PER_LINUX, UNAME26, PER_LINUX32,
/// their union, and the query).
const ALLOWED_PERSONAS: [u32; 5] = [0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];
const NR_PTRACE: u32 = 101;
const NR_PROCESS_VM_READV: u32 = 310;
const NR_PROCESS_VM_WRITEV: u32 = 311;
/// `SECCOMP_FILTER_FLAG_NEW_LISTENER`.
const FLAG_NEW_LISTENER: u32 = 8;

/// What to simulate.
#[derive(Debug, Default, Clone, Copy)]
struct Options {
    deny_namespaces: bool,
    deny_landlock: bool,
    deny_notify: bool,
    deny_process_vm: bool,
    deny_ptrace: bool,
    deny_sethostname: bool,
    deny_personality: bool,
    drop_sys_admin: bool,
}

const USAGE: &str = "usage: container_sim [--deny-namespaces] [--deny-landlock] [--deny-notify] \
                     [--deny-process-vm] [--deny-ptrace] [--deny-sethostname] \
                     [--deny-personality] [--drop-sys-admin] -- CMD [ARG...]";

fn parse(args: &[OsString]) -> Result<(Options, &[OsString]), String> {
    let mut o = Options::default();
    for (i, a) in args.iter().enumerate() {
        match a.to_str() {
            Some("--") => {
                let cmd = &args[i + 1..];
                if cmd.is_empty() {
                    return Err("no command given after `--`".into());
                }
                if !(o.deny_namespaces
                    || o.deny_landlock
                    || o.deny_notify
                    || o.deny_process_vm
                    || o.deny_ptrace
                    || o.deny_sethostname
                    || o.deny_personality)
                {
                    o.deny_namespaces = true;
                }
                return Ok((o, cmd));
            }
            Some("--deny-namespaces") => o.deny_namespaces = true,
            Some("--deny-landlock") => o.deny_landlock = true,
            Some("--deny-notify") => o.deny_notify = true,
            Some("--deny-process-vm") => o.deny_process_vm = true,
            Some("--deny-ptrace") => o.deny_ptrace = true,
            Some("--deny-sethostname") => o.deny_sethostname = true,
            Some("--deny-personality") => o.deny_personality = true,
            Some("--drop-sys-admin") => o.drop_sys_admin = true,
            _ => return Err(format!("unknown argument {a:?}")),
        }
    }
    Err("missing `--` before the command".into())
}

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

fn ret_errno(errno: i32) -> libc::sock_filter {
    stmt(BPF_RET_K, RET_ERRNO | (errno as u32 & 0xffff))
}

/// `if nr == syscall { return ret }`; expects the syscall number in the accumulator.
fn deny_nr(prog: &mut Vec<libc::sock_filter>, syscall: u32, ret: libc::sock_filter) {
    prog.push(jump(BPF_JMP_JEQ_K, syscall, 0, 1));
    prog.push(ret);
}

/// `if nr == syscall { return (arg_lo & mask) != 0 ? ret : ALLOW }`; expects the syscall
/// number in the accumulator (and leaves it there when the syscall does not match).
fn deny_flags(
    prog: &mut Vec<libc::sock_filter>,
    syscall: u32,
    arg_offset: u32,
    mask: u32,
    ret: libc::sock_filter,
) {
    prog.push(jump(BPF_JMP_JEQ_K, syscall, 0, 4));
    prog.push(stmt(BPF_LD_W_ABS, arg_offset));
    prog.push(jump(BPF_JMP_JSET_K, mask, 0, 1));
    prog.push(ret);
    prog.push(stmt(BPF_RET_K, RET_ALLOW));
}

/// The container runtime's filter for `o`.
fn program(o: Options) -> Vec<libc::sock_filter> {
    let mut p = vec![
        // Foreign architectures: the numbers below would mean other calls.
        stmt(BPF_LD_W_ABS, OFF_ARCH),
        jump(BPF_JMP_JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
        ret_errno(libc::EPERM),
        stmt(BPF_LD_W_ABS, OFF_NR),
        // The x32 ABI (same arch value, numbers with bit 30 set).
        jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, 0, 1),
        ret_errno(libc::EPERM),
    ];
    if o.deny_namespaces {
        deny_nr(&mut p, NR_UNSHARE, ret_errno(libc::EPERM));
        deny_nr(&mut p, NR_SETNS, ret_errno(libc::EPERM));
        deny_nr(&mut p, NR_CLONE3, ret_errno(libc::ENOSYS));
    }
    if o.deny_landlock {
        for nr in [
            NR_LANDLOCK_CREATE_RULESET,
            NR_LANDLOCK_ADD_RULE,
            NR_LANDLOCK_RESTRICT_SELF,
        ] {
            deny_nr(&mut p, nr, ret_errno(libc::ENOSYS));
        }
    }
    if o.deny_ptrace {
        deny_nr(&mut p, NR_PTRACE, ret_errno(libc::EPERM));
    }
    if o.deny_sethostname {
        deny_nr(&mut p, NR_SETHOSTNAME, ret_errno(libc::EPERM));
    }
    if o.deny_process_vm {
        deny_nr(&mut p, NR_PROCESS_VM_READV, ret_errno(libc::EPERM));
        deny_nr(&mut p, NR_PROCESS_VM_WRITEV, ret_errno(libc::EPERM));
    }
    // The argument checks come last: each ends the program for its syscall.
    if o.deny_namespaces {
        deny_flags(
            &mut p,
            NR_CLONE,
            OFF_ARG0_LO,
            CLONE_NAMESPACE_FLAGS,
            ret_errno(libc::EPERM),
        );
    }
    if o.deny_notify {
        deny_flags(
            &mut p,
            NR_SECCOMP,
            OFF_ARG1_LO,
            FLAG_NEW_LISTENER,
            ret_errno(libc::EBUSY),
        );
    }
    if o.deny_personality {
        // if nr == personality { return arg0 in ALLOWED_PERSONAS ? ALLOW : EPERM }
        let n = ALLOWED_PERSONAS.len() as u8;
        p.push(jump(BPF_JMP_JEQ_K, NR_PERSONALITY, 0, n + 3));
        p.push(stmt(BPF_LD_W_ABS, OFF_ARG0_LO));
        for (i, persona) in (0u8..).zip(ALLOWED_PERSONAS) {
            p.push(jump(BPF_JMP_JEQ_K, persona, n - i, 0));
        }
        p.push(ret_errno(libc::EPERM));
        p.push(stmt(BPF_RET_K, RET_ALLOW));
    }
    p.push(stmt(BPF_RET_K, RET_ALLOW));
    p
}

fn drop_sys_admin() -> Result<(), String> {
    use caps::{CapSet, Capability};
    let cap = Capability::CAP_SYS_ADMIN;
    let in_bounding = caps::has_cap(None, CapSet::Bounding, cap).map_err(|e| e.to_string())?;
    if in_bounding {
        caps::drop(None, CapSet::Bounding, cap).map_err(|e| {
            format!("dropping CAP_SYS_ADMIN from the bounding set (needs CAP_SETPCAP): {e}")
        })?;
    }
    caps::clear(None, CapSet::Ambient).map_err(|e| format!("clearing the ambient set: {e}"))?;
    for set in [CapSet::Inheritable, CapSet::Effective, CapSet::Permitted] {
        caps::drop(None, set, cap)
            .map_err(|e| format!("dropping CAP_SYS_ADMIN from the {set:?} set: {e}"))?;
    }
    Ok(())
}

fn set_no_new_privs() -> std::io::Result<()> {
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) takes no pointers; it only sets a flag
    // on this process.
    let r = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn install_filter(prog: &[libc::sock_filter]) -> std::io::Result<()> {
    let len =
        u16::try_from(prog.len()).map_err(|_| std::io::Error::other("seccomp program too long"))?;
    let fprog = libc::sock_fprog {
        len,
        filter: prog.as_ptr().cast_mut(),
    };
    // SAFETY: `fprog` points at `prog`, `len` instructions that stay alive for the call; the
    // kernel copies the program before returning and does not write through the pointer.
    let r = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0 as libc::c_uint,
            &fprog as *const libc::sock_fprog,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn main() -> ExitCode {
    if !cfg!(target_arch = "x86_64") {
        eprintln!("container_sim: x86_64 only (the filter uses x86_64 syscall numbers)");
        return ExitCode::from(125);
    }
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let (opts, cmd) = match parse(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("container_sim: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if opts.drop_sys_admin
        && let Err(e) = drop_sys_admin()
    {
        eprintln!("container_sim: {e}");
        return ExitCode::from(125);
    }
    if let Err(e) = set_no_new_privs() {
        eprintln!("container_sim: prctl(PR_SET_NO_NEW_PRIVS): {e}");
        return ExitCode::from(125);
    }
    if let Err(e) = install_filter(&program(opts)) {
        eprintln!("container_sim: installing the seccomp filter: {e}");
        return ExitCode::from(125);
    }
    let err = Command::new(&cmd[0]).args(&cmd[1..]).exec();
    eprintln!("container_sim: {}: {err}", cmd[0].to_string_lossy());
    ExitCode::from(if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    })
}
