//! The zygote control channel (`serve::zygote::parse`): one SOCK_SEQPACKET packet from the
//! zygote (READY, FORKED, EXITED), then the fields the server reads from it.
//!
//! Checked: no panic; a packet is accepted only if its length prefix counts exactly the rest
//! of the packet; the field reads the server does (session, pid, status, cpu_ms, max_rss_kb,
//! error) never panic on any JSON.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wfjail::serve::zygote::parse;

fuzz_target!(|data: &[u8]| {
    let Some((kind, doc)) = parse(data) else {
        return;
    };
    let len = u32::from_le_bytes(data[..4].try_into().unwrap()) as usize;
    assert_eq!(len + 4, data.len());
    assert_eq!(kind, data[4]);
    // What read_control reads, for each kind.
    let _ = doc.get("error").is_none();
    let _ = doc["session"].as_u64().unwrap_or(u64::MAX);
    let _ = doc["pid"].as_i64().map(|p| p as i32);
    let _ = doc["error"].as_str().unwrap_or("fork failed");
    let _ = doc["status"].as_i64().map(|s| s as i32);
    let _ = doc["cpu_ms"].as_f64().unwrap_or(0.0);
    let _ = doc["max_rss_kb"].as_u64().unwrap_or(0);
});
