//! Guest text on wfjail's stderr: escaped so that a guest cannot move the cursor or print a
//! line that looks like one of wfjail's, and echoed line by line behind a prefix with a
//! bounded buffer. A leaf: the report (its one-line summaries), the supervisor and the
//! `serve` sessions all use it.

/// What starts every line of guest text echoed on wfjail's stderr. wfjail's own lines start
/// with `wfjail: `, so a guest cannot print one of them (docs/security.md).
pub const GUEST_PREFIX: &str = "[guest] ";
/// The longest guest line echoed as one line; a longer one is cut into several, so a guest
/// that never writes a newline does not grow the buffer.
pub const MAX_ECHO_LINE: usize = 4096;

/// Guest text made safe for a terminal: invalid UTF-8 replaced, and control characters
/// (C0 except tab, DEL, C1) written as `\xNN` so that the guest cannot move the cursor,
/// erase a line or start a new one.
pub fn escape_guest_text(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if (c.is_control() && c != '\t') || c == '\u{7f}' {
            out.push_str(&format!("\\x{:02x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// Guest output echoed line by line, each line behind a prefix and escaped
/// ([`escape_guest_text`]); at most [`MAX_ECHO_LINE`] bytes are held.
#[derive(Debug)]
pub struct LineEcho {
    prefix: String,
    buf: Vec<u8>,
}

impl LineEcho {
    pub fn new(prefix: impl Into<String>) -> Self {
        LineEcho {
            prefix: prefix.into(),
            buf: Vec::new(),
        }
    }

    /// The lines `data` completes, rendered (prefix, escaped text, newline), ready to write.
    pub fn feed(&mut self, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for piece in data.split_inclusive(|&b| b == b'\n') {
            let (body, ends) = match piece.split_last() {
                Some((b'\n', body)) => (body, true),
                _ => (piece, false),
            };
            let mut body = body;
            while self.buf.len() + body.len() >= MAX_ECHO_LINE {
                let take = MAX_ECHO_LINE - self.buf.len();
                self.buf.extend_from_slice(&body[..take]);
                body = &body[take..];
                self.render(&mut out);
            }
            self.buf.extend_from_slice(body);
            if ends {
                self.render(&mut out);
            }
        }
        out
    }

    /// A last line without its newline, rendered.
    pub fn finish(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        if !self.buf.is_empty() {
            self.render(&mut out);
        }
        out
    }

    fn render(&mut self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.prefix.as_bytes());
        out.extend_from_slice(escape_guest_text(&self.buf).as_bytes());
        out.push(b'\n');
        self.buf.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_lines_are_prefixed_escaped_and_bounded() {
        let mut e = LineEcho::new("[g] ");
        let out = e.feed(b"wfjail: ok\n\x1b[2Kx\ty\r\x7f\xc2\x9b\npartial");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "[g] wfjail: ok\n[g] \\x1b[2Kx\ty\\x0d\\x7f\\x9b\n"
        );
        assert_eq!(e.finish(), b"[g] partial\n");
        let out = e.feed(&vec![b'a'; 3 * MAX_ECHO_LINE]);
        assert_eq!(out.len(), 3 * (4 + MAX_ECHO_LINE + 1));
        assert!(e.buf.is_empty());
    }
}
