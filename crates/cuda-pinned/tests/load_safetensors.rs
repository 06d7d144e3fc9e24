//! Loading safetensors checkpoints (feature `safetensors`): files written by the `safetensors` crate, loaded
//! whole, in part, sharded and awaited, every tensor's bytes checked against the file; files that lie or are
//! cut are errors naming the file and the byte.

#![cfg(feature = "safetensors")]

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use common::{data_bytes, serial};
use cuda_pinned::load::{Checkpoint, Dtype, SafeTensorsFile};
use cuda_pinned::{Error, Io, LoadOptions, PinnedPool, Stream};
use safetensors::tensor::TensorView;

/// A directory of its own in the temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir =
            std::env::temp_dir().join(format!("cuda-pinned-st-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Tensors of several dtypes and shapes (a scalar, an empty one, one of a few MiB), fresh bytes for `seed`.
fn tensors(seed: u64) -> Vec<(String, Dtype, Vec<usize>, Vec<u8>)> {
    let shapes: [(&str, Dtype, Vec<usize>, usize); 7] = [
        ("embed.weight", Dtype::BF16, vec![512, 1024], 2),
        ("layer.0.bias", Dtype::F32, vec![1000], 4),
        ("layer.0.scale", Dtype::F64, vec![], 8),
        ("layer.1.mask", Dtype::BOOL, vec![3, 7], 1),
        ("empty", Dtype::F16, vec![0, 4], 2),
        ("ids", Dtype::I64, vec![17], 8),
        ("odd", Dtype::U8, vec![4099], 1),
    ];
    shapes
        .into_iter()
        .enumerate()
        .map(|(i, (name, dtype, shape, size))| {
            let len = shape.iter().product::<usize>() * size;
            let mut bytes = data_bytes(len, seed * 100 + i as u64);
            if dtype == Dtype::BOOL {
                bytes.iter_mut().for_each(|b| *b &= 1);
            }
            (name.to_owned(), dtype, shape, bytes)
        })
        .collect()
}

fn write(path: &Path, tensors: &[(String, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            (
                name.clone(),
                TensorView::new(*dtype, shape.clone(), bytes).unwrap(),
            )
        })
        .collect();
    let metadata = Some(HashMap::from([("format".to_owned(), "pt".to_owned())]));
    safetensors::serialize_to_file(views, metadata, path).unwrap();
}

fn device_bytes(stream: &Stream, view: &cuda_pinned::DeviceView<'_, u8>) -> Vec<u8> {
    let mut out = vec![0u8; view.len()];
    stream.download_pageable(view, &mut out).unwrap();
    out
}

#[test]
fn every_tensor_arrives_whole_every_way_the_file_can_be_read() {
    let _serial = serial();
    let ctx = common::device(0);
    let stream = Stream::new(&ctx).unwrap();
    let pool = PinnedPool::new(&ctx, 64 << 20);
    let dir = TempDir::new("whole");
    let path = dir.0.join("model.safetensors");
    let want = tensors(1);
    write(&path, &want);
    let file = SafeTensorsFile::open(&path).unwrap();
    assert_eq!(file.tensors().len(), want.len());
    assert_eq!(file.metadata().unwrap()["format"], "pt");
    let small = LoadOptions::default()
        .slot_bytes(64 << 10)
        .readers(3)
        .buffered_readers(3);
    for options in [LoadOptions::default(), small] {
        for io in [Io::Auto, Io::Direct, Io::Buffered] {
            let loaded = file
                .load_with(&stream, &pool, options.io(io), None)
                .unwrap();
            assert_eq!(loaded.len(), want.len());
            for (name, dtype, shape, bytes) in &want {
                let info = loaded.info(name).unwrap();
                assert_eq!((info.dtype(), info.shape()), (*dtype, &shape[..]), "{name}");
                let got = device_bytes(&stream, &loaded.get(name).unwrap());
                assert!(got == *bytes, "{name}: {options:?} {io:?}");
            }
        }
    }
}

#[test]
fn a_chosen_set_is_packed_aligned_and_nothing_else_is_loaded() {
    let _serial = serial();
    let ctx = common::device(0);
    let stream = Stream::new(&ctx).unwrap();
    let pool = PinnedPool::new(&ctx, 64 << 20);
    let dir = TempDir::new("some");
    let path = dir.0.join("model.safetensors");
    let want = tensors(2);
    write(&path, &want);
    let file = SafeTensorsFile::open(&path).unwrap();
    let chosen = ["odd", "layer.0.bias", "ids"];
    let loaded = file.load_only(&stream, &pool, &chosen).unwrap();
    assert_eq!(loaded.len(), 3);
    assert!(loaded.get("embed.weight").is_none());
    for (name, _, _, bytes) in want.iter().filter(|t| chosen.contains(&t.0.as_str())) {
        assert_eq!(loaded.range(name).unwrap().start % 256, 0, "{name}");
        assert!(
            device_bytes(&stream, &loaded.get(name).unwrap()) == *bytes,
            "{name}"
        );
    }
    let total: usize = chosen.iter().map(|n| loaded.range(n).unwrap().len()).sum();
    assert!(loaded.buffer().len() < total + 3 * 256);
    let e = file
        .load_only(&stream, &pool, &["odd", "nope"])
        .unwrap_err();
    assert!(e.to_string().contains("no tensor called \"nope\""), "{e}");
}

/// Writes `want` as two files and an index; returns the index's path.
fn sharded(dir: &Path, want: &[(String, Dtype, Vec<usize>, Vec<u8>)]) -> PathBuf {
    let (first, second) = want.split_at(want.len() / 2);
    let mut map = serde_json::Map::new();
    for (file, part) in [
        ("model-00001-of-00002.safetensors", first),
        ("model-00002-of-00002.safetensors", second),
    ] {
        write(&dir.join(file), part);
        for (name, ..) in part {
            map.insert(name.clone(), file.into());
        }
    }
    let index = dir.join("model.safetensors.index.json");
    let json = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(&index, json.to_string()).unwrap();
    index
}

#[test]
fn a_sharded_checkpoint_loads_every_file_blocking_and_awaited() {
    let _serial = serial();
    let ctx = common::device(0);
    let stream = Stream::new(&ctx).unwrap();
    let pool = PinnedPool::new(&ctx, 64 << 20);
    let dir = TempDir::new("sharded");
    let want = tensors(3);
    let index = sharded(&dir.0, &want);
    let checkpoint = Checkpoint::open(&index).unwrap();
    assert_eq!(checkpoint.files().len(), 2);
    // Options that cannot work are refused here too.
    let none = LoadOptions::default().buffered_readers(0);
    let e = checkpoint.files()[0]
        .load_with(&stream, &pool, none, None)
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .unwrap();
    let blocking = checkpoint.load(&stream, &pool).unwrap();
    let awaited = runtime
        .block_on(checkpoint.load_async(&stream, &pool, LoadOptions::default().readers(2)))
        .unwrap();
    // Each file's load may keep more than one slot, so that uploads run while its readers read.
    for shard in blocking.shards() {
        assert!(shard.report().slots > 1, "{:?}", shard.report());
    }
    for loaded in [&blocking, &awaited] {
        assert_eq!(loaded.names().count(), want.len());
        for (name, _, _, bytes) in &want {
            assert!(
                device_bytes(&stream, &loaded.get(name).unwrap()) == *bytes,
                "{name}"
            );
        }
    }
    // One file, named directly, is a checkpoint too.
    let one = Checkpoint::open(checkpoint.files()[0].path()).unwrap();
    assert_eq!(one.files().len(), 1);
}

#[test]
fn an_index_that_lies_is_refused_naming_it() {
    let _serial = serial();
    let dir = TempDir::new("index");
    let index = sharded(&dir.0, &tensors(4));
    let good = std::fs::read_to_string(&index).unwrap();
    Checkpoint::open(&index).unwrap(); // control
    for (bad, says) in [
        (
            good.replace("\"ids\"", "\"idz\""),
            "which has no such tensor",
        ),
        (
            good.replace("model-00002-of-00002", "../model-00002-of-00002"),
            "not a file beside the index",
        ),
        (good.replace("weight_map", "weights"), "no \"weight_map\""),
        (good[..good.len() - 3].to_owned(), "not JSON"),
    ] {
        std::fs::write(&index, &bad).unwrap();
        let e = Checkpoint::open(&index).unwrap_err();
        assert!(
            matches!(&e, Error::File { path, .. } if *path == index),
            "{e:?}"
        );
        assert!(e.to_string().contains(says), "{says}: {e}");
    }
}

#[test]
fn a_cut_or_lying_file_is_refused_at_the_byte_it_lies_at() {
    let _serial = serial();
    let ctx = common::device(0);
    let stream = Stream::new(&ctx).unwrap();
    let pool = PinnedPool::new(&ctx, 16 << 20);
    let dir = TempDir::new("lies");
    let path = dir.0.join("model.safetensors");
    write(&path, &tensors(5));
    let good = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(good[..8].try_into().unwrap());
    SafeTensorsFile::open(&path).unwrap(); // control
    // Cut by 10 bytes.
    std::fs::write(&path, &good[..good.len() - 10]).unwrap();
    let e = SafeTensorsFile::open(&path).unwrap_err();
    assert!(
        matches!(e, Error::File { offset, .. } if offset == good.len() as u64 - 10),
        "{e}"
    );
    assert!(e.to_string().contains("truncated"), "{e}");
    // A header length past the end.
    let mut lying = good.clone();
    lying[..8].copy_from_slice(&(good.len() as u64).to_le_bytes());
    std::fs::write(&path, &lying).unwrap();
    let e = SafeTensorsFile::open(&path).unwrap_err();
    assert!(matches!(e, Error::File { offset: 8, .. }), "{e}");
    assert!(
        e.to_string().contains("runs past the end of the file"),
        "{e}"
    );
    // An unknown dtype, at its place in the header.
    let text = String::from_utf8(good[8..8 + n as usize].to_vec()).unwrap();
    let mut unknown = good.clone();
    unknown[8..8 + n as usize].copy_from_slice(text.replacen("\"I64\"", "\"I65\"", 1).as_bytes());
    std::fs::write(&path, &unknown).unwrap();
    let e = SafeTensorsFile::open(&path).unwrap_err();
    let at = 8 + text.find("\"I64\"").unwrap() as u64;
    assert!(
        matches!(e, Error::File { offset, .. } if offset.abs_diff(at) < 8),
        "{e} (dtype at {at})"
    );
    assert!(e.to_string().contains("unknown variant `I65`"), "{e}");
    // Opened whole, then cut before the load.
    std::fs::write(&path, &good).unwrap();
    let file = SafeTensorsFile::open(&path).unwrap();
    std::fs::write(&path, &good[..good.len() / 2]).unwrap();
    let e = file.load(&stream, &pool).unwrap_err();
    assert!(e.to_string().contains("it changed"), "{e}");
}
