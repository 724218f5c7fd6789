//! Progress on standard error: a bar redrawn in place on a terminal, by
//! `indicatif` (which clears what a longer line drawn before leaves, so no
//! stale characters stay behind), and plain lines anywhere else, one each
//! time the progress moves on, so that logs and pipes get no carriage
//! returns and no escape sequences.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Width of the bar, in characters.
const BAR_WIDTH: usize = 30;

pub struct Progress {
    /// The bar, on a terminal.
    bar: Option<ProgressBar>,
    /// The last plain line printed, elsewhere: a line is printed only when
    /// it says something new.
    last: Option<String>,
}

impl Progress {
    /// Progress in percent, drawn as `{prefix} [bar] {percent}% {msg}`.
    pub fn new() -> Progress {
        Progress::with_terminal(std::io::stderr().is_terminal())
    }

    fn with_terminal(terminal: bool) -> Progress {
        let bar = terminal.then(|| {
            let bar = ProgressBar::with_draw_target(Some(100), ProgressDrawTarget::stderr());
            let template = format!("{{prefix}} [{{bar:{BAR_WIDTH}}}] {{percent:>3}}% {{msg}}");
            let style = ProgressStyle::with_template(&template)
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("#>-");
            bar.set_style(style);
            bar
        });
        Progress { bar, last: None }
    }

    /// Show `what` (the bar's prefix) at `percent` with `detail` after it.
    /// Off a terminal, `what: percent% steady` is printed when it differs
    /// from the last line (`detail` moves at every look — a rate, a time
    /// left — and is printed only with a new line's worth of progress).
    pub fn show(&mut self, what: &str, percent: u64, steady: &str, detail: &str) {
        match &self.bar {
            Some(bar) => {
                bar.set_prefix(what.to_string());
                bar.set_position(percent.min(100));
                bar.set_message(format!("{steady} {detail}").trim().to_string());
            }
            None => {
                let key = plain_line(what, percent, steady, "");
                if self.last.as_ref() != Some(&key) {
                    eprintln!("{}", plain_line(what, percent, steady, detail));
                    self.last = Some(key);
                }
            }
        }
    }

    /// Leave the last line drawn on the terminal, ended.
    pub fn finish(self) {
        if let Some(bar) = self.bar {
            bar.abandon();
        }
    }
}

/// `what: 45% steady detail`, as printed off a terminal.
pub fn plain_line(what: &str, percent: u64, steady: &str, detail: &str) -> String {
    let mut line = format!("{what}: {percent}%");
    for part in [steady, detail] {
        if !part.is_empty() {
            line.push(' ');
            line.push_str(part);
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_line_has_no_bar_and_no_control_characters() {
        let line = plain_line("job 3 evacuate", 45, "1G of 2G", "8M/s, 2m left (running)");
        assert_eq!(line, "job 3 evacuate: 45% 1G of 2G 8M/s, 2m left (running)");
        assert_eq!(plain_line("prep", 5, "", ""), "prep: 5%");
    }
}
