#!/usr/bin/env python3
"""`pinbench devices`, measured with PyTorch: the same figures, printed as JSON with the same keys.

Per device, uploads and downloads between a pinned tensor (torch.empty(..., pin_memory=True)) and a tensor on
the device, on a torch.cuda.Stream of that device, timed by torch.cuda.Event (medians after warm-up, batched
and repeated as pinbench's plan does); every device uploading its own pinned tensor at once, one thread per
device started together by a threading.Barrier, timed on the host from the common start to the last device's
end (medians of rounds), beside device 0 alone timed the same way; the same from one shared pinned tensor; and
the copy matrix, dst.copy_(src) for every ordered pair of devices, timed by events on the destination's stream
(the diagonal copies within a device, its bytes counted once). Each cell of the matrix says which way its copies
went: "direct" where the source's device can access the destination's memory
(torch.cuda.can_device_access_peer), which ATen enables on the first copy between the two (an untimed warm-up
copy here), else "staged", through host memory by the driver (cudaMemcpyAsync without peer access), where
pinbench's library stages through pinned memory of its own.

    python3 scripts/torch-devices.py [--quick] > torch.json
    pinbench devices [--quick] --json > pinbench.json

The two documents have the same keys, so a caller computes pinbench / PyTorch ratios key by key, except
"prefetched_gathers": pinbench's sharded prefetcher of rows gathered on each device from one mapped pinned table
has no PyTorch twin, so this script writes it as null. Each device's "pinned_numa_node" is null too: PyTorch
(pin_memory=True) chooses no node per device and the OS places the pages, where pinbench reports the node its
library places pinned memory for the device on. The driver's version and each device's PCI bus id come from
libcuda, the driver release and the PCIe link from NVML (libnvidia-ml), both through ctypes, as pinbench reads
them. Exit status: 0 when the run completed, 1 when a copy failed or its data did not arrive intact (the JSON is
printed first), 2 on a command line it does not understand.
"""

import argparse
import ctypes
import json
import math
import sys
import threading
import time

import torch

FULL_BYTES = 256 << 20
QUICK_BYTES = 64 << 20
# Bytes each device uploads per round of the all-at-once figures (several copies per round below this size).
ROUND_BYTES = 256 << 20
# Bytes uploaded while the PCIe link is read, so that it is busy then (an idle link drops to a slower one).
LOAD_BYTES = 2 << 30
POISON = 0xA5

# pinbench's plans (crates/pinbench/src/timing.rs): timed device time per figure, batches of small copies.
PLANS = {
    False: {"min_seconds": 0.100, "min_samples": 5, "max_samples": 200, "batch_seconds": 0.002, "max_batch": 256},
    True: {"min_seconds": 0.015, "min_samples": 5, "max_samples": 50, "batch_seconds": 0.0005, "max_batch": 256},
}

UNITS = {
    "gb_per_s": "decimal gigabytes (1e9 bytes) per second",
    "seconds": "seconds: devices[] and peer copies are device times from CUDA events, medians per copy; "
    "host_to_all, shared_to_all and prefetched_gathers are host wall times per round, from the threads' common "
    "start to the last device's end, medians",
    "bytes": "bytes",
    "ratio_to_first_device": "aggregate GB/s over device 0 uploading alone, timed the same way (host wall time)",
    "ratio_to_sum_alone": "aggregate GB/s over the sum of the devices' event-timed uploads alone (devices[])",
    "ratio_to_one_device": "GB/s fed to every device at once over GB/s fed to device 0 alone, timed the same way "
    "(prefetched_gathers)",
}


def log(text):
    print(f"torch-devices: {text}", file=sys.stderr, flush=True)


def median(values):
    """The median, the upper one of an even count (as pinbench takes it); NaN for none."""
    values = sorted(values)
    return values[len(values) // 2] if values else float("nan")


def gb_per_s(nbytes, seconds):
    return nbytes / seconds / 1e9 if seconds > 0 else None


def ratio(a, b):
    return a / b if a is not None and b else None


def finite(value):
    """`value` with NaN and infinities as None, which JSON writes as null (as pinbench's serde_json does)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def pattern(nbytes, seed):
    """Distinct bytes for `seed`, so that a copy that moved nothing or stale data shows."""
    words = torch.arange(nbytes // 8, dtype=torch.int64)
    words.mul_(0x2545F4914F6CDD1D).add_(seed)
    return words.view(torch.uint8)


def batching(plan, once):
    """Copies per batch and batches for a copy that took `once` seconds (timing.rs: `batching`)."""

    def up(x):
        return max(int(math.ceil(x - 1e-9)), 0)

    once = max(once, 1e-7)
    batch = min(max(up(plan["batch_seconds"] / once), 1), plan["max_batch"])
    samples = up(plan["min_seconds"] / (once * batch))
    samples = min(max(samples, plan["min_samples"]), max(plan["max_samples"], plan["min_samples"]))
    return batch, samples


def time_copies(stream, plan, copy):
    """One warm-up copy, one calibration copy, then timed batches: (median seconds per copy, batches)."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)

    def timed(count):
        start.record(stream)
        for _ in range(count):
            copy()
        end.record(stream)
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    copy()
    once = timed(1)
    batch, samples = batching(plan, once)
    times = [timed(batch) / batch for _ in range(samples)]
    return median(times), samples


class Driver:
    """libcuda through ctypes: the version it supports and the devices' PCI bus ids as cuDeviceGetPCIBusId
    writes them (the ids pinbench reports, and the names NVML and sysfs look devices up by)."""

    def __init__(self):
        self.name = "libcuda.so.1"
        try:
            self.lib = ctypes.CDLL(self.name)
            self.ok = self.lib.cuInit(0) == 0
        except OSError:
            self.lib, self.ok = None, False

    def version(self):
        if not self.ok:
            return None
        v = ctypes.c_int()
        if self.lib.cuDriverGetVersion(ctypes.byref(v)) != 0:
            return None
        return f"{v.value // 1000}.{v.value % 1000 // 10}"

    def pci_bus_id(self, ordinal):
        if self.ok:
            device = ctypes.c_int()
            buf = ctypes.create_string_buffer(32)
            if (
                self.lib.cuDeviceGet(ctypes.byref(device), ordinal) == 0
                and self.lib.cuDeviceGetPCIBusId(buf, len(buf), device) == 0
            ):
                return buf.value.decode()
        props = torch.cuda.get_device_properties(ordinal)
        domain, bus, dev = (getattr(props, k, 0) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
        return f"{domain:04x}:{bus:02x}:{dev:02x}.0"


class Nvml:
    """Just enough of NVML, through ctypes, for the driver release and the PCIe link (pinbench's nvml.rs)."""

    def __init__(self):
        try:
            self.lib = ctypes.CDLL("libnvidia-ml.so.1")
            self.ok = self.lib.nvmlInit_v2() == 0
        except OSError:
            self.lib, self.ok = None, False

    def driver_release(self):
        if not self.ok:
            return None
        buf = ctypes.create_string_buffer(96)
        return buf.value.decode() if self.lib.nvmlSystemGetDriverVersion(buf, len(buf)) == 0 else None

    def pcie_link(self, bus_id):
        if not self.ok:
            return None
        handle = ctypes.c_void_p()
        if self.lib.nvmlDeviceGetHandleByPciBusId_v2(bus_id.encode(), ctypes.byref(handle)) != 0:
            return None
        link = {}
        for key, name in (
            ("generation", "nvmlDeviceGetCurrPcieLinkGeneration"),
            ("width", "nvmlDeviceGetCurrPcieLinkWidth"),
            ("max_generation", "nvmlDeviceGetMaxPcieLinkGeneration"),
            ("max_width", "nvmlDeviceGetMaxPcieLinkWidth"),
        ):
            value = ctypes.c_uint()
            if getattr(self.lib, name)(handle, ctypes.byref(value)) != 0:
                return None
            link[key] = value.value
        return link


def sysfs_bus_id(bus_id):
    """Lower case, a domain of at least 4 hex digits (pinbench's devices/measure.rs: `sysfs_bus_id`)."""
    bus_id = bus_id.strip().lower()
    domain, sep, rest = bus_id.partition(":")
    try:
        return f"{int(domain, 16):04x}{sep}{rest}" if sep else bus_id
    except ValueError:
        return bus_id


def numa_node(bus_id):
    try:
        with open(f"/sys/bus/pci/devices/{sysfs_bus_id(bus_id)}/numa_node") as f:
            node = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


class Unit:
    """One device's stream and buffers: its own pinned tensor, the uploads' target (also what the matrix copies
    into) and the matrix's source."""

    def __init__(self, ordinal, nbytes, driver):
        self.ordinal = ordinal
        self.bus_id = driver.pci_bus_id(ordinal)
        with torch.cuda.device(ordinal):
            self.stream = torch.cuda.Stream()
            self.host = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=True)
            self.target = torch.zeros(nbytes, dtype=torch.uint8, device=f"cuda:{ordinal}")
            self.source = torch.zeros(nbytes, dtype=torch.uint8, device=f"cuda:{ordinal}")
        torch.cuda.synchronize(ordinal)

    def link_under_load(self, nvml):
        with torch.cuda.device(self.ordinal), torch.cuda.stream(self.stream):
            for _ in range(max(LOAD_BYTES // self.host.numel(), 1)):
                self.target.copy_(self.host, non_blocking=True)
            link = nvml.pcie_link(self.bus_id)
            self.stream.synchronize()
        return link

    def upload(self, plan, seed):
        with torch.cuda.device(self.ordinal), torch.cuda.stream(self.stream):
            self.host.copy_(pattern(self.host.numel(), seed))
            seconds, samples = time_copies(self.stream, plan, lambda: self.target.copy_(self.host, non_blocking=True))
            verified = torch.equal(self.target.cpu(), self.host)
        return seconds, samples, verified

    def download(self, plan, seed):
        with torch.cuda.device(self.ordinal), torch.cuda.stream(self.stream):
            expected = pattern(self.host.numel(), seed)
            self.host.copy_(expected)
            self.target.copy_(self.host, non_blocking=True)
            self.stream.synchronize()
            self.host.fill_(POISON)
            seconds, samples = time_copies(self.stream, plan, lambda: self.host.copy_(self.target, non_blocking=True))
            self.stream.synchronize()
            verified = torch.equal(self.host, expected)
        return seconds, samples, verified


def together(jobs, nbytes, copies, warmup, rounds):
    """Uploads of every job's source into its target at once, one thread per device started together; the
    median wall time of a round from the earliest start to the latest end, and whether the data arrived.
    jobs: (unit, source tensor, seed of its pattern)."""
    barrier = threading.Barrier(len(jobs))
    failed = [False]
    results = [None] * len(jobs)

    def run(index, unit, src, seed):
        spans, error, verified = [], None, None
        try:
            with torch.cuda.device(unit.ordinal), torch.cuda.stream(unit.stream):
                for _ in range(warmup + rounds):
                    barrier.wait()
                    start = time.perf_counter()
                    if error is None:
                        try:
                            for _ in range(copies):
                                unit.target.copy_(src, non_blocking=True)
                            unit.stream.synchronize()
                        except Exception as e:  # reported by the caller, as pinbench reports a CUDA error
                            error = f"{type(e).__name__}: {e}"
                            failed[0] = True
                    spans.append((start, time.perf_counter()))
                    # Every thread reads `failed` after this barrier and none writes it before the next round.
                    barrier.wait()
                    if failed[0]:
                        break
                if error is None:
                    verified = torch.equal(unit.target.cpu(), pattern(nbytes, seed))
        except Exception as e:
            # Anything else: the other threads must not wait at the barrier for this one.
            barrier.abort()
            error = error or f"{type(e).__name__}: {e}"
        results[index] = (spans, error, verified)

    threads = [threading.Thread(target=run, args=(i, *job)) for i, job in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [r[1] for r in results if r[1] is not None]
    if errors:
        raise RuntimeError(f"uploading to every device at once: {errors[0]}")
    count = min(len(r[0]) for r in results)
    spans = [
        max(r[0][k][1] for r in results) - min(r[0][k][0] for r in results) for k in range(warmup, count)
    ]
    return {
        "devices": [job[0].ordinal for job in jobs],
        "bytes": nbytes,
        "copies_per_round": copies,
        "seconds": median(spans),
        "rounds": len(spans),
        "verified": all(r[2] for r in results),
    }


def copy_figure(src, dst, plan, seed):
    """Copies of src.source into dst.target on dst's stream: (seconds, samples, verified) or an error's text."""
    try:
        with torch.cuda.device(dst.ordinal):
            seconds, samples = time_copies(dst.stream, plan, lambda: dst.target.copy_(src.source, non_blocking=True))
            dst.stream.synchronize()
            verified = torch.equal(dst.target.cpu(), pattern(dst.target.numel(), seed))
        return (seconds, samples, verified), None
    except Exception as e:
        try:
            torch.cuda.synchronize(dst.ordinal)
        except Exception:
            pass  # the first error is the one reported
        return None, f"{type(e).__name__}: {e}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="copies of 64 MiB and fewer repetitions")
    args = parser.parse_args()
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print("torch-devices: PyTorch sees no CUDA device: nothing to measure", file=sys.stderr)
        return 1

    started = time.perf_counter()
    quick = args.quick
    nbytes = QUICK_BYTES if quick else FULL_BYTES
    plan = PLANS[quick]
    warmup, rounds = 2, (5 if quick else 41)
    copies = max(ROUND_BYTES // nbytes, 1)
    seed = [0x5EEDDE71CE5]

    def next_seed():
        seed[0] = (seed[0] + 0x2545F4914F6CDD1D) % (1 << 62)
        return seed[0]

    driver, nvml = Driver(), Nvml()
    n = torch.cuda.device_count()
    units = []
    for d in range(n):
        log(f"device {d}: allocating {nbytes >> 20} MiB of pinned and {2 * nbytes >> 20} MiB of device memory")
        units.append(Unit(d, nbytes, driver))
    shared = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=True)

    devices = []
    for u in units:
        log(f"device {u.ordinal}: uploads and downloads alone")
        link = u.link_under_load(nvml)
        up_seconds, up_samples, up_ok = u.upload(plan, next_seed())
        down_seconds, down_samples, down_ok = u.download(plan, next_seed())
        devices.append(
            {
                "ordinal": u.ordinal,
                "name": torch.cuda.get_device_name(u.ordinal),
                "pci_bus_id": u.bus_id,
                "numa_node": numa_node(u.bus_id),
                # PyTorch chooses no node for its pinned memory: the OS places it (pinbench: where its library does).
                "pinned_numa_node": None,
                "pcie": link,
                "upload_gb_per_s": gb_per_s(nbytes, up_seconds),
                "upload_seconds": up_seconds,
                "download_gb_per_s": gb_per_s(nbytes, down_seconds),
                "download_seconds": down_seconds,
                "samples": min(up_samples, down_samples),
                "verified": up_ok and down_ok,
            }
        )

    def own_jobs(chosen):
        jobs = []
        for u in chosen:
            s = next_seed()
            u.host.copy_(pattern(nbytes, s))
            jobs.append((u, u.host, s))
        return jobs

    log("device 0 alone, timed on the host")
    first_alone = together(own_jobs(units[:1]), nbytes, copies, warmup, rounds)
    if n == 1:
        host_to_all = first_alone
    else:
        log(f"all {n} devices at once, each from its own pinned memory")
        host_to_all = together(own_jobs(units), nbytes, copies, warmup, rounds)
    log(f"all {n} device(s) at once from one shared pinned tensor")
    s = next_seed()
    shared.copy_(pattern(nbytes, s))
    shared_to_all = together([(u, shared, s) for u in units], nbytes, copies, warmup, rounds)

    # The matrix: ATen runs a copy between devices on the source's current stream, ordered with the
    # destination's current stream both ways: each device's current stream is its unit's.
    for u in units:
        torch.cuda.set_stream(u.stream)
    source_seeds = []
    for u in units:
        s = next_seed()
        with torch.cuda.device(u.ordinal):
            u.source.copy_(pattern(nbytes, s).pin_memory(), non_blocking=True)
            u.stream.synchronize()
        source_seeds.append(s)
    copies_json, matrix, errors = [], [[None] * n for _ in range(n)], []
    for src in range(n):
        for dst in range(n):
            access, route = None, None
            if src != dst:
                # Each way, as pinbench reports it; ATen itself needs only the source's access to the destination:
                # it enables that (at::cuda::get_p2p_access(src, dst)) and copies direct, else the driver stages.
                forward = torch.cuda.can_device_access_peer(src, dst)
                access = forward and torch.cuda.can_device_access_peer(dst, src)
                route = "direct" if forward else "staged"
            log(f"copies from device {src} to device {dst}" + (f" ({route})" if route else ""))
            figure, error = copy_figure(units[src], units[dst], plan, source_seeds[src])
            cell = {
                "src": src,
                "dst": dst,
                "kind": "local" if src == dst else "peer",
                "peer_access": access,
                "route": route,
                "gb_per_s": None,
                "seconds": None,
                "samples": None,
                "verified": None,
                "error": error,
            }
            if figure is not None:
                seconds, samples, verified = figure
                cell.update(gb_per_s=gb_per_s(nbytes, seconds), seconds=seconds, samples=samples, verified=verified)
                matrix[src][dst] = cell["gb_per_s"]
            else:
                errors.append(f"copy from device {src} to device {dst}: {error}")
            copies_json.append(cell)

    def together_json(t):
        aggregate = gb_per_s(len(t["devices"]) * t["copies_per_round"] * t["bytes"], t["seconds"])
        alone = gb_per_s(first_alone["copies_per_round"] * first_alone["bytes"], first_alone["seconds"])
        sum_alone = sum(d["upload_gb_per_s"] or 0.0 for d in devices)
        return {
            "devices": t["devices"],
            "bytes_per_device": t["bytes"] * t["copies_per_round"],
            "copies_per_round": t["copies_per_round"],
            "aggregate_gb_per_s": aggregate,
            "seconds": t["seconds"],
            "rounds": t["rounds"],
            "first_device_alone_gb_per_s": alone,
            "ratio_to_first_device": ratio(aggregate, alone),
            "sum_alone_gb_per_s": sum_alone,
            "ratio_to_sum_alone": ratio(aggregate, sum_alone),
            "verified": t["verified"],
        }

    failures = []
    for d in devices:
        if not d["verified"]:
            failures.append(f"uploads or downloads of device {d['ordinal']}")
    for what, t in (
        ("device 0 uploading alone", first_alone),
        ("host to all devices", host_to_all),
        ("one shared buffer to all devices", shared_to_all),
    ):
        if not t["verified"]:
            failures.append(what)
    for c in copies_json:
        if c["verified"] is False:
            failures.append(f"copy from device {c['src']} to device {c['dst']}")

    document = {
        "tool": "torch-devices.py",
        "version": torch.__version__,
        "library": "torch",
        "mode": "devices",
        "quick": quick,
        "bytes": nbytes,
        "wall_seconds": time.perf_counter() - started,
        "units": UNITS,
        "header": {
            "device_count": n,
            "nvidia_driver": nvml.driver_release(),
            "cuda_version": driver.version(),
            "driver_library": driver.name,
        },
        "devices": devices,
        "host_to_all": together_json(host_to_all),
        "shared_to_all": together_json(shared_to_all),
        "peer": {"matrix_gb_per_s": matrix, "copies": copies_json},
        # No PyTorch twin: pinbench's Prefetcher::sharded of rows gathered on each device from one mapped table.
        "prefetched_gathers": None,
        "failures": failures,
        "errors": errors,
    }
    print(json.dumps(finite(document), indent=2, allow_nan=False))
    for e in errors:
        print(f"torch-devices: {e}", file=sys.stderr)
    for f in failures:
        print(f"torch-devices: the data that arrived differs from the source for: {f}", file=sys.stderr)
    return 1 if errors or failures else 0


if __name__ == "__main__":
    sys.exit(main())
