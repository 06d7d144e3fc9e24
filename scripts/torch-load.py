#!/usr/bin/env python3
"""`pinbench load`, measured with PyTorch: a safetensors file from disk into GPU memory, cold and warm.

Writes (unless a file of the same layout is already there) a checkpoint of --gib GiB like a real one: tensors
of 256 MiB, float16 and bfloat16 in turn, each with a small float32 one beside it, and a last big one with
what is left. Then times, once each after the page cache is set:

  load_file    safetensors.torch.load_file(path, device="cuda"), torch.cuda.synchronize() before the clock stops
  pinned_read  the file read into one pinned tensor (torch.empty(n, dtype=torch.uint8, pin_memory=True)) in
               64 MiB pieces by readinto, each piece sent on with .to("cuda", non_blocking=True) on a CUDA
               stream while the next one is read (the pinned tensor is allocated before the clock starts)

cold: the file's pages dropped from the page cache first, by os.fsync then os.posix_fadvise(POSIX_FADV_DONTNEED)
on the whole file. The kernel takes that as advice: pages still mapped are kept, and nothing here can check
what stayed resident, so the JSON names the method ("cache_drop") rather than a result. On a tmpfs the drop does
nothing (the file lives in the page cache). warm: the file read once through first, so it is in the page cache.
GB/s are decimal (1e9 bytes per second) over the file's size.

    python3 scripts/torch-load.py [--path FILE] [--gib 8] [--json] [--keep] [--write-only]

A file this script created is deleted at the end unless --keep (or --write-only, which writes it and stops:
no GPU needed). Exit status: 0 when done, 1 without a CUDA device or when the data did not arrive intact, 2 on
a command line it does not understand.
"""

import argparse
import json
import math
import os
import sys
import tempfile
import time

import safetensors
import torch
from safetensors.torch import load_file

MIB = 1 << 20
BIG = 256 * MIB  # bytes of each big tensor
COLS = 4096  # columns of the big tensors and elements of the small ones
PIECE = 64 * MIB  # bytes per read and per copy
DEFAULT_PATH = os.path.join(tempfile.gettempdir(), "torch-load-bench.safetensors")
CODES = {torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32"}


def log(text):
    print(f"torch-load: {text}", file=sys.stderr, flush=True)


def plan(total):
    """(name, dtype, shape) of every tensor, for about `total` bytes of data in all."""
    tensors, left, i = [], total, 0
    while left >= 2 * COLS:
        dtype = (torch.float16, torch.bfloat16)[i % 2]
        rows = min(BIG, left) // (2 * COLS)
        tensors.append((f"model.layers.{i}.mlp.weight", dtype, [rows, COLS]))
        left -= rows * COLS * 2
        if left >= 4 * COLS:
            tensors.append((f"model.layers.{i}.norm.weight", torch.float32, [COLS]))
            left -= 4 * COLS
        i += 1
    return tensors


def header(tensors):
    """The file's first bytes: the 8-byte little-endian length, then the JSON header padded to 8 bytes."""
    entries, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape in tensors:
        size = math.prod(shape) * dtype.itemsize
        entries[name] = {"dtype": CODES[dtype], "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, offset


def write(path, tensors):
    """Writes the checkpoint tensor by tensor (one in memory at a time), values from a seeded generator."""
    head, _ = header(tensors)
    g = torch.Generator().manual_seed(0)
    with open(path + ".part", "wb") as f:
        f.write(head)
        for name, dtype, shape in tensors:
            t = torch.randn(*shape, generator=g, dtype=torch.float32).to(dtype)
            f.write(memoryview(t.view(-1).view(torch.uint8).numpy()))
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".part", path)


def present(path, head, size):
    """Whether `path` is already this checkpoint: the same size and the same header."""
    try:
        with open(path, "rb") as f:
            return os.fstat(f.fileno()).st_size == size and f.read(len(head)) == head
    except OSError:
        return False


def filesystem(path):
    """Mount point, type and source of the filesystem holding `path` (/proc/mounts, best effort), and statvfs."""
    real, best = os.path.realpath(path), {}
    try:
        with open("/proc/mounts") as f:
            for line in f:
                source, mount, kind = line.split()[:3]
                mount = mount.replace("\\040", " ")
                inside = real == mount or real.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best.get("mount", "")):
                    best = {"mount": mount, "type": kind, "source": source}
    except OSError:
        pass
    st = os.statvfs(os.path.dirname(real))
    return {"mount": None, "type": None, "source": None, **best, "block_size": st.f_bsize,
            "free_bytes": st.f_bavail * st.f_frsize}


def drop_cache(path):
    with open(path, "rb") as f:
        os.fsync(f.fileno())  # dirty pages are not dropped: written back first
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def warm_cache(path):
    buf = memoryview(bytearray(PIECE))
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def time_load_file(path):
    start = time.perf_counter()
    loaded = load_file(path, device="cuda")
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    del loaded
    torch.cuda.empty_cache()
    return seconds


def time_pinned(path, pinned, stream):
    """Reads piece k into its own part of `pinned` while piece k-1 is copied on `stream`: (seconds, intact)."""
    n, view, pieces = pinned.numel(), memoryview(pinned.numpy()), []
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as f, torch.cuda.stream(stream):
        for first in range(0, n, PIECE):
            end, off = min(first + PIECE, n), first
            while off < end:
                got = f.readinto(view[off:end])
                if not got:
                    raise OSError(f"{path}: file ended at byte {off} of {n}")
                off += got
            # Queued on the stream; the loop goes on to read the next piece while this one is copied.
            pieces.append(pinned[first:end].to("cuda", non_blocking=True))
    stream.synchronize()
    seconds = time.perf_counter() - start
    # The last piece back to the host, against the bytes read: a copy that moved nothing shows.
    intact = torch.equal(pieces[-1].cpu(), pinned[first:])
    del pieces
    torch.cuda.empty_cache()
    return seconds, intact


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", default=DEFAULT_PATH, help=f"the checkpoint (default {DEFAULT_PATH})")
    parser.add_argument("--gib", type=float, default=8.0, help="GiB of tensor data, fractions too (default 8)")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.add_argument("--keep", action="store_true", help="do not delete the file this run created")
    parser.add_argument("--write-only", action="store_true", help="write the file, keep it and stop (no GPU)")
    args = parser.parse_args()
    if not (args.gib > 0 and math.isfinite(args.gib)):
        parser.error("--gib must be a finite number more than 0")
    tensors = plan(int(args.gib * (1 << 30)))
    if not tensors:
        parser.error(f"--gib {args.gib} is too small for one tensor")

    if not args.write_only and not torch.cuda.is_available():
        log("no CUDA device: torch.cuda.is_available() is false (this measures loads into GPU memory)")
        return 1
    head, data = header(tensors)
    size = len(head) + data
    fs = filesystem(args.path)
    if fs["type"] == "tmpfs":
        log(f"{args.path} is on a tmpfs: its pages cannot be dropped, so cold reads from memory too")
    created = not present(args.path, head, size)
    if created:
        if fs["free_bytes"] < size:
            log(f"{args.path}: {size} bytes needed, {fs['free_bytes']} free on {fs['mount']}")
            return 1
        log(f"writing {args.path}: {len(tensors)} tensors, {size} bytes")
        write(args.path, tensors)
    if args.write_only:
        log(f"{args.path}: {size} bytes, {'written' if created else 'already there'}")
        return 0

    try:
        torch.cuda.init()
        torch.empty(1, device="cuda")  # the context, before any clock starts
        stream = torch.cuda.Stream()
        start = time.perf_counter()
        pinned = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        pinned_alloc_s = time.perf_counter() - start
        results, intact = {}, True
        for state, prepare in (("cold", drop_cache), ("warm", warm_cache)):
            prepare(args.path)
            load_s = time_load_file(args.path)
            prepare(args.path)
            pinned_s, ok = time_pinned(args.path, pinned, stream)
            intact &= ok
            results[state] = {"load_file_gbps": size / load_s / 1e9, "load_file_s": load_s,
                              "pinned_read_gbps": size / pinned_s / 1e9, "pinned_read_s": pinned_s}
    finally:
        if created and not args.keep:
            os.remove(args.path)

    doc = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "safetensors": safetensors.__version__,
        "path": args.path,
        "filesystem": fs,
        "bytes": size, "tensors": len(tensors), "piece_bytes": PIECE,
        "pinned_alloc_s": pinned_alloc_s,
        "cache_drop": "posix_fadvise DONTNEED",
        "cold": results["cold"],
        "warm": results["warm"],
        "intact": intact,
        "units": {"gbps": "decimal gigabytes (1e9 bytes) per second over the file's bytes", "s": "seconds"},
    }
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"{doc['device']}: torch {doc['torch']}, safetensors {doc['safetensors']}")
        print(f"{args.path}: {size} bytes, {len(tensors)} tensors, on {fs['mount']} ({fs['type']})")
        print(f"cold = page cache dropped by {doc['cache_drop']}; warm = file read once before")
        for state in ("cold", "warm"):
            r = results[state]
            print(f"  {state}: load_file {r['load_file_gbps']:6.2f} GB/s ({r['load_file_s']:.3f} s)   "
                  f"pinned read {r['pinned_read_gbps']:6.2f} GB/s ({r['pinned_read_s']:.3f} s)")
        print(f"  pinned tensor of {size} bytes allocated in {pinned_alloc_s:.3f} s (not timed above)")
    if not intact:
        log("the data copied through the pinned tensor did not arrive intact")
    return 0 if intact else 1


if __name__ == "__main__":
    sys.exit(main())
