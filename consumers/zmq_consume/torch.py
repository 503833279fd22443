"""`zmq-consume`: native receive threads (C++, no Python per batch) write each batch straight into
pinned host memory; the step then copies it to the device asynchronously on a side stream.

The receiver (zmq_ops/receiver.py) shares the TensorFlow op's connection,
decoders and per-producer accounting; here its slots are page-locked torch
tensors, so a batch is copied once off the socket and once to the device.
While the step trains on batch k, batch k+1's copy is already under way. A
slot goes back to the receiver once its copy is done. Why the copy is made
the way it is: feeders/device_copy.py. Without a GPU the slot itself is the
step's input (no copy at all).
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
from feeders.device_copy import CopySources, Pending, SideCopy
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
        self.copier = SideCopy(ctx.device)
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
        self._timeout = rx.ReceiveTimeout
        # The slots (zero copy: the batches, arrays over their slots) a copy to the device, or the step
        # itself without a GPU, may still read: each goes back to the receiver (is dropped) once it is done.
        self._reading = CopySources(release=None if self.zero_copy else self.receiver.release)
        self._ready: Pending | None = None  # GPU: the next batch, its copy already started
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

    def _fetch(self, wait: bool = True) -> Pending | None:
        """Take the next filled slot and start its copy to the device on the side stream.

        `wait=False`: only if a batch is there already (else None), so a look-ahead never
        makes the step that returns the current batch wait for the next one.
        """
        self._reading.keep_at_most(SLOTS - 2)  # leave the receive threads a slot to fill
        if wait:
            slot = self._take()
        else:
            try:
                slot = self.receiver.next(timeout_ms=0)
            except self._timeout:
                return None
        pending = self.copier.start(self.slots[slot])  # without a GPU: the slot's own tensors
        self._reading.add(slot, pending.done)
        return pending

    def _next_in_place(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero copy: tensors over the producer's slot; the slot goes back once nothing reads it any more."""
        self._reading.settle()
        self._reading.keep_at_most(SLOTS - 1)  # the receiver gives no batch while all SLOTS are held
        batch = tuple(torch.from_numpy(a) for a in self._take())
        host = batch
        if self.cuda and not all(t.is_pinned() for t in host):  # a region CUDA refused to register: staged
            self.staged += 1
            with stage("feedbench.host_copy"):
                host = tuple(t.pin_memory() for t in host)
        pending = self.copier.start(host)  # on a GPU: a DMA read of the registered slot
        self._reading.add(batch, pending.done)  # without a GPU the step reads them: held until the next batch
        images, labels = self.copier.hand_over(pending)
        return images, labels_of(labels)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.zero_copy:
            return self._next_in_place()
        self._reading.settle()  # without a GPU: the slot the previous step read
        if self._ready is None:
            self._ready = self._fetch()  # this step waits for its own batch, and only for it
        images, labels = self.copier.hand_over(self._ready)
        # The next batch's copy overlaps this step, if it is there already (without a GPU the step reads
        # the slot itself: it is taken only when asked for).
        self._ready = self._fetch(wait=False) if self.cuda else None
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
            self._ready = None
            try:
                self._reading.drain()  # no copy may still read a slot, nor a batch over one be held
            finally:
                self.receiver.close()
            self.receiver = None
        self.stop_producers()
