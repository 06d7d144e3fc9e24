//! The copy matrix: for every ordered pair of devices, copies from a buffer of the source into one of the
//! destination by [`Stream::copy`] on the destination's stream, timed by its events, then checked once.
//!
//! Between two devices, [`Stream::copy`] enables peer access both ways on its first copy and goes direct where it
//! could, else stages the copy through pinned memory. The matrix enables it itself before a pair's first copy,
//! with the same condition, so that enabling is in no copy's time and the cell can say which way the copies went.
//! The library makes a staged copy's stream of the other device and its two pinned staging buffers of 4 MiB on the
//! first such copy and keeps them: the warm-up pays for them.
//!
//! [`Stream::copy`]: cuda_pinned::Stream::copy

use cuda_pinned::{Context, DeviceBuffer};

use super::measure::{Seeds, Unit};
use super::{Figure, PeerCopy, Route, Settings};
use crate::Outcome;
use crate::timing::{Plan, Stopwatch, fill_pattern, pattern_mismatch};

/// The copy matrix: every device's `source` into every device's `target`, on the destination's stream.
///
/// # Errors
/// The crate's, from filling the sources; the copies' own, and enabling peer access, are kept in their cells.
pub(super) fn matrix(
    units: &mut [Unit],
    settings: &Settings,
    seeds: &mut Seeds,
) -> Outcome<Vec<PeerCopy>> {
    let mut seeds_of = Vec::with_capacity(units.len());
    for unit in units.iter_mut() {
        let seed = seeds.next();
        fill_pattern(unit.host.as_mut_slice()?, seed);
        unit.stream.upload(&unit.host, &mut unit.source)?;
        seeds_of.push(seed);
    }
    for unit in units.iter() {
        unit.stream.synchronize()?;
    }
    let mut check = vec![0u8; settings.bytes];
    let mut cells = Vec::with_capacity(units.len() * units.len());
    for (src, &seed) in seeds_of.iter().enumerate() {
        for dst in 0..units.len() {
            let cell = if src == dst {
                eprintln!("pinbench devices: copies from device {src} to device {dst}");
                // The diagonal: the device's other buffer.
                let unit = &mut units[dst];
                PeerCopy {
                    src,
                    dst,
                    peer_access: None,
                    route: None,
                    result: copy_figure(
                        &unit.source,
                        &unit.watch,
                        &mut unit.target,
                        &settings.plan,
                        seed,
                        &mut check,
                    ),
                }
            } else {
                let (from, to) = pair(units, src, dst);
                let peer_access = can_access_peer(&from.context, &to.context);
                let (route, result) = match enable_peer_access(&from.context, &to.context) {
                    Ok(route) => {
                        eprintln!(
                            "pinbench devices: copies from device {src} to device {dst} ({})",
                            route.name()
                        );
                        let figure = copy_figure(
                            &from.source,
                            &to.watch,
                            &mut to.target,
                            &settings.plan,
                            seed,
                            &mut check,
                        );
                        (Some(route), figure)
                    }
                    Err(e) => (None, Err(e.to_string())),
                };
                PeerCopy {
                    src,
                    dst,
                    peer_access,
                    route,
                    result,
                }
            };
            cells.push(cell);
        }
    }
    Ok(cells)
}

/// Whether each of `a` and `b` can access the other's memory; `None` where the driver cannot say (enabling peer
/// access fails then too, and the cell keeps that error).
fn can_access_peer(a: &Context, b: &Context) -> Option<bool> {
    Some(a.can_access_peer(b).ok()? && b.can_access_peer(a).ok()?)
}

/// Enables peer access between `from` and `to`, both ways, as [`Stream::copy`] does on its first copy between two
/// contexts and with its condition (each way, in this order), so that the copies timed next go the way returned:
/// direct where both ways were enabled, else staged.
///
/// [`Stream::copy`]: cuda_pinned::Stream::copy
fn enable_peer_access(from: &Context, to: &Context) -> cuda_pinned::Result<Route> {
    Ok(
        if from.enable_peer_access(to)? && to.enable_peer_access(from)? {
            Route::Direct
        } else {
            Route::Staged
        },
    )
}

/// Times copies of `source` into `target` on `watch`'s stream (the destination's), then checks them: the
/// figure, or the error that stopped the copies (after which the stream is synchronized, so no copy is left
/// running).
fn copy_figure(
    source: &DeviceBuffer<u8>,
    watch: &Stopwatch,
    target: &mut DeviceBuffer<u8>,
    plan: &Plan,
    seed: u64,
    check: &mut [u8],
) -> Result<Figure, String> {
    let stream = watch.stream();
    let measured = watch
        .copies(plan, || Ok(stream.copy(source, target)?))
        .and_then(|timed| {
            stream.download_pageable(target, check)?;
            Ok(Figure {
                bytes: source.len(),
                timed,
                verified: pattern_mismatch(check, seed).is_none(),
            })
        });
    measured.map_err(|e| {
        let _ = stream.synchronize();
        e.to_string()
    })
}

/// `&units[a]` and `&mut units[b]` for `a != b`.
fn pair(units: &mut [Unit], a: usize, b: usize) -> (&Unit, &mut Unit) {
    if a < b {
        let (left, right) = units.split_at_mut(b);
        (&left[a], &mut right[0])
    } else {
        let (left, right) = units.split_at_mut(a);
        (&right[0], &mut left[b])
    }
}
