//! Progress display on stderr, for a person watching: off with `--quiet` and whenever stdout or
//! stderr is not a terminal, so pipes, redirected output, logs and tests see only the results.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::Duration;

pub fn enabled(quiet: bool) -> bool {
    !quiet && std::io::stdout().is_terminal() && std::io::stderr().is_terminal()
}

fn hidden_unless(quiet: bool, bar: ProgressBar) -> ProgressBar {
    if !enabled(quiet) {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar
}

/// A spinner for work of unknown length (loading, gating backends, warm-up).
pub fn spinner(quiet: bool, msg: String) -> ProgressBar {
    let bar = hidden_unless(quiet, ProgressBar::new_spinner());
    bar.set_style(ProgressStyle::with_template("{spinner} {msg} {elapsed}").expect("template"));
    bar.set_message(msg);
    if enabled(quiet) {
        bar.enable_steady_tick(Duration::from_millis(100));
    }
    bar
}

/// A bar over `len` steps with a free-form message (e.g. the running estimate).
pub fn bar(quiet: bool, len: u64, unit: &str) -> ProgressBar {
    let bar = hidden_unless(quiet, ProgressBar::new(len));
    let tmpl = format!("{{bar:30}} {{pos}}/{{len}} {unit} {{elapsed}}<{{eta}} {{msg}}");
    bar.set_style(ProgressStyle::with_template(&tmpl).expect("template"));
    bar
}
