//! The time ledger: device time spent on transfers, kept apart from time spent in kernels.
//!
//! A [`Ledger`] is opt-in per stream ([`Stream::with_ledger`]). On such a stream every copy and every kernel
//! launched through the crate (and any work wrapped in [`Stream::profile`]) is bracketed by two timing events;
//! [`Ledger::report`] then gives, per category (upload, download, device copy, kernel, and each named kernel),
//! the count, bytes, device time, achieved GB/s and share of the wall time, and how much of the transfer time was
//! hidden under kernels running at the same time. On a stream without a ledger nothing is recorded: the cost is
//! one branch per operation.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

pub use crate::driver::Category;
use crate::driver::stream::WorkObserver;
use crate::driver::{Context, Event, Stream};
use crate::error::Result;
use crate::units::Bytes;

/// One timed piece of work.
struct Entry {
    category: Category,
    name: &'static str,
    bytes: usize,
    start: Event,
    end: Event,
}

/// A record of timed device work, shared by the streams that write to it. Cheap to clone.
#[derive(Clone, Default)]
pub struct Ledger(Arc<Mutex<Vec<Entry>>>);

impl fmt::Debug for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Ledger({} entries)", self.lock().len())
    }
}

impl Ledger {
    /// An empty ledger.
    #[must_use]
    pub fn new() -> Ledger {
        Ledger::default()
    }

    /// Forgets every entry.
    pub fn clear(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Entry>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for the recorded work to complete and sums it up.
    ///
    /// # Errors
    /// The driver's, from waiting for or timing the events.
    pub fn report(&self) -> Result<LedgerReport> {
        let entries = self.lock();
        let Some(first) = entries.first() else {
            return Ok(LedgerReport::default());
        };
        // Every event's place on one device timeline, in seconds after the earliest start.
        let origin = &first.start;
        let mut spans = Vec::with_capacity(entries.len());
        for e in entries.iter() {
            e.end.synchronize()?;
            let start = signed_seconds(&e.start, origin)?;
            let end = signed_seconds(&e.end, origin)?;
            spans.push((start, end.max(start)));
        }
        let begin = spans.iter().map(|s| s.0).fold(f64::INFINITY, f64::min);
        let finish = spans.iter().map(|s| s.1).fold(f64::NEG_INFINITY, f64::max);
        let wall = (finish - begin).max(0.0);
        let kernels = union(
            spans
                .iter()
                .zip(entries.iter())
                .filter(|(_, e)| !e.category.is_transfer())
                .map(|(s, _)| *s),
        );
        let mut rows: BTreeMap<(Category, &'static str), LedgerRow> = BTreeMap::new();
        let (mut transfer, mut hidden) = (0.0, 0.0);
        for (&(start, end), e) in spans.iter().zip(entries.iter()) {
            let seconds = end - start;
            let mut add = |name: &'static str| {
                let row = rows.entry((e.category, name)).or_insert_with(|| LedgerRow {
                    category: e.category,
                    name,
                    ..LedgerRow::default()
                });
                row.count += 1;
                row.bytes += e.bytes;
                row.seconds += seconds;
            };
            add("");
            if !e.name.is_empty() {
                add(e.name);
            }
            if e.category.is_transfer() {
                transfer += seconds;
                hidden += overlap(start, end, &kernels);
            }
        }
        let mut rows: Vec<LedgerRow> = rows.into_values().collect();
        for row in &mut rows {
            row.share_of_wall = if wall > 0.0 { row.seconds / wall } else { 0.0 };
        }
        Ok(LedgerReport {
            rows,
            wall: Duration::from_secs_f64(wall),
            transfer: Duration::from_secs_f64(transfer),
            hidden_transfer: Duration::from_secs_f64(hidden.min(transfer)),
        })
    }

    fn push(&self, entry: Entry) {
        self.lock().push(entry);
    }
}

/// A stream made [`Stream::with_ledger`] brackets each piece of the crate's work with two timing events, and the
/// ledger keeps them.
impl WorkObserver for Ledger {
    fn begin(&self, stream: &Stream) -> Result<Event> {
        let start = Event::new(stream.context())?;
        start.record(stream)?;
        Ok(start)
    }

    fn end(
        &self,
        stream: &Stream,
        start: Event,
        category: Category,
        name: &'static str,
        bytes: usize,
    ) -> Result<()> {
        let end = Event::new(stream.context())?;
        end.record(stream)?;
        self.push(Entry {
            category,
            name,
            bytes,
            start,
            end,
        });
        Ok(())
    }
}

/// `event`'s time after `origin` in seconds, negative if it came first.
fn signed_seconds(event: &Event, origin: &Event) -> Result<f64> {
    // elapsed_since refuses negative spans by clamping; time both ways to place events before the origin.
    let after = event.elapsed_since(origin)?.as_secs_f64();
    if after > 0.0 {
        return Ok(after);
    }
    Ok(-origin.elapsed_since(event)?.as_secs_f64())
}

/// The union of `spans` as sorted, disjoint intervals.
fn union(spans: impl Iterator<Item = (f64, f64)>) -> Vec<(f64, f64)> {
    let mut spans: Vec<(f64, f64)> = spans.collect();
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut merged: Vec<(f64, f64)> = Vec::with_capacity(spans.len());
    for (start, end) in spans {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

/// How long `[start, end]` overlaps the disjoint intervals `union`.
fn overlap(start: f64, end: f64, union: &[(f64, f64)]) -> f64 {
    union
        .iter()
        .map(|&(a, b)| (end.min(b) - start.max(a)).max(0.0))
        .sum()
}

/// One line of a [`LedgerReport`]: a category as a whole (empty `name`) or one named kind of work in it.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct LedgerRow {
    /// What the work was.
    pub category: Category,
    /// The kernel's (or the wrapped work's) name; empty for the category as a whole.
    pub name: &'static str,
    /// How many operations.
    pub count: usize,
    /// Bytes moved (or the bytes the kernels were given).
    pub bytes: usize,
    /// Device time, in seconds: the sum over the operations.
    pub seconds: f64,
    /// `seconds` over the report's wall time (work on several streams can add up to more than 1).
    pub share_of_wall: f64,
}

impl LedgerRow {
    /// Decimal GB/s, for transfers.
    #[must_use]
    pub fn gb_per_s(&self) -> Option<f64> {
        (self.category.is_transfer() && self.seconds > 0.0)
            .then(|| self.bytes as f64 / self.seconds / 1e9)
    }
}

/// What a [`Ledger`] recorded, summed up.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct LedgerReport {
    /// One row per category, then per named kind of work in it.
    pub rows: Vec<LedgerRow>,
    /// From the first recorded start to the last recorded end, on the device.
    pub wall: Duration,
    /// Device time of all transfers together.
    pub transfer: Duration,
    /// The part of `transfer` during which a kernel recorded in the same ledger was running.
    pub hidden_transfer: Duration,
}

impl LedgerReport {
    /// The row of a category as a whole.
    #[must_use]
    pub fn category(&self, category: Category) -> Option<&LedgerRow> {
        self.rows
            .iter()
            .find(|r| r.category == category && r.name.is_empty())
    }

    /// The row of one named kind of work.
    #[must_use]
    pub fn named(&self, name: &str) -> Option<&LedgerRow> {
        self.rows
            .iter()
            .find(|r| !r.name.is_empty() && r.name == name)
    }
}

impl fmt::Display for LedgerReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<26} {:>7} {:>12} {:>12} {:>8} {:>8}",
            "", "count", "bytes", "device ms", "GB/s", "of wall"
        )?;
        for row in &self.rows {
            let label = if row.name.is_empty() {
                row.category.label().to_string()
            } else {
                format!("  {}", row.name)
            };
            let gb = row
                .gb_per_s()
                .map_or_else(String::new, |g| format!("{g:.2}"));
            writeln!(
                f,
                "{label:<26} {:>7} {:>12} {:>12.3} {gb:>8} {:>7.1}%",
                row.count,
                Bytes(row.bytes).to_string(),
                row.seconds * 1e3,
                row.share_of_wall * 100.0
            )?;
        }
        let hidden = if self.transfer.is_zero() {
            0.0
        } else {
            self.hidden_transfer.as_secs_f64() / self.transfer.as_secs_f64() * 100.0
        };
        write!(
            f,
            "wall {:.3} ms; transfers {:.3} ms, of which {:.3} ms ({hidden:.1}%) hidden under kernels",
            self.wall.as_secs_f64() * 1e3,
            self.transfer.as_secs_f64() * 1e3,
            self.hidden_transfer.as_secs_f64() * 1e3
        )
    }
}

impl Stream {
    /// A new non-blocking stream of default priority whose copies and kernels are timed in `ledger` (see
    /// [`crate::profile`]).
    ///
    /// # Errors
    /// The driver's.
    pub fn with_ledger(context: &Context, ledger: &Ledger) -> Result<Stream> {
        Stream::with_observer(context, Box::new(ledger.clone()))
    }

    /// The ledger this stream's work is timed in, if any.
    #[must_use]
    pub fn ledger(&self) -> Option<&Ledger> {
        let observer: &dyn Any = self.observer()?;
        observer.downcast_ref()
    }

    /// Runs `work`, which enqueues device work on this stream, between two timing events recorded in the
    /// stream's ledger as a kernel named `name` (with `bytes` as its size). Without a ledger, just runs `work`.
    /// Use it for your own kernels, so that the report counts them. The crate's own launchers inside `work` are
    /// recorded too, so the kernel category then counts that time twice.
    ///
    /// Work enqueued inside `work` (through the stream's raw handle: your kernels, another library's calls) is
    /// known to the crate as work on the stream: waits for the crate's buffers used on this stream before it
    /// never wait for it.
    ///
    /// No lock of the crate is held while `work` runs: it may call any of the crate's functions, on this stream or
    /// others, and may wait for other threads that do. Work other threads enqueue on this stream meanwhile falls
    /// inside the timed span, and [`crate::Graph::capture`] of this stream is refused until `work` returns.
    ///
    /// # Errors
    /// `work`'s error, or the driver's from recording the events.
    pub fn profile<R>(
        &self,
        name: &'static str,
        bytes: usize,
        work: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        self.untracked(|| self.timed(Category::Kernel, name, bytes, work))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn union_merges_overlapping_spans_and_overlap_measures_the_shared_part() {
        let u = union([(0.0, 1.0), (2.0, 3.0), (0.5, 1.5), (5.0, 6.0)].into_iter());
        assert_eq!(u, vec![(0.0, 1.5), (2.0, 3.0), (5.0, 6.0)]);
        assert_eq!(overlap(1.0, 2.5, &u), 0.5 + 0.5);
        assert_eq!(overlap(3.5, 4.5, &u), 0.0);
        assert_eq!(overlap(-1.0, 10.0, &u), 1.5 + 1.0 + 1.0);
        assert!(union(std::iter::empty()).is_empty());
    }

    #[test]
    fn an_empty_ledger_reports_nothing() {
        let report = Ledger::new().report().unwrap();
        assert!(
            report.rows.is_empty() && report.wall.is_zero() && report.hidden_transfer.is_zero()
        );
        assert!(report.to_string().contains("wall 0.000 ms"));
    }
}
