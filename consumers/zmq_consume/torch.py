"""`zmq-consume`: native receive threads (C++, no Python per batch) write each batch straight into
pinned host memory; the step then copies it to the device asynchronously on a side stream.

The receiver (zmq_ops/receiver.py) shares the TensorFlow op's connection,
decoders and per-producer accounting; here its slots are page-locked torch
tensors, so a batch is copied once off the socket and once to the device.
While the step trains on batch k, batch k+1's copy is already under way.
Without a GPU the slot itself is the step's input (no copy at all).
"""

from __future__ import annotations

import time

import torch

from consumers.accounting import native_rows
from consumers.torch_half import ProducerFed, RankContext, labels_of
from consumers.zmq_consume.path import PATH, receiver_module
from core.errors import InputError
from core.registry import register
from feeders.cuda_slots import cuda_host_register
from feeders.torch import to_device
from frameworks.torch_trace import stage
from profiler.telemetry import stats_file_figures

POLL_S = 0.2  # the step checks the producers this often while it waits for a batch
SLOTS = 4  # pinned buffers in the ring: one the step uses, one being copied, the rest filled ahead


@register
class ZmqConsume(ProducerFed):
    declaration = PATH

    receiver = None
    regions = None  # zero copy on a GPU: the CUDA registration hook, and its report
    zero_copy = False  # over shm://: tensors over the producers' slots (no copy off the wire)

    def endpoints(self, ctx: RankContext) -> list[str]:
        return [ctx.endpoint(self.cfg, self.name)]

    def open(self, ctx: RankContext) -> None:
        super().open(ctx)
        rx = receiver_module()
        cfg = self.cfg
        self.cuda = ctx.device.type == "cuda"
        b, s = cfg.batch, cfg.image_size
        specs = [("uint8", (b, s, s, 3)), ("int32", (b,))]
        endpoint = ctx.endpoint(cfg, self.name)
        # Over shm:// the batch already sits in a producer's slot: tensors over it, no copy (issue: zero copies);
        # on a GPU the slot's region is registered with CUDA so its copy to the device is a DMA read of the slot.
        # The hook runs on the receive threads: it makes this rank's GPU current there first.
        self.zero_copy = endpoint.startswith("shm://")
        gpu = ctx.device.index if ctx.device.index is not None else torch.cuda.current_device() if self.cuda else None
        self.regions = cuda_host_register(device=gpu) if self.zero_copy and self.cuda else None
        self.slots = (
            []
            if self.zero_copy
            else [
                [torch.empty(shape, dtype=getattr(torch, dt), pin_memory=self.cuda) for dt, shape in specs]
                for _ in range(SLOTS)
            ]
        )
        self.receiver = rx.Receiver(
            endpoint,
            specs,
            SLOTS if self.zero_copy else self.slots,
            hwm=cfg.hwm,
            timeout_ms=int(cfg.recv_timeout * 1000),
            max_msg_size=cfg.max_msg_size or -1,
            bind=True,
            curve_keys=cfg.curve_keys,
            allow_remote=cfg.allow_remote,
            zero_copy=self.zero_copy,
            on_region=self.regions,
        )
        self._arrays: list = []  # zero-copy: the batches (arrays over their slots) the step or a copy still reads
        self._timeout = rx.ReceiveTimeout
        self.stream = torch.cuda.Stream(ctx.device) if self.cuda else None
        self._copying: list[tuple[int, torch.cuda.Event]] = []  # slots whose copy to the device may be running
        self._held: int | None = None  # CPU: the slot the step is reading
        self._ready = None  # GPU: the next batch, its copy already started
        self.staged = 0  # zero copy: batches over a region CUDA refused, staged through pinned memory
        self.start([endpoint])

    def _take(self) -> int:
        """The next filled slot, waiting in short slices so a producer that died is reported at once."""
        with stage("feedbench.wait"):  # for the native receive threads (C++: not in the trace)
            return self._wait_slot()

    def _wait_slot(self):
        """A slot index, or with zero copy the batch's arrays over its slot (released when they are dropped)."""
        waited, timeout = 0.0, self.cfg.recv_timeout
        take = self.receiver.next_arrays if self.zero_copy else self.receiver.next
        while True:
            wait = min(POLL_S, max(0.001, timeout - waited))
            try:
                return take(timeout_ms=max(1, int(wait * 1000)))
            except self._timeout as e:
                waited += wait
                self.check()
                if waited >= timeout:
                    more = str(e).partition(";")[2].strip()  # e.g. peers refused by CURVE authentication
                    raise InputError(f"no batch within {timeout:g} s" + (f"; {more}" if more else "")) from None

    def _fetch(self, wait: bool = True):
        """Take the next filled slot and start its copy to the device on the side stream.

        `wait=False`: only if a batch is there already (else None), so a look-ahead never
        makes the step that returns the current batch wait for the next one.
        """
        while len(self._copying) >= SLOTS - 1:  # leave the receive threads a slot to fill
            held, ev = self._copying.pop(0)
            ev.synchronize()
            self.receiver.release(held)
        if wait:
            slot = self._take()
        else:
            try:
                slot = self.receiver.next(timeout_ms=0)
            except self._timeout:
                return None
        with torch.cuda.stream(self.stream):
            dev = to_device(self.slots[slot], self.ctx.device)
            ev = torch.cuda.Event()
            ev.record(self.stream)
        self._copying.append((slot, ev))
        return dev, ev

    def _release_copied(self) -> None:
        keep = []
        for slot, ev in self._copying:
            if ev.query():
                self.receiver.release(slot)
            else:
                keep.append((slot, ev))
        self._copying = keep

    def _next_in_place(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero copy: tensors over the producer's slot; the slot goes back once nothing reads it any more."""
        self._arrays = [(a, ev) for a, ev in self._arrays if ev is not None and not ev.query()]  # copies still reading
        images, labels = (torch.from_numpy(a) for a in self._take())
        if not self.cuda:
            self._arrays.append(((images, labels), None))  # the step reads them: held until the next batch
            return images, labels_of(labels)
        host = (images, labels)
        if not all(t.is_pinned() for t in host):  # a region CUDA refused to register: staged, and reported
            self.staged += 1
            with stage("feedbench.host_copy"):
                host = tuple(t.pin_memory() for t in host)
        with torch.cuda.stream(self.stream):
            dev = to_device(host, self.ctx.device)  # DMA from the registered slot
            ev = torch.cuda.Event()
            ev.record(self.stream)
        self._arrays.append(((images, labels), ev))
        current = torch.cuda.current_stream(self.ctx.device)
        current.wait_event(ev)
        for t in dev:
            t.record_stream(current)
        return dev[0], labels_of(dev[1])

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.zero_copy:
            return self._next_in_place()
        if not self.cuda:
            if self._held is not None:
                self.receiver.release(self._held)
                self._held = None
            self._held = self._take()
            images, labels = self.slots[self._held]
            return images, labels_of(labels)
        self._release_copied()
        if self._ready is None:
            self._ready = self._fetch()  # this step waits for its own batch, and only for it
        (images, labels), ev = self._ready
        current = torch.cuda.current_stream(self.ctx.device)
        current.wait_event(ev)
        for t in (images, labels):
            t.record_stream(current)
        self._ready = self._fetch(wait=False)  # the next batch's copy overlaps this step, if it is there already
        return images, labels_of(labels)

    def counters(self, session=None) -> dict | None:
        """The receiver's totals now, as profiler.telemetry.wire_figures takes them (it times no message)."""
        if self.receiver is None:
            return None
        _, n, nbytes = self.receiver.stats()
        return {
            "time": time.perf_counter(),
            "messages": n,
            "bytes": nbytes,
            "latency_s": None,
            "wait_s": None,
            "source": "native receiver counters",
        }

    def producer_figures(self, window: tuple[dict, dict] | None) -> dict | None:
        """The producers' own figures (their --stats-file): the native receiver keeps no header extras."""
        if window is None or self.group is None:
            return None
        return stats_file_figures(self.producer_ids, self.group.stats(), self.cfg.batch)

    def result_fields(self) -> dict:
        if self.receiver is None:
            return {}
        rows, messages, _ = self.receiver.stats()  # one snapshot: the rows add up to the batches pulled
        out = {
            "producers": native_rows(rows),
            "batches_pulled": int(messages),
            "zero_copy": self.zero_copy,
        }
        if self.regions is not None:  # zero copy only where CUDA registered every region: else say what happened
            out["cuda_regions"] = self.regions.report()
            out["zero_copy"] = self.zero_copy and out["cuda_regions"]["refused"] == 0 and self.staged == 0
        return out

    def close(self) -> None:
        if self.receiver is not None:
            if self.cuda:
                torch.cuda.synchronize(self.ctx.device)  # no copy may still read a slot
            self._arrays = []
            self.receiver.close()
            self.receiver = None
        self.stop_producers()
