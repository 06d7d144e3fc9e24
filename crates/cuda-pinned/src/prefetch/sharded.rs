//! A prefetcher for several devices: the batches of one stream of indices shared out among consumer streams
//! of different devices, each fed by a [`Prefetcher`] of its own (its workers, its copy stream on its device,
//! its slots), all of them taking their host batches from one pool, so under one budget.
//!
//! The pool's memory is portable (the crate's default), so one pool's buffers are the host side of uploads on
//! every device. A data-parallel loop runs one thread per device, each iterating its own prefetcher.

use std::sync::Arc;

use super::{Batch, FillError, Indices, Prefetcher, PrefetcherBuilder};
use crate::driver::Stream;
use crate::error::{Error, Result};
use crate::memory::PinnedPool;

/// Which feed a batch goes to, from its index.
type Shard = dyn Fn(usize) -> usize;

/// How to make the prefetchers of several devices: `Prefetcher::<B>::sharded(&pool, feeds).batches(n)
/// .build(fill)` (see [`Prefetcher::sharded`]).
#[must_use]
pub struct ShardedBuilder<B: Batch> {
    pool: PinnedPool,
    feeds: Vec<(Stream, B::Layout)>,
    workers: Option<usize>,
    depth: Option<usize>,
    ordered: bool,
    indices: Option<Indices>,
    shard: Option<Box<Shard>>,
}

impl<B: Batch> Prefetcher<B> {
    /// A builder of one prefetcher per feed, each a consumer stream (of any device) with the layout of its
    /// batches there (for a [`GatherBatch`](crate::prefetch::GatherBatch), a table read by a gatherer of that
    /// device), sharing out one stream of batch indices: in turn by position (batch positions 0, n, 2n, ... to
    /// the first feed of n), or by [`ShardedBuilder::shard_by`]. Every prefetcher takes its host batches
    /// from `pool`, so all of them stay within its budget. (The pool's blocks are placed on the NUMA node of
    /// its own device: on a host of several nodes, where each device's batches would best sit on its own
    /// node, build one prefetcher per device from a pool of that device instead.)
    ///
    /// ```no_run
    /// use cuda_pinned::{Context, Pinned, PinnedPool, Prefetcher, Stream};
    ///
    /// fn feed_two() -> cuda_pinned::Result<()> {
    ///     let devices = [Context::on(0)?, Context::on(1)?];
    ///     let pool = PinnedPool::new(&devices[0], 1 << 30); // one budget for both
    ///     let feeds = devices.iter().map(|c| Ok((Stream::new(c)?, 1 << 20))).collect::<cuda_pinned::Result<Vec<_>>>()?;
    ///     let prefetchers = Prefetcher::<Pinned<f32>>::sharded(&pool, feeds)
    ///         .batches(1000)
    ///         .build(|i, batch| {
    ///             batch.as_mut_slice()?.fill(i as f32);
    ///             Ok(())
    ///         })?;
    ///     std::thread::scope(|scope| {
    ///         for prefetcher in prefetchers {
    ///             // One thread per device: batches 0, 2, 4, ... on device 0 and 1, 3, 5, ... on device 1.
    ///             scope.spawn(move || -> cuda_pinned::Result<()> {
    ///                 for batch in prefetcher {
    ///                     let _ready = batch?; // on this device, ready on its consumer stream
    ///                 }
    ///                 Ok(())
    ///             });
    ///         }
    ///     });
    ///     Ok(())
    /// }
    /// ```
    pub fn sharded(
        pool: &PinnedPool,
        feeds: impl IntoIterator<Item = (Stream, B::Layout)>,
    ) -> ShardedBuilder<B> {
        ShardedBuilder {
            pool: pool.clone(),
            feeds: feeds.into_iter().collect(),
            workers: None,
            depth: None,
            ordered: true,
            indices: None,
            shard: None,
        }
    }
}

impl<B: Batch> ShardedBuilder<B> {
    /// Worker threads per feed ([`PrefetcherBuilder::workers`]).
    pub fn workers(mut self, workers: usize) -> ShardedBuilder<B> {
        self.workers = Some(workers);
        self
    }

    /// Slots per feed ([`PrefetcherBuilder::depth`]).
    pub fn depth(mut self, depth: usize) -> ShardedBuilder<B> {
        self.depth = Some(depth);
        self
    }

    /// Whether each feed's batches come out in their order (default), or as soon as each is uploaded.
    pub fn ordered(mut self, ordered: bool) -> ShardedBuilder<B> {
        self.ordered = ordered;
        self
    }

    /// The batches are `0..n`.
    pub fn batches(mut self, n: usize) -> ShardedBuilder<B> {
        self.indices = Some(Indices::Count(n));
        self
    }

    /// The batches are these indices, in this order. Collected when called.
    pub fn indices(mut self, indices: impl IntoIterator<Item = usize>) -> ShardedBuilder<B> {
        self.indices = Some(Indices::List(indices.into_iter().collect()));
        self
    }

    /// Sends batch `index` to feed `shard(index)` (an index into the feeds) rather than sharing the batches
    /// out in turn: to keep a batch on the device that holds its data, say. Called once per batch when the
    /// prefetchers are built, which then hold every batch's index (shared out in turn, `batches(n)` holds
    /// none, whatever `n`).
    pub fn shard_by(mut self, shard: impl Fn(usize) -> usize + 'static) -> ShardedBuilder<B> {
        self.shard = Some(Box::new(shard));
        self
    }

    /// Builds one prefetcher per feed, in the feeds' order, and starts their workers; each yields its share of
    /// the batches (in their order, when ordered). `fill` is shared by all of them.
    ///
    /// # Errors
    /// An invalid-argument error for no feeds, no batches, a shard function that names a feed that does not
    /// exist, or one given more than 2^32 batches to share out; then as [`PrefetcherBuilder::build`] for each feed (the prefetchers built before an error
    /// are dropped, which stops their workers).
    pub fn build<F>(self, fill: F) -> Result<Vec<Prefetcher<B>>>
    where
        F: Fn(usize, &mut B) -> std::result::Result<(), FillError> + Send + Sync + 'static,
    {
        let feeds = self.feeds.len();
        if feeds == 0 {
            return Err(Error::invalid(
                "a sharded prefetcher needs at least one feed",
            ));
        }
        let indices = self.indices.ok_or_else(|| {
            Error::invalid(
                "a prefetcher needs its batches: call `batches(n)` or `indices(...)` on the builder",
            )
        })?;
        let shares = share_out(&indices, feeds, self.shard.as_deref())?;
        let fill = Arc::new(fill);
        self.feeds
            .into_iter()
            .zip(shares)
            .map(|((consumer, layout), share)| {
                let fill = fill.clone();
                PrefetcherBuilder {
                    pool: self.pool.clone(),
                    consumer,
                    layout,
                    workers: self.workers,
                    depth: self.depth,
                    ordered: self.ordered,
                    indices: Some(share),
                    copy: None,
                }
                .build(move |index, batch: &mut B| fill(index, batch))
            })
            .collect()
    }
}

/// The batch indices of each of `feeds` (at least one) feeds, in the order of `indices`: by `shard` of each
/// index, else in turn by position. `0..n` shared out in turn is a stride per feed, held as such.
fn share_out(indices: &Indices, feeds: usize, shard: Option<&Shard>) -> Result<Vec<Indices>> {
    /// The most batches a shard function is asked about: each one's index is held.
    const MOST_SHARDED: usize = 1 << 32;
    match (indices, shard) {
        (&Indices::Count(n), None) => {
            return Ok((0..feeds)
                .map(|feed| Indices::Strided {
                    first: feed,
                    step: feeds,
                    len: n.saturating_sub(feed).div_ceil(feeds),
                })
                .collect());
        }
        (_, Some(_)) if indices.len() > MOST_SHARDED => {
            return Err(Error::invalid(format_args!(
                "a shard function asked about {} batches, which the prefetchers would each hold the index of; \
                 at most 2^32",
                indices.len()
            )));
        }
        _ => {}
    }
    let mut shares: Vec<Vec<usize>> = (0..feeds)
        .map(|_| Vec::with_capacity(indices.len() / feeds + 1))
        .collect();
    for position in 0..indices.len() {
        let index = indices.get(position);
        let feed = shard.map_or(position % feeds, |shard| shard(index));
        shares
            .get_mut(feed)
            .ok_or_else(|| {
                Error::invalid(format_args!(
                    "the shard function sends batch {index} to feed {feed}, of {feeds} feeds"
                ))
            })?
            .push(index);
    }
    Ok(shares
        .into_iter()
        .map(|share| Indices::List(share.into()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each feed's indices, listed.
    fn listed(shares: Vec<Indices>) -> Vec<Vec<usize>> {
        shares
            .iter()
            .map(|share| (0..share.len()).map(|p| share.get(p)).collect())
            .collect()
    }

    #[test]
    fn batches_are_shared_out_in_turn_or_by_the_function() {
        let count = Indices::Count(7);
        assert_eq!(
            listed(share_out(&count, 3, None).unwrap()),
            [vec![0, 3, 6], vec![1, 4], vec![2, 5]]
        );
        let list = Indices::List([9, 4, 7, 2].into());
        assert_eq!(
            listed(share_out(&list, 2, None).unwrap()),
            [vec![9, 7], vec![4, 2]]
        );
        let parity = |index: usize| index % 2;
        assert_eq!(
            listed(share_out(&list, 2, Some(&parity)).unwrap()),
            [vec![4, 2], vec![9, 7]]
        );
        // More feeds than batches: the last ones get none.
        assert_eq!(
            listed(share_out(&Indices::Count(1), 3, None).unwrap()),
            [vec![0], vec![], vec![]]
        );
        let beyond = |index: usize| index;
        let error = share_out(&list, 2, Some(&beyond)).unwrap_err().to_string();
        assert!(
            error.contains("sends batch 9 to feed 9, of 2 feeds"),
            "{error}"
        );
    }

    /// `batches(usize::MAX)` shared out in turn holds nothing per batch (it overflowed a capacity), and every
    /// batch goes to exactly one feed, up to the last index.
    #[test]
    fn any_count_is_shared_out_without_holding_its_indices() {
        for feeds in [1, 2, 3, 7] {
            let shares = share_out(&Indices::Count(usize::MAX), feeds, None).unwrap();
            let total: u128 = shares.iter().map(|s| s.len() as u128).sum();
            assert_eq!(total, usize::MAX as u128, "{feeds} feeds");
            for (feed, share) in shares.iter().enumerate() {
                assert!(matches!(share, Indices::Strided { .. }));
                assert_eq!(share.get(0), feed);
                assert_eq!(share.get(share.len() - 1) % feeds, feed);
                assert!(share.get(share.len() - 1) >= usize::MAX - feeds);
            }
        }
        let parity = |index: usize| index % 2;
        let error = share_out(&Indices::Count(usize::MAX), 2, Some(&parity))
            .unwrap_err()
            .to_string();
        assert!(error.contains("at most 2^32"), "{error}");
    }
}
