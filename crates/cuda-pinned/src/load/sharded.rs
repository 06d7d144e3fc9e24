//! Checkpoints of several safetensors files: an index (`model.safetensors.index.json`, whose `weight_map`
//! names the file of every tensor) read with serde_json, and the files loaded at the same time.

use std::collections::HashMap;
use std::path::{Component, Path};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::LoadOptions;
use super::safetensors::{SafeTensorsFile, Tensors, json_offset};
use crate::driver::Stream;
use crate::error::{Error, Result};
use crate::memory::{DeviceView, PinnedPool};

/// A checkpoint of one safetensors file, or of several named by an index.
#[derive(Clone, Debug)]
pub struct Checkpoint {
    files: Vec<SafeTensorsFile>,
}

impl Checkpoint {
    /// Opens `path`: a safetensors file, or an index (a `.json` file) whose `weight_map` maps every tensor to a
    /// file beside it. Reads and checks every file's header; reads no tensor.
    ///
    /// # Errors
    /// [`Error::File`] for an index that is not JSON, lacks a `weight_map` of strings, names a file outside its
    /// directory, or names a tensor its file lacks or that two files hold; and as [`SafeTensorsFile::open`]
    /// for each file.
    pub fn open(path: impl AsRef<Path>) -> Result<Checkpoint> {
        let path = path.as_ref();
        if path.extension().is_none_or(|e| e != "json") {
            return Ok(Checkpoint {
                files: vec![SafeTensorsFile::open(path)?],
            });
        }
        let text = std::fs::read(path)
            .map_err(|e| Error::file(path, 0, format_args!("cannot read the index: {e}")))?;
        let index: serde_json::Value = serde_json::from_slice(&text).map_err(|e| {
            let at = json_offset(&text, e.line(), e.column());
            Error::file(path, at, format_args!("the index is not JSON: {e}"))
        })?;
        let Some(map) = index.get("weight_map").and_then(|m| m.as_object()) else {
            return Err(Error::file(
                path,
                0,
                "the index has no \"weight_map\" object",
            ));
        };
        let dir = path.parent().unwrap_or(Path::new(""));
        // Each file once, in the order the map first names it.
        let mut names: Vec<&str> = Vec::new();
        let mut wanted: Vec<(&str, usize)> = Vec::with_capacity(map.len());
        for (tensor, file) in map {
            let Some(file) = file.as_str() else {
                return Err(Error::file(
                    path,
                    0,
                    format_args!("weight_map[{tensor:?}] is not a file name"),
                ));
            };
            let inside = Path::new(file)
                .components()
                .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
            if !inside || file.is_empty() {
                return Err(Error::file(
                    path,
                    0,
                    format_args!(
                        "weight_map[{tensor:?}] names {file:?}, not a file beside the index"
                    ),
                ));
            }
            let at = names.iter().position(|&n| n == file).unwrap_or_else(|| {
                names.push(file);
                names.len() - 1
            });
            wanted.push((tensor, at));
        }
        let files = names
            .iter()
            .map(|name| SafeTensorsFile::open(dir.join(name)))
            .collect::<Result<Vec<_>>>()?;
        for (tensor, at) in wanted {
            if files[at].tensor(tensor).is_none() {
                return Err(Error::file(
                    path,
                    0,
                    format_args!(
                        "weight_map puts tensor {tensor:?} in {}, which has no such tensor",
                        files[at].path().display()
                    ),
                ));
            }
        }
        let checkpoint = Checkpoint { files };
        checkpoint.check_unique(path)?;
        Ok(checkpoint)
    }

    /// Fails if two files hold a tensor of the same name.
    fn check_unique(&self, index: &Path) -> Result<()> {
        let mut seen: HashMap<&str, &Path> = HashMap::new();
        for file in &self.files {
            for tensor in file.tensors() {
                if let Some(other) = seen.insert(tensor.name(), file.path()) {
                    return Err(Error::file(
                        index,
                        0,
                        format_args!(
                            "tensor {:?} is in both {} and {}",
                            tensor.name(),
                            other.display(),
                            file.path().display()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Its files, in the order the index first names them.
    pub fn files(&self) -> &[SafeTensorsFile] {
        &self.files
    }

    /// Loads every tensor of every file, one device buffer per file, with the default [`LoadOptions`].
    ///
    /// # Errors
    /// As [`Checkpoint::load_with`].
    pub fn load(&self, stream: &Stream, pool: &PinnedPool) -> Result<LoadedCheckpoint> {
        self.load_with(stream, pool, LoadOptions::default())
    }

    /// Loads every tensor of every file, one device buffer per file ([`SafeTensorsFile::load_with`]), several
    /// files at once: as many as `options.readers`, the readers shared among them. Returns once every byte has
    /// been read, the uploads running on `stream` (tracked).
    ///
    /// # Errors
    /// The first error of any file's load ([`SafeTensorsFile::load`]); the other loads stop at their next file.
    pub fn load_with(
        &self,
        stream: &Stream,
        pool: &PinnedPool,
        options: LoadOptions,
    ) -> Result<LoadedCheckpoint> {
        let at_once = options.readers.min(self.files.len()).max(1);
        let per_file = LoadOptions {
            readers: (options.readers / at_once).max(1),
            buffered_readers: (options.buffered_readers / at_once).max(1),
            // 0 stays "one more than the readers".
            slots: match options.slots {
                0 => 0,
                slots => (slots / at_once).max(1),
            },
            ..options
        };
        let next = AtomicUsize::new(0);
        let loaded: Mutex<Vec<Option<Result<Tensors>>>> =
            Mutex::new((0..self.files.len()).map(|_| None).collect());
        let failed = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            for _ in 0..at_once {
                scope.spawn(|| {
                    while !failed.load(Ordering::Relaxed) {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(file) = self.files.get(i) else {
                            return;
                        };
                        let result = file.load_with(stream, pool, per_file, None);
                        failed.fetch_or(result.is_err(), Ordering::Relaxed);
                        loaded.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(result);
                    }
                });
            }
        });
        let loaded = loaded.into_inner().unwrap_or_else(|e| e.into_inner());
        let mut shards = Vec::with_capacity(loaded.len());
        let mut first_error = None;
        for result in loaded.into_iter().flatten() {
            match result {
                Ok(tensors) => shards.push(tensors),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        let owner = shards
            .iter()
            .enumerate()
            .flat_map(|(i, shard)| shard.iter().map(move |(t, _)| (t.name().to_owned(), i)))
            .collect();
        Ok(LoadedCheckpoint { shards, owner })
    }
}

/// The tensors of a checkpoint on the device: one [`Tensors`] per file.
#[derive(Debug)]
pub struct LoadedCheckpoint {
    shards: Vec<Tensors>,
    owner: HashMap<String, usize>,
}

impl LoadedCheckpoint {
    /// The bytes of the tensor called `name` (a view of its file's buffer), if the checkpoint has one.
    pub fn get(&self, name: &str) -> Option<DeviceView<'_, u8>> {
        self.shards[*self.owner.get(name)?].get(name)
    }

    /// The loaded files, in the order of [`Checkpoint::files`].
    pub fn shards(&self) -> &[Tensors] {
        &self.shards
    }

    /// The names of every tensor.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.owner.keys().map(String::as_str)
    }

    /// The files' tensors, one [`Tensors`] per file.
    pub fn into_shards(self) -> Vec<Tensors> {
        self.shards
    }
}
