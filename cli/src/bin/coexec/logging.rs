//! The command's log: `tracing` events on stderr, one line each, through
//! a writer that nothing logged can break.

use std::io::Write;

/// Logs `tracing` events to stderr: level `warn` unless `RUST_LOG` says
/// otherwise, colours only where a terminal reads them.
pub(crate) fn init() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
    // Colour codes only where a terminal will read them.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(move || LossyStderr { ansi })
        .log_internal_errors(false)
        .with_target(false)
        .with_ansi(ansi)
        .init();
}

/// The logger's stderr: a failed write is dropped, so that nothing logged
/// can end the process or a thread (a log reader gone away: EPIPE).
struct LossyStderr {
    /// Colour codes are the formatter's own (terminals only): kept.
    ansi: bool,
}

impl Write for LossyStderr {
    /// Writes one event (the formatter writes each in one call), its line
    /// breaks and control characters escaped but the last: a name read from
    /// a file (a profile's kernel, a model's path) cannot forge a log line.
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(&one_line(buf, self.ansi));
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// `event` with every control character but tab (and ESC where colours
/// are on) escaped, `\n` for a line break and `\xNN` for the others, save
/// one final line break.
fn one_line(event: &[u8], ansi: bool) -> std::borrow::Cow<'_, [u8]> {
    let body = event.strip_suffix(b"\n").unwrap_or(event);
    let unsafe_byte = |b: u8| (b < 0x20 && b != b'\t' && !(ansi && b == 0x1b)) || b == 0x7f;
    if !body.iter().copied().any(unsafe_byte) {
        return event.into();
    }
    let mut out = Vec::with_capacity(event.len() + 16);
    for &b in body {
        match b {
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b if unsafe_byte(b) => out.extend_from_slice(format!("\\x{b:02x}").as_bytes()),
            b => out.push(b),
        }
    }
    if body.len() < event.len() {
        out.push(b'\n');
    }
    out.into()
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn an_event_stays_one_line() {
        assert_eq!(&*one_line(b"plain\n", false), b"plain\n");
        assert_eq!(
            &*one_line(b"a\nWARN forged\r\x07\n", false),
            b"a\\nWARN forged\\r\\x07\n"
        );
        assert_eq!(
            &*one_line(b"\x1b[33mWARN\x1b[0m\n", true),
            b"\x1b[33mWARN\x1b[0m\n"
        );
        assert_eq!(&*one_line(b"\x1b[2J", false), b"\\x1b[2J");
        assert_eq!(&*one_line(b"tab\there\n", false), b"tab\there\n");
    }
}
