#!/usr/bin/env python3
"""Writes the small safetensors checkpoints that the file loader's tests read, with PyTorch and safetensors.

Two forms of one set of tensors, every value drawn from a seeded torch.Generator so that a rerun writes the
same bytes:

    OUT/tiny.safetensors                              every tensor in one file
    OUT/sharded/model-00001-of-00002.safetensors      the first half of the tensors (in the order below)
    OUT/sharded/model-00002-of-00002.safetensors      the second half
    OUT/sharded/model.safetensors.index.json          {"metadata": {"total_size": N}, "weight_map": {name: file}}

The index is in the Hugging Face form: total_size is the sum of the tensors' bytes (headers not counted), and
weight_map names the shard of each tensor, keys sorted, as transformers writes it. Every file carries the
header metadata {"format": "pt"}, as checkpoints saved from PyTorch models do. The tensors cover the dtypes a
loader has to map (float64/32/16, bfloat16, int64/32/8, uint8, bool) and the odd shapes: a scalar (shape []),
a tensor of no elements (shape [0, 4]), 1-D, 2-D and 3-D ones, and one of 320 KiB so that the file is a few
hundred KiB, not a few bytes.

    python3 scripts/make-checkpoint.py [OUT]      # OUT defaults to examples/downstream/tests/data
"""

import argparse
import json
import os
import sys

import safetensors
import torch
from safetensors.torch import load_file, save_file

SEED = 20240607
DEFAULT_OUT = os.path.join("examples", "downstream", "tests", "data")
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
INDEX = "model.safetensors.index.json"
METADATA = {"format": "pt"}


def make_tensors():
    """The tensors, in a fixed order (the shards split this order in two), from one seeded generator."""
    g = torch.Generator().manual_seed(SEED)

    def normal(*shape, dtype):
        # Drawn in float32 and then cast, so that every dtype comes from the same stream of draws.
        return torch.randn(*shape, generator=g, dtype=torch.float32).to(dtype)

    def integers(low, high, *shape, dtype):
        return torch.randint(low, high, shape, generator=g, dtype=dtype)

    return {
        # The large one: 640 x 256 float16 = 320 KiB.
        "embed.weight": normal(640, 256, dtype=torch.float16),
        # 3-D: 3 x 64 x 64 bfloat16 = 24 KiB.
        "layers.0.attn.qkv.weight": normal(3, 64, 64, dtype=torch.bfloat16),
        "layers.0.attn.qkv.bias": normal(192, dtype=torch.float32),
        "layers.0.mlp.up.weight": normal(128, 64, dtype=torch.float32),
        "layers.0.norm.scale": normal(64, dtype=torch.float64),
        "quant.weight": integers(-128, 128, 32, 32, dtype=torch.int8),
        "quant.zero_point": integers(0, 256, 32, dtype=torch.uint8),
        "attention.mask": torch.rand(8, 8, generator=g) < 0.5,
        "positions": torch.arange(128, dtype=torch.int64) * 3 - 100,
        "token_ids": integers(-(2**31), 2**31 - 1, 4, 16, dtype=torch.int32),
        # A scalar (shape []) and a tensor of no elements (shape [0, 4], no bytes in the file).
        "step": torch.tensor(1234567890123, dtype=torch.int64),
        "empty": torch.zeros(0, 4, dtype=torch.float32),
    }


def nbytes(t):
    return t.numel() * t.element_size()


def write(out):
    tensors = make_tensors()
    os.makedirs(os.path.join(out, "sharded"), exist_ok=True)

    single = os.path.join(out, "tiny.safetensors")
    save_file(tensors, single, metadata=METADATA)

    names = list(tensors)
    half = len(names) // 2
    weight_map = {}
    for shard, part in zip(SHARDS, (names[:half], names[half:])):
        save_file({n: tensors[n] for n in part}, os.path.join(out, "sharded", shard), metadata=METADATA)
        weight_map.update((n, shard) for n in part)
    index = {
        "metadata": {"total_size": sum(nbytes(t) for t in tensors.values())},
        "weight_map": dict(sorted(weight_map.items())),
    }
    with open(os.path.join(out, "sharded", INDEX), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")
    return tensors, single


def read_header(path):
    """The JSON header of a safetensors file: an 8-byte little-endian length, then that many bytes."""
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(length))


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def check(out, tensors, single):
    """Reads everything back: each file's tensors and metadata, and the index against the shards."""
    loaded = load_file(single)
    assert loaded.keys() == tensors.keys(), "tiny.safetensors: not the same names"
    assert all(same(loaded[n], t) for n, t in tensors.items()), "tiny.safetensors: a tensor differs"
    assert read_header(single)["__metadata__"] == METADATA, "tiny.safetensors: metadata"

    sharded = os.path.join(out, "sharded")
    with open(os.path.join(sharded, INDEX)) as f:
        index = json.load(f)
    assert set(index["weight_map"].values()) == set(SHARDS), "index: not every shard named"
    seen = {}
    for shard in SHARDS:
        part = load_file(os.path.join(sharded, shard))
        assert read_header(os.path.join(sharded, shard))["__metadata__"] == METADATA, f"{shard}: metadata"
        for n, t in part.items():
            assert index["weight_map"].get(n) == shard, f"index: {n} is in {shard}"
            assert n not in seen, f"{n} in two shards"
            seen[n] = t
    assert seen.keys() == tensors.keys(), "shards: not the same names"
    assert all(same(seen[n], t) for n, t in tensors.items()), "shards: a tensor differs"
    assert index["metadata"]["total_size"] == sum(nbytes(t) for t in seen.values()), "index: total_size"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    args = parser.parse_args()

    tensors, single = write(args.out)
    check(args.out, tensors, single)
    print(f"torch {torch.__version__}, safetensors {safetensors.__version__}: wrote {args.out}", file=sys.stderr)
    for path in [single] + [os.path.join(args.out, "sharded", f) for f in SHARDS + (INDEX,)]:
        print(f"  {path}  {os.path.getsize(path)} bytes", file=sys.stderr)
    for n, t in tensors.items():
        print(f"  {n:26} {str(t.dtype).removeprefix('torch.'):9} {list(t.shape)}", file=sys.stderr)


if __name__ == "__main__":
    main()
