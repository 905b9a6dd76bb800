//! A progress bar (indicatif) on standard error while a query or a release reads its table: a fraction and an
//! estimate of the time left, never a count of rows or bytes (see `dpfusion::progress`). Drawn only on a terminal
//! and only for work that lasts more than about a second; elsewhere nothing is printed. It changes nothing else:
//! Ctrl-C cancels as before (the REPL returns to its prompt, one-shot commands end).

use dpfusion::session::DpSession;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressFinish, ProgressStyle};
use std::future::Future;
use std::io::IsTerminal;
use std::time::Duration;

/// Steps of the bar: the fraction in thousandths.
const STEPS: u64 = 1000;

/// Runs `work`, with a bar labelled `what` under way when it takes longer than a second on a terminal.
pub(crate) async fn with_progress<T>(s: &DpSession, what: &str, work: impl Future<Output = T>) -> T {
    if !std::io::stderr().is_terminal() {
        return work.await;
    }
    let progress = s.progress();
    // Cleared when the work is done, and when it is dropped (Ctrl-C in the REPL).
    let bar =
        ProgressBar::with_draw_target(Some(STEPS), ProgressDrawTarget::hidden()).with_finish(ProgressFinish::AndClear);
    let style = ProgressStyle::with_template("{prefix} [{bar:36}] {percent:>3}% · {elapsed} · about {eta} left")
        .map(|s| s.progress_chars("=> "));
    let (Ok(style), Ok(waiting)) = (style, ProgressStyle::with_template("{prefix} {spinner} {elapsed}")) else {
        return work.await; // the templates are constants: never, but no bar rather than a panic
    };
    bar.set_prefix(what.to_string());
    let show = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        bar.set_draw_target(ProgressDrawTarget::stderr());
        loop {
            match progress.fraction() {
                Some(f) => {
                    bar.set_style(style.clone());
                    bar.set_position((f * STEPS as f64) as u64);
                }
                None => {
                    bar.set_style(waiting.clone());
                    bar.tick();
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::select! {
        out = work => out,
        never = show => never,
    }
}
