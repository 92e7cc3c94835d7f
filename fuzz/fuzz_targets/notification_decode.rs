//! Seccomp notification decoding (`notify::decode::decode`): a notification of any syscall
//! number and arguments, the guest's memory a byte image at an address (`MemoryImage`, through
//! the `GuestMemory` trait the supervisor reads a live guest with).
//!
//! Only `decode` is fed, which reads guest memory and nothing else. `classify` is not: for
//! watched writes and locks it judges paths against the real file system (`paths.rs` resolves
//! them through `/proc` and every directory on the way, whatever the grants), and the target
//! stays free of file-system effects.
//!
//! Input: one selector byte (bits 0-1: the built-in policy, default, strict, permissive or
//! temporal-python; bit 2: a foreign architecture, i386), the syscall number (i32 LE), six
//! arguments (u64 LE), the image's base address (u64 LE), then the image.
//!
//! Checked: no panic; the arguments text is at most `MAX_ARGS_TEXT` bytes and the syscall and
//! rule texts short; a decoded call fails with EPERM (a timed futex wait under `sleep =
//! "deny"` with ETIMEDOUT), and a foreign or x32 call is denied
//! whatever the policy; decoding is a function of the notification and the memory (twice the
//! same, but for an absolute `clock_nanosleep`, shown relative to now).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use wfjail::policy::bpf::{AUDIT_ARCH_X86_64, X32_SYSCALL_BIT};
use wfjail::policy;
use wfjail::policy::decisions::Decisions;
use wfjail::notify::decode::{MAX_ARGS_TEXT, decode};
use wfjail::guest_memory::MemoryImage;
use wfjail::sys::Notif;

const AUDIT_ARCH_I386: u32 = 0x4000_0003;
const EPERM: i32 = 1;
const ETIMEDOUT: i32 = 110;
const HEADER: usize = 1 + 4 + 6 * 8 + 8;

fn policies() -> &'static [Decisions] {
    static P: OnceLock<Vec<Decisions>> = OnceLock::new();
    P.get_or_init(|| {
        ["default", "strict", "permissive", "temporal-python"]
            .iter()
            .map(|n| Decisions::compile(&policy::load(n).unwrap(), Default::default()))
            .collect()
    })
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fuzz_target!(|data: &[u8]| {
    if data.len() < HEADER {
        return;
    }
    let sel = data[0];
    let policy = &policies()[(sel & 3) as usize];
    let foreign = sel & 4 != 0;
    let nr = i32::from_le_bytes(data[1..5].try_into().unwrap());
    let mut args = [0u64; 6];
    for (i, a) in args.iter_mut().enumerate() {
        *a = u64_at(data, 5 + 8 * i);
    }
    let mem = MemoryImage::new(u64_at(data, 53), &data[HEADER..]);
    let n = Notif {
        id: 1,
        pid: u32::MAX,
        nr,
        arch: if foreign {
            AUDIT_ARCH_I386
        } else {
            AUDIT_ARCH_X86_64
        },
        instruction_pointer: 0,
        args,
    };
    let d = decode(&n, &mem, policy);
    assert!(d.args.len() <= MAX_ARGS_TEXT, "{} bytes", d.args.len());
    assert!(d.syscall.len() <= 64, "{:?}", d.syscall);
    assert!(d.rule.len() <= 256, "{:?}", d.rule);
    // EPERM, but for a timed futex wait under `sleep = "deny"`, which times out at once.
    assert!(
        d.errno == EPERM || (d.errno == ETIMEDOUT && matches!(d.syscall.as_str(), "futex" | "futex_waitv")),
        "{d:?}"
    );
    if foreign || (nr as u32) & X32_SYSCALL_BIT != 0 {
        assert!(d.always_deny, "{d:?}");
    }
    if d.syscall != "clock_nanosleep" {
        assert_eq!(decode(&n, &mem, policy), d, "decoded twice, differently");
    }
});
