//! Loading a checkpoint PyTorch wrote (a safetensors file, or the index of a sharded one) onto the device with
//! `cuda-pinned`, and checking every tensor's bytes on the device against the file, as parsed on the host by
//! the `safetensors` crate on its own.

use std::path::Path;

use cuda_pinned::load::Checkpoint;
use cuda_pinned::{Context, PinnedPool, Stream};
use safetensors::SafeTensors;

/// What [`load_and_check`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checked {
    /// Tensors whose bytes on the device equal the file's.
    pub tensors: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Whether the reads bypassed the page cache (of the first file).
    pub direct: bool,
}

/// Loads the checkpoint at `path` onto device `ordinal` and compares every tensor with the file.
///
/// # Errors
/// The crate's, as text, or which tensor differs from the file.
pub fn load_and_check(path: &Path, ordinal: usize) -> Result<Checked, String> {
    let context = Context::on(ordinal).map_err(|e| e.to_string())?;
    let stream = Stream::new(&context).map_err(|e| e.to_string())?;
    let pool = PinnedPool::new(&context, 64 << 20);
    let checkpoint = Checkpoint::open(path).map_err(|e| e.to_string())?;
    let loaded = checkpoint.load(&stream, &pool).map_err(|e| e.to_string())?;
    let mut checked = Checked {
        tensors: 0,
        bytes: 0,
        direct: loaded.shards().first().is_some_and(|s| s.report().direct),
    };
    for file in checkpoint.files() {
        let bytes = std::fs::read(file.path()).map_err(|e| e.to_string())?;
        let host = SafeTensors::deserialize(&bytes).map_err(|e| e.to_string())?;
        for (name, want) in host.tensors() {
            let view = loaded
                .get(&name)
                .ok_or_else(|| format!("{name}: not loaded"))?;
            let mut got = vec![0u8; view.len()];
            stream
                .download_pageable(&view, &mut got)
                .map_err(|e| e.to_string())?;
            if got != want.data() {
                return Err(format!("{name}: the device's bytes differ from the file's"));
            }
            let info = file
                .tensor(&name)
                .ok_or_else(|| format!("{name}: no header entry"))?;
            if info.shape() != want.shape() || info.dtype() != want.dtype() {
                return Err(format!("{name}: shape or dtype differ from the file's"));
            }
            checked.tensors += 1;
            checked.bytes += got.len() as u64;
        }
    }
    Ok(checked)
}
