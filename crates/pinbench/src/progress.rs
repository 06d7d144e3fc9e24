//! The progress bar on stderr: `\r[#####     ]  37% label`, redrawn in place. Drawn only where stderr is a
//! terminal or `--progress` asks for it, never on stdout (which may carry the JSON document).

use std::io::{IsTerminal, Write};

/// Width of the bar between the brackets.
const WIDTH: usize = 30;
/// Labels are cut or padded to this many characters, so each redraw covers the last.
const LABEL: usize = 44;

/// Progress through a run whose steps are weighted by their estimated duration.
pub struct Progress {
    enabled: bool,
    total: f64,
    done: f64,
}

impl Progress {
    /// A bar for `total` units of estimated work; drawn if `forced` or stderr is a terminal.
    pub fn new(forced: bool, total: f64) -> Progress {
        Progress {
            enabled: forced || std::io::stderr().is_terminal(),
            total: total.max(f64::MIN_POSITIVE),
            done: 0.0,
        }
    }

    /// Shows `label` as the step now running, with the work finished so far.
    pub fn show(&self, label: &str) {
        if self.enabled {
            let mut err = std::io::stderr().lock();
            // Progress is a courtesy: a closed stderr must not stop the run.
            let _ = write!(err, "\r{}", bar(self.done / self.total, label));
            let _ = err.flush();
        }
    }

    /// Counts `weight` units of work as finished.
    pub fn advance(&mut self, weight: f64) {
        self.done = (self.done + weight).min(self.total);
    }

    /// Removes the bar, leaving the terminal line empty.
    pub fn finish(&self) {
        if self.enabled {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r{}\r", " ".repeat(WIDTH + LABEL + 8));
            let _ = err.flush();
        }
    }
}

/// The bar's text for a fraction done (clamped to 0..=1) and a label.
pub fn bar(fraction: f64, label: &str) -> String {
    let fraction = if fraction.is_finite() {
        fraction.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let filled = (fraction * WIDTH as f64).round() as usize;
    let label: String = label.chars().take(LABEL).collect();
    format!(
        "[{}{}] {:>3}% {label:<LABEL$}",
        "#".repeat(filled),
        " ".repeat(WIDTH - filled),
        (fraction * 100.0).floor() as u32
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bar_fills_with_the_fraction() {
        let b = bar(0.37, "pinned upload 4 KiB");
        assert!(
            b.starts_with("[###########                   ]  37% pinned upload 4 KiB"),
            "{b}"
        );
        assert_eq!(bar(0.0, "x").matches('#').count(), 0);
        assert_eq!(bar(1.0, "x").matches('#').count(), WIDTH);
        assert_eq!(bar(7.0, "x"), bar(1.0, "x"));
        assert_eq!(bar(f64::NAN, "x"), bar(0.0, "x"));
    }

    #[test]
    fn every_redraw_has_the_same_width() {
        let long = "a".repeat(200);
        assert_eq!(
            bar(0.5, &long).chars().count(),
            bar(0.5, "").chars().count()
        );
    }
}
