#!/usr/bin/env python3
"""Writes the seed corpora in fuzz/corpus/<target>/ (committed; rerun after a format change).

Seeds are well-formed inputs of each target's input layout (see the header of each
fuzz_targets/*.rs) so that the fuzzer starts from the protocol, not from noise.
"""
import hashlib, json, os, struct

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def frame(kind, payload=b""):
    if isinstance(payload, str):
        payload = payload.encode()
    return struct.pack("<I", len(payload) + 1) + bytes([kind]) + payload


def write(target, seeds):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    for old in os.listdir(d):
        os.remove(os.path.join(d, old))
    for s in seeds:
        with open(os.path.join(d, hashlib.sha1(s).hexdigest()), "wb") as f:
            f.write(s)


HELLO = frame(1, b"wfjail\x01\x00")
ERR = json.dumps({"type": "ValueError", "message": "bad", "traceback": "Traceback ...\n"})
guest_streams = [
    HELLO + frame(5, b"\x14hello") + frame(6) + frame(3, b"42") + frame(5, b"\x14bye"),
    HELLO + frame(4, ERR),
    frame(4, ERR),
    HELLO + frame(3, b"1") + frame(3, b"2"),
    HELLO + frame(6) + frame(6) + frame(3, b'{"total": "20.03"}'),
    HELLO + frame(4, json.dumps({"type": "wfjail.Violation", "message": "network: socket(AF_INET) denied", "traceback": ""})),
    HELLO[:7],
    frame(1, b"wfjail\x02\x00"),
    struct.pack("<I", 0) + b"\x01",
    struct.pack("<I", 0xFFFFFFFF) + b"\x05",
    frame(9, b"x"),
    HELLO + frame(5, b"") ,
]
vectors = json.load(open(os.path.join(REPO, "docs", "protocol-vectors.json")))["vectors"]
vector_streams = [bytes.fromhex(v["hex"]) for v in vectors]

# frame_decoder: [wire+cap selector, chunk size] + stream
fd = []
for i, s in enumerate(guest_streams + vector_streams):
    fd.append(bytes([(63 << 2) | (i % 3), 1 + i % 7]) + s)
write("frame_decoder", fd)

# guest_conversation: [cap<<1 | again, chunk size] + what the guest wrote
write("guest_conversation", [bytes([0xFE | (i & 1), 3 + i]) + s for i, s in enumerate(guest_streams)])

# worker_wire: [chunk size] + frames from a worker
OPEN, CALL, CLOSE = 0x11, 0x12, 0x13
opens = [
    {"handler": "wf:handle"},
    {"handler": "wf:handle", "timeout": "500ms"},
    {"argv": ["/usr/bin/python3", "guest.py"], "timeout": "2m"},
    {"argv": [], "timeout": "1.5h"},
    {"handler": "wf:handle", "timeout": "0ms"},
    {"hander": "typo"},
]
ww = []
for i, o in enumerate(opens):
    ww.append(bytes([1 + i * 5]) + frame(OPEN, json.dumps(o)) + frame(CALL, b"req") + frame(CLOSE))
ww.append(b"\x04" + frame(0x21, '{"session":1,"mode":"zygote"}') + frame(0x22, b"r") + frame(0x25, "{}"))
ww.append(b"\x02" + frame(0x23, ERR) + frame(0x24, '{"status":"crashed"}'))
write("worker_wire", ww)

# zygote_control: one packet
READY, FORKED, EXITED = 0x32, 0x33, 0x34
write("zygote_control", [
    frame(READY, json.dumps({"pid": 7, "preloaded": ["wf"], "python": "3.11.2"})),
    frame(READY, json.dumps({"error": "ModuleNotFoundError: wf"})),
    frame(FORKED, json.dumps({"session": 3, "pid": 12})),
    frame(FORKED, json.dumps({"session": 3, "error": "fork: EAGAIN"})),
    frame(EXITED, json.dumps({"pid": 12, "status": 9, "cpu_ms": 1.5, "max_rss_kb": 9000})),
    frame(EXITED, json.dumps({"pid": -1, "status": 1 << 40, "cpu_ms": "x", "max_rss_kb": -3})),
    frame(EXITED, "[1, 2, 3]"),
])

# policy_text: the built-in policies and variations
pt = []
for name in sorted(os.listdir(os.path.join(REPO, "policies"))):
    pt.append(open(os.path.join(REPO, "policies", name), "rb").read())
pt += [
    b'extends = "temporal-python"\n[filesystem]\nread = ["/opt/{workflow}"]\nwrite = ["/tmp/x"]\n',
    b'extends = "strict"\non_violation = "kill"\n[limits]\nmemory = "512MiB"\ntimeout = "30s"\n',
    b'extends = "default"\n[syscalls]\nallow = ["getrandom"]\ndeny = ["socket"]\n',
    b'extends = "./other.toml"\n',
    b'extends = "defualt"\n',
    b'[network]\nmode = "none"\n[time]\nsleep = "deny"\n[random]\ngetrandom = "deny"\n',
    b'require = ["seccomp", "landlock"]\n[env]\nset = { A = "1" }\npass = ["HOME"]\n',
]
write("policy_text", pt)

# policy_chain: a.toml, sub/b.toml, c.toml separated by NUL (a missing text: a missing file)
def chain(*texts):
    return b"\0".join(t.encode() for t in texts)

write("policy_chain", [
    chain('extends = "sub/b.toml"\n[limits]\ntimeout = "5s"\n',
          'extends = "../c.toml"\n[filesystem]\nread = ["/opt/b"]\n',
          'extends = "strict"\n[filesystem]\nwrite = ["/tmp/c"]\n[limits]\nmemory = "256MiB"\n'),
    chain('extends = "sub/b.toml"\n', 'description = "b"\nextends = "../a.toml"\n', ""),
    chain('extends = "./a.toml"\n'),
    chain('description = "x"\nextends = "sub/b.toml"\n'),
    chain('extends = "sub/b.toml"\n', 'extends = "../c.toml"\n', 'extends = "sub/b.toml"\n'),
    chain('extends = "c.toml"\n[syscalls]\ndeny = ["getrandom"]\n', "",
          '[syscalls]\nallow = ["getrandom"]\n'),
    chain('extends = "c.toml"\n', "", 'extends = "temporal-python"\n[limits]\ntimeout = "30 sec"\n'),
    chain('extends = "sub/b.toml"\n[random]\ngetrandom = "deny"\n',
          '[filesystem]\nread = ["/dev"]\n'),
    chain('extends = "sub/../c.toml"\n', "", 'extends = "defualt"\n'),
])

# notification_decode: [policy | foreign<<2] nr:i32 args:6*u64 base:u64, then the memory image
BASE = 0x7F00_0000_0000
SYS = {"read": 0, "mmap": 9, "ioctl": 16, "nanosleep": 35, "socket": 41, "connect": 42,
       "sendto": 44, "bind": 49, "clone": 56, "execve": 59, "kill": 62, "fcntl": 72,
       "mount": 165, "clock_nanosleep": 230, "openat": 257, "memfd_create": 319, "openat2": 437}
AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10


def notif(nr, args=(), image=b"", sel=0, base=BASE):
    args = list(args) + [0] * (6 - len(args))
    return bytes([sel]) + struct.pack("<i6QQ", nr, *args, base) + image


def sockaddr_in(ip, port):
    return struct.pack("<H", AF_INET) + struct.pack(">H", port) + bytes(ip) + bytes(8)


def ptrs(*addrs):
    return b"".join(struct.pack("<Q", a) for a in addrs) + bytes(8)


AT_FDCWD = (1 << 64) - 100
CLONE_VM, CLONE_FS, CLONE_FILES, CLONE_SIGHAND, CLONE_THREAD, CLONE_NEWUSER = (
    0x100, 0x200, 0x400, 0x800, 0x10000, 0x10000000)
SIGCHLD = 17
argv_image = b"/bin/sh\0".ljust(0x40, b"\0") + ptrs(BASE, BASE + 0x80, BASE + 0x88)
argv_image = argv_image.ljust(0x80, b"\0") + b"-c\0\0\0\0\0\0id\0"
write("notification_decode", [
    notif(SYS["connect"], [3, BASE, 16], sockaddr_in([127, 0, 0, 1], 80)),
    notif(SYS["connect"], [3, BASE + 0x1000, 16], sockaddr_in([10, 0, 0, 1], 443)),
    notif(SYS["sendto"], [3, 0, 0, 0, BASE, 28],
          struct.pack("<H", AF_INET6) + struct.pack(">H", 53) + bytes(4) + bytes(15) + b"\x01" + bytes(4), sel=1),
    notif(SYS["bind"], [3, BASE, 12], struct.pack("<H", AF_UNIX) + b"\0abstract\0"),
    notif(SYS["openat"], [AT_FDCWD, BASE, 0], b"/etc/passwd\0"),
    notif(SYS["openat"], [AT_FDCWD, BASE + 0xFFD, 0x241], b"x" * 0xFFD + b"/tmp/out\0", sel=2),
    notif(SYS["openat2"], [AT_FDCWD, BASE, BASE + 0x20, 24], b"/home/u/.ssh/id\0".ljust(0x20, b"\0") + struct.pack("<3Q", 0x41, 0o600, 0)),
    notif(SYS["clone"], [CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD]),
    notif(SYS["clone"], [SIGCHLD], sel=1),
    notif(SYS["clone"], [CLONE_NEWUSER | SIGCHLD | (1 << 33)]),
    notif(SYS["ioctl"], [1, 0x5412, 0]),
    notif(SYS["ioctl"], [3, 0x40049409, 4]),
    notif(SYS["fcntl"], [5, 1031, 1 << 20]),
    notif(SYS["fcntl"], [5, 8, 1]),
    notif(SYS["execve"], [BASE, BASE + 0x40], argv_image, sel=1),
    notif(SYS["nanosleep"], [BASE], struct.pack("<qq", 1, 500_000_000), sel=1),
    notif(SYS["clock_nanosleep"], [1, 1, BASE], struct.pack("<qq", 10**9, 0), sel=1),
    notif(SYS["mount"], [BASE, BASE + 8], b"/dev/sd\0/mnt\0"),
    notif(SYS["memfd_create"], [BASE, 1], b"jit\x01\xff\0"),
    notif(SYS["socket"], [AF_INET, 0x80801]),
    notif(SYS["kill"], [1, 9], sel=3),
    notif(SYS["mmap"], [0, 1 << 20, 3, 0x21], sel=3),
    notif(SYS["connect"], [3, BASE, 16], sockaddr_in([1, 1, 1, 1], 53), sel=4),
    notif(0x4000_0000 | SYS["socket"], [AF_INET, 1]),
    notif(100_000, [1, 2, 3]),
    notif(SYS["openat"], [AT_FDCWD, (1 << 64) - 4], b"/ab\0", base=(1 << 64) - 4),
])
