//! The zygote control channel (`serve::control::parse`): one SOCK_SEQPACKET packet from the
//! zygote (READY, FORKED, EXITED, SETTLED), parsed into its typed message or refused.
//!
//! Checked: no panic; a packet is accepted only if its length prefix counts exactly the rest
//! of the packet and its kind is one the zygote sends; an accepted message has the packet's
//! kind and parses back to itself from the packet it encodes to; a refusal names the frame's
//! kind exactly when the packet was a frame.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wfjail::serve::control::{EXITED, FORKED, READY, SETTLED, parse};

fuzz_target!(|data: &[u8]| {
    let framed = data.len() >= 5
        && u32::from_le_bytes(data[..4].try_into().unwrap()) as usize + 4 == data.len();
    match parse(data) {
        Ok(msg) => {
            assert!(framed);
            assert_eq!(msg.kind(), data[4]);
            assert!([READY, FORKED, EXITED, SETTLED].contains(&msg.kind()));
            let again = parse(&msg.to_packet()).expect("a message parses from its own packet");
            assert_eq!(again, msg);
        }
        Err(e) => assert_eq!(e.kind(), framed.then(|| data[4]), "{e}"),
    }
});
