//! The records the child writes on the set-up channel before `execve` (`process/channel.rs`
//! is the channel and the parent's reading): each step that failed or degraded, and the
//! record the seccomp listener travels with. They belong to the child, which is below the
//! parent that reads them.
//!
//! Wire format (one record per packet, fixed size, so neither side allocates):
//! `[magic 0xWF][tag u8][step u8][pad u8][errno i32 LE]` = 8 bytes.

use std::os::fd::RawFd;

use nix::errno::Errno;

use crate::sys;

const MAGIC: u8 = 0xf7;
/// Every record is this long; anything else is a protocol error.
pub const RECORD_LEN: usize = 8;

/// A confinement step, as named in reports and errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Step {
    DeathSignal = 1,
    IdMaps = 2,
    NetNs = 3,
    IpcNs = 4,
    UtsNs = 5,
    Hostname = 6,
    Descriptors = 7,
    Rlimits = 8,
    Capabilities = 9,
    CapabilityBounding = 10,
    NoNewPrivs = 11,
    Landlock = 12,
    Seccomp = 13,
    SeccompNotify = 14,
    Exec = 15,
    MountNs = 16,
    /// Parent-side: the exec stop that patches the guest's vDSO (answers/vdso.rs).
    Vdso = 17,
    Personality = 18,
    /// `serve --merge-pages`: the zygote opted into same-page merging before its exec. Not a
    /// confinement layer: a failure is the operator log's (`merging::notice`), not a report's.
    MemoryMerge = 19,
}

impl Step {
    fn from_u8(v: u8) -> Option<Step> {
        use Step::*;
        Some(match v {
            1 => DeathSignal,
            2 => IdMaps,
            3 => NetNs,
            4 => IpcNs,
            5 => UtsNs,
            6 => Hostname,
            7 => Descriptors,
            8 => Rlimits,
            9 => Capabilities,
            10 => CapabilityBounding,
            11 => NoNewPrivs,
            12 => Landlock,
            13 => Seccomp,
            14 => SeccompNotify,
            15 => Exec,
            16 => MountNs,
            17 => Vdso,
            18 => Personality,
            19 => MemoryMerge,
            _ => return None,
        })
    }

    pub fn describe(self) -> &'static str {
        match self {
            Step::DeathSignal => "setting the parent-death signal",
            Step::IdMaps => "writing the user namespace id maps",
            Step::NetNs => "creating the network namespace",
            Step::IpcNs => "creating the IPC namespace",
            Step::UtsNs => "creating the UTS namespace",
            Step::Hostname => "setting the hostname",
            Step::Descriptors => "arranging file descriptors",
            Step::Rlimits => "setting resource limits",
            Step::Capabilities => "dropping capabilities",
            Step::CapabilityBounding => "clearing the capability bounding set",
            Step::NoNewPrivs => "setting no_new_privs",
            Step::Landlock => "applying the Landlock ruleset",
            Step::Seccomp => "installing the seccomp filter",
            Step::SeccompNotify => {
                "installing the seccomp filter with a user-notification listener"
            }
            Step::Exec => "executing the command",
            Step::MountNs => "mounting a private /proc in a mount namespace",
            Step::Personality => {
                "switching address-space randomisation off (address-layout: personality(ADDR_NO_RANDOMIZE) for [process] address_randomization = \"deny\"; the container's seccomp profile must allow personality(0x40000), see docs/containers.md)"
            }
            Step::MemoryMerge => {
                "opting the zygote into same-page merging (prctl(PR_SET_MEMORY_MERGE, 1) before its exec)"
            }
            Step::Vdso => {
                "tracing the command across its exec to patch its vDSO (needed by [time] clock and [random] getrandom other than \"allow\": ptrace must be allowed by the container's seccomp profile and Yama)"
            }
        }
    }
}

/// A message from the child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildMsg {
    /// A best-effort step failed; the child goes on.
    Degraded { step: Step, errno: Errno },
    /// A required step failed; the child exits right after sending this.
    Fatal { step: Step, errno: Errno },
    /// The seccomp listener is attached to this record.
    Listener,
}

const TAG_DEGRADED: u8 = 1;
const TAG_FATAL: u8 = 2;
const TAG_LISTENER: u8 = 3;

impl ChildMsg {
    pub fn encode(self) -> [u8; RECORD_LEN] {
        let (tag, step, errno) = match self {
            ChildMsg::Degraded { step, errno } => (TAG_DEGRADED, step as u8, errno as i32),
            ChildMsg::Fatal { step, errno } => (TAG_FATAL, step as u8, errno as i32),
            ChildMsg::Listener => (TAG_LISTENER, 0, 0),
        };
        let e = errno.to_le_bytes();
        [MAGIC, tag, step, 0, e[0], e[1], e[2], e[3]]
    }

    pub fn decode(b: &[u8]) -> Result<ChildMsg, ChannelError> {
        let b: &[u8; RECORD_LEN] = b.try_into().map_err(|_| ChannelError::Length(b.len()))?;
        if b[0] != MAGIC {
            return Err(ChannelError::Magic(b[0]));
        }
        let errno = Errno::from_raw(i32::from_le_bytes([b[4], b[5], b[6], b[7]]));
        let step = || Step::from_u8(b[2]).ok_or(ChannelError::Step(b[2]));
        match b[1] {
            TAG_DEGRADED => Ok(ChildMsg::Degraded {
                step: step()?,
                errno,
            }),
            TAG_FATAL => Ok(ChildMsg::Fatal {
                step: step()?,
                errno,
            }),
            TAG_LISTENER => Ok(ChildMsg::Listener),
            t => Err(ChannelError::Tag(t)),
        }
    }
}

#[derive(Debug, Clone, Copy, thiserror::Error, PartialEq, Eq)]
pub enum ChannelError {
    #[error("set-up record of {0} bytes (expected {RECORD_LEN})")]
    Length(usize),
    #[error("set-up record with bad magic {0:#x}")]
    Magic(u8),
    #[error("set-up record with unknown tag {0}")]
    Tag(u8),
    #[error("set-up record with unknown step {0}")]
    Step(u8),
}

/// Child side: sends a record (child-safe). Errors are ignored: if the parent is gone the
/// parent-death signal ends us anyway.
pub fn send(chan: RawFd, msg: ChildMsg) {
    let _ = sys::write_all(chan, &msg.encode());
}

/// Child side: sends the listener record with `fd` attached (child-safe).
pub fn send_listener(chan: RawFd, fd: RawFd) -> sys::SysResult<()> {
    sys::send_with_fd(chan, &ChildMsg::Listener.encode(), fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for m in [
            ChildMsg::Degraded {
                step: Step::NetNs,
                errno: Errno::EPERM,
            },
            ChildMsg::Fatal {
                step: Step::Exec,
                errno: Errno::ENOENT,
            },
            ChildMsg::Listener,
        ] {
            assert_eq!(ChildMsg::decode(&m.encode()), Ok(m));
        }
        assert_eq!(ChildMsg::decode(&[0; 3]), Err(ChannelError::Length(3)));
        assert_eq!(ChildMsg::decode(&[0; 8]), Err(ChannelError::Magic(0)));
        let mut bad = ChildMsg::Listener.encode();
        bad[1] = 9;
        assert_eq!(ChildMsg::decode(&bad), Err(ChannelError::Tag(9)));
    }
}
