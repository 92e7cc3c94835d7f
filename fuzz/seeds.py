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
