//! Reading a guest's memory to decode its notifications (`notify/decode.rs`) and to answer
//! them (`answers/filetimes.rs`): a leaf below both. Everything the decoder reads from the
//! guest goes through [`GuestMemory`]: [`ProcessMemory`] reads a live process with
//! `process_vm_readv`; [`MemoryImage`] is a byte buffer at an address, for tests and the fuzz
//! targets (fuzz/), so decoding runs without a guest.
//!
//! What is read is the guest's to change until the supervisor checks the notification is
//! still pending (`SECCOMP_IOCTL_NOTIF_ID_VALID`, in `notify::handle`): the readers here
//! trust nothing they read, and bound how much they read.

use std::io;

use crate::sys;

/// Pages are read one at a time, so that a string near the end of a mapping can be read.
pub const PAGE_SIZE: u64 = 4096;
/// A path read from the guest is at most this long, NUL included, like the kernel's.
pub const PATH_MAX: usize = libc::PATH_MAX as usize;
/// The most bytes one [`GuestMemory::read_bytes`] gives.
pub const MAX_READ: usize = 4096;

/// Why a path could not be read from the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathError {
    Unreadable,
    TooLong,
}

impl std::fmt::Display for PathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PathError::Unreadable => "the path is not readable in the guest's memory",
            PathError::TooLong => "the path is longer than PATH_MAX",
        })
    }
}

/// A guest's address space, read-only. An implementation gives [`GuestMemory::read_at`];
/// the provided readers hold the bounds (pages, [`MAX_READ`], [`PATH_MAX`]) and are what the
/// decoder calls.
pub trait GuestMemory {
    /// Copies the bytes at `addr` into `buf` (the callers never cross a page): the count
    /// copied, which may be short; 0 or an error when nothing at `addr` is readable.
    fn read_at(&self, addr: u64, buf: &mut [u8]) -> io::Result<usize>;

    /// Up to `len` bytes at `addr` (at most [`MAX_READ`]), fewer if a page is unreadable;
    /// `None` when nothing is, or `addr` is 0.
    fn read_bytes(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        if addr == 0 {
            return None;
        }
        let len = len.min(MAX_READ);
        let mut buf = vec![0u8; len];
        let mut done = 0;
        while done < len {
            let Some(a) = addr.checked_add(done as u64) else {
                break;
            };
            let to_page_end = (PAGE_SIZE - a % PAGE_SIZE) as usize;
            let want = (len - done).min(to_page_end);
            match self.read_at(a, &mut buf[done..done + want]) {
                Ok(0) | Err(_) => break,
                Ok(n) => done += n.min(want),
            }
        }
        if done == 0 {
            return None;
        }
        buf.truncate(done);
        Some(buf)
    }

    /// A NUL-terminated path at `addr`, as bytes without the NUL: at most [`PATH_MAX`]
    /// including the NUL, like the kernel.
    fn read_path(&self, addr: u64) -> Result<Vec<u8>, PathError> {
        let mut out = Vec::new();
        let mut a = addr;
        while out.len() < PATH_MAX {
            let want = (PAGE_SIZE - a % PAGE_SIZE) as usize;
            let chunk = self.read_bytes(a, want).ok_or(PathError::Unreadable)?;
            if let Some(nul) = chunk.iter().position(|&b| b == 0) {
                out.extend_from_slice(&chunk[..nul]);
                if out.len() >= PATH_MAX {
                    break;
                }
                return Ok(out);
            }
            out.extend_from_slice(&chunk);
            a = a
                .checked_add(chunk.len() as u64)
                .ok_or(PathError::Unreadable)?;
        }
        Err(PathError::TooLong)
    }

    /// A NUL-terminated string at `addr`, for reports: the path, or its first 4 KiB and
    /// `...` when it is longer; `None` when unreadable.
    fn read_string(&self, addr: u64) -> Option<String> {
        match self.read_path(addr) {
            Ok(b) => Some(String::from_utf8_lossy(&b).into_owned()),
            Err(PathError::TooLong) => {
                let b = self.read_bytes(addr, MAX_READ)?;
                Some(String::from_utf8_lossy(&b).into_owned() + "...")
            }
            Err(PathError::Unreadable) => None,
        }
    }
}

/// The memory of a live process, by global pid, read with `process_vm_readv` (the guest is
/// dumpable and in our Landlock domain or a nested one: docs/architecture.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessMemory {
    pub pid: u32,
}

impl ProcessMemory {
    pub fn new(pid: u32) -> Self {
        ProcessMemory { pid }
    }
}

impl GuestMemory for ProcessMemory {
    fn read_at(&self, addr: u64, buf: &mut [u8]) -> io::Result<usize> {
        sys::read_process_memory(self.pid as libc::pid_t, addr, buf)
    }
}

/// Bytes mapped at `base`; every other address is unreadable (EFAULT, like an unmapped page).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryImage {
    pub base: u64,
    pub bytes: Vec<u8>,
}

impl MemoryImage {
    pub fn new(base: u64, bytes: impl Into<Vec<u8>>) -> Self {
        MemoryImage {
            base,
            bytes: bytes.into(),
        }
    }
}

impl GuestMemory for MemoryImage {
    fn read_at(&self, addr: u64, buf: &mut [u8]) -> io::Result<usize> {
        let rest = addr
            .checked_sub(self.base)
            .and_then(|off| usize::try_from(off).ok())
            .and_then(|off| self.bytes.get(off..))
            .filter(|rest| !rest.is_empty())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EFAULT))?;
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: u64 = 0x10_0000;

    #[test]
    fn reads_stop_where_the_image_ends() {
        let m = MemoryImage::new(BASE, b"abcdef".to_vec());
        assert_eq!(m.read_bytes(BASE + 2, 3).unwrap(), b"cde");
        assert_eq!(
            m.read_bytes(BASE + 4, 100).unwrap(),
            b"ef",
            "short at the end"
        );
        assert_eq!(m.read_bytes(BASE + 6, 1), None);
        assert_eq!(m.read_bytes(BASE - 1, 4), None, "below the image");
        assert_eq!(m.read_bytes(0, 4), None, "NULL");
        let top = MemoryImage::new(u64::MAX - 1, b"xy".to_vec());
        assert_eq!(top.read_bytes(u64::MAX - 1, 8).unwrap(), b"xy");
        assert_eq!(top.read_path(u64::MAX - 1), Err(PathError::Unreadable));
    }

    #[test]
    fn paths_cross_pages_and_are_bounded() {
        // A path that starts 3 bytes before a page boundary.
        let start = BASE + PAGE_SIZE - 3;
        let mut bytes = vec![b'x'; (PAGE_SIZE - 3) as usize];
        bytes.extend_from_slice(b"/tmp/a\0");
        let m = MemoryImage::new(BASE, bytes);
        assert_eq!(
            m.read_path(start).unwrap(),
            b"/tmp/a",
            "across the page boundary"
        );
        let m = MemoryImage::new(BASE, b"/no/nul".to_vec());
        assert_eq!(m.read_path(BASE), Err(PathError::Unreadable));
        assert_eq!(m.read_string(BASE), None);
        let long = MemoryImage::new(BASE, vec![b'a'; 2 * PATH_MAX]);
        assert_eq!(long.read_path(BASE), Err(PathError::TooLong));
        let s = long.read_string(BASE).unwrap();
        assert_eq!(s.len(), MAX_READ + 3);
        assert!(s.ends_with("a..."));
        let mut exact = vec![b'a'; PATH_MAX - 1];
        exact.push(0);
        let exact = MemoryImage::new(BASE, exact);
        assert_eq!(exact.read_path(BASE).unwrap().len(), PATH_MAX - 1);
    }
}
