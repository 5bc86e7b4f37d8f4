"""Memory of a benchmark: the peak resident memory of a timed block (`PeakRSS`) and the bytes a
model holds (`weights_mb`). Linux's kernel counters where they exist, a sampling thread elsewhere."""

from __future__ import annotations

import os
import threading


def release_memory() -> None:
    """Return freed heap pages to the OS, so that each method's RSS peak starts from the same floor
    (otherwise a method timed after another reuses its freed pages and shows no growth)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc
        pass


class PeakRSS:
    """Peak resident memory of this process while the block runs, minus the RSS at its start.

    On Linux the kernel keeps the peak (VmHWM) and resets it on request (/proc/self/clear_refs):
    exact, and nothing runs beside the timed code. Elsewhere a thread samples the RSS every 2 ms,
    which takes the GIL 500 times a second: it slows Python-heavy code (PIP's copy head, AR's
    decoding loop) more than one long forward pass (the floor)."""

    def __enter__(self):
        release_memory()
        self.base = self.peak = rss()
        self._t = None
        if reset_peak():
            return self
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._watch, daemon=True)
        self._t.start()
        return self

    def _watch(self):
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc):
        if self._t is None:
            self.peak = max(self.base, kernel_peak())
            return
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss())

    @property
    def mb(self) -> float:
        return (self.peak - self.base) / 2**20


def reset_peak() -> bool:
    """Reset the kernel's peak-RSS counter of this process to its current RSS (Linux ≥ 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return kernel_peak() > 0
    except OSError:
        return False


def kernel_peak() -> int:
    """VmHWM of /proc/self/status in bytes (0 when not available)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def weights_mb(model) -> float:
    """Bytes of the model's parameters and buffers (tied weights counted once) and of the LM head's
    bf16 copy (`pipkie.decoding.slot_head.fast_head`, once used), in MB."""
    from pipkie.decoding.slot_head import cache_bytes

    tensors = {t.data_ptr(): t for t in list(model.parameters()) + list(model.buffers())}
    return (sum(t.numel() * t.element_size() for t in tensors.values()) + cache_bytes(model)) / 2**20


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
