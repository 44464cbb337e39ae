//! Output conventions shared by every command (cli.md): the product on stdout, one
//! `error:` line on stderr and exit 1 on failure, a closed stdout pipe is not an error.

use std::io::{self, Write};
use std::process::ExitCode;

/// Buffered stdout for a command's product.
pub fn stdout() -> io::BufWriter<io::StdoutLock<'static>> {
    io::BufWriter::with_capacity(1 << 16, io::stdout().lock())
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<io::Error>())
        .any(|io| io.kind() == io::ErrorKind::BrokenPipe)
}

/// Turns a command's result into the process exit status.
pub fn finish(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`llamay dump ... | head`): nothing left to report.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(io::stderr(), "error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, each cause once: an error whose message
/// already quotes its source (thiserror's `"{path}: {source}"`) is not followed by that
/// source again.
pub fn one_line(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in e.chain() {
        let text = cause.to_string().replace('\n', " ");
        if msg.contains(&text) {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(": ");
        }
        msg.push_str(&text);
    }
    msg
}

/// Help and version go to stdout with status 0; a usage error is one `error:` line and
/// status 1 (clap's own convention is 2, the contract says 1).
pub fn report_clap_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            ExitCode::SUCCESS
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = writeln!(io::stderr(), "error: no command given (see llamay --help)");
            ExitCode::FAILURE
        }
        _ => {
            // clap's message spans lines (missing arguments follow on lines of their
            // own, then usage); keep the message, drop the usage, join into one line.
            let rendered = e.render().to_string();
            let message: Vec<&str> = rendered
                .lines()
                .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with("tip:"))
                .collect();
            let message = message.join(" ");
            let message = message.strip_prefix("error: ").unwrap_or(&message);
            let _ = writeln!(io::stderr(), "error: {message} (see llamay --help)");
            ExitCode::FAILURE
        }
    }
}
