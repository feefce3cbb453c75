//! One line for a command-line misuse, shared by the binaries: clap's error
//! without its usage block or its help pointer, but with what it says is
//! missing or allowed (`[possible values: …]`, the arguments not given, a
//! similar argument's name), which clap puts on lines of their own.

/// `e` as one line (no `error: ` prefix).
pub(crate) fn one_line(e: &clap::Error) -> String {
    let text = e.to_string();
    let mut parts = Vec::new();
    for l in text.lines().map(str::trim) {
        if l.starts_with("Usage:") || l.starts_with("For more information") {
            break;
        }
        // A tip naming a similar argument or value is the hint a typo needs;
        // the others (how to pass a value starting with `-`) are noise here.
        if l.is_empty() || (l.starts_with("tip:") && !l.contains("similar")) {
            continue;
        }
        parts.push(l.trim_start_matches("error: "));
    }
    if parts.is_empty() {
        "invalid arguments".into()
    } else {
        parts.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use clap::{Arg, Command};

    use super::one_line;

    fn cmd() -> Command {
        Command::new("t")
            .arg(Arg::new("workload").required(true))
            .arg(
                Arg::new("policy")
                    .long("policy")
                    .value_parser(["hybrid", "greedy"]),
            )
    }

    #[test]
    fn what_is_missing_or_allowed_stays_on_the_line() {
        let e = cmd().try_get_matches_from(["t"]).unwrap_err();
        assert_eq!(
            one_line(&e),
            "the following required arguments were not provided: <workload>"
        );
        let e = cmd()
            .try_get_matches_from(["t", "w", "--policy", "cpu-only"])
            .unwrap_err();
        let line = one_line(&e);
        assert!(
            line.starts_with("invalid value 'cpu-only' for '--policy"),
            "{line}"
        );
        assert!(
            line.ends_with("[possible values: hybrid, greedy]"),
            "{line}"
        );
        let e = cmd()
            .try_get_matches_from(["t", "w", "--bogus"])
            .unwrap_err();
        assert_eq!(one_line(&e), "unexpected argument '--bogus' found");
        let e = cmd()
            .try_get_matches_from(["t", "w", "--polcy", "x"])
            .unwrap_err();
        let line = one_line(&e);
        assert!(
            line.contains("a similar argument exists: '--policy'"),
            "{line}"
        );
    }
}
