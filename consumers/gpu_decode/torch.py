"""`gpu-decode`: each batch arrives as its JPEG files' bytes; the rank decodes them on its device in one
batched call (`torchvision.io.decode_jpeg(list, device=...)`: nvJPEG on a GPU), then takes the same
random-resized crop and flip as the decode producers, resizes to the model's size and casts, all there.

A thread receives the batches (producers/read.py sends them, a shard of the folder each) and decodes them
`depth` batches ahead of the step, on a side stream on a GPU. Without a GPU the same calls decode on the
host, and the figures say `decoded_on: cpu`. A file the device's decoder refuses (nvJPEG leaves CMYK to the
host) is decoded on the host and named in the figures; a file neither decodes stops the run with one line naming
it: a batch is never made shorter.
"""

from __future__ import annotations

import collections
import queue
import random
import threading
from dataclasses import replace
from typing import ClassVar

import numpy as np
import torch
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms.v2 import functional as F

from consumers.gpu_decode.path import PATH
from consumers.python_queue.torch import POLL_S, PythonQueue, pull
from consumers.torch_half import labels_of, rank_producer_ids
from consumers.zmq_pull import PullConsumer, ReceiveTimeout
from core.errors import InputError
from core.images.decoders import random_resized_crop_box
from core.images.files import list_images
from core.registry import batch_maker_of, register
from feeders.device_copy import SideCopy, to_device
from profiler.telemetry import DescribedStage, SampledQueue
from wire import strings


class UndecodableFile(InputError):
    """A file of the batch the device's decoder refused (named, with the decoder's reason)."""


def _reason(e: BaseException) -> str:
    """torchvision's message without its source location (`decode_jpeg, .../decode_jpeg.cpp:171, why`)."""
    return str(e).strip().splitlines()[-1].rsplit(", ", 1)[-1]


def decode_batch(items: np.ndarray, device: torch.device, names: list[str], on_host=lambda name: None) -> list:
    """Every file of the batch decoded to CHW uint8 RGB on `device`, in one call.

    A file the device's decoder refuses (nvJPEG leaves some colour layouts, such as CMYK, to the host) is
    decoded on the host and moved there, as DALI's `mixed` decoder does, and `on_host(name)` is told; a file
    neither decodes stops the run (UndecodableFile, naming it): a batch is never made shorter.
    """
    data = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in items]  # a writable copy of each file
    try:
        return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
    except RuntimeError:
        pass  # file by file: the batched call does not say which file it refused
    out = []
    for one, name in zip(data, names, strict=True):
        try:
            out.append(decode_jpeg([one], mode=ImageReadMode.RGB, device=device)[0])
            continue
        except RuntimeError as bad:
            if device.type == "cpu":
                raise UndecodableFile(f"cannot decode {name} on {device}: {_reason(bad)}") from None
            refused = bad
        try:
            out.append(decode_jpeg(one, mode=ImageReadMode.RGB).to(device))
        except RuntimeError:
            raise UndecodableFile(f"cannot decode {name} on {device} or the host: {_reason(refused)}") from None
        on_host(name)
    return out


def augment(images: list[torch.Tensor], size: int, rng: random.Random) -> torch.Tensor:
    """[N, size, size, 3] uint8 on the images' device: each one's random-resized crop, flipped half the time."""
    out = torch.empty((len(images), size, size, 3), dtype=torch.uint8, device=images[0].device)
    for k, img in enumerate(images):
        top, left, h, w = random_resized_crop_box(img.shape[1], img.shape[2], rng)  # the decode producers' crop
        crop = F.resized_crop(img, top, left, h, w, [size, size], antialias=True)
        if rng.random() < 0.5:
            crop = F.horizontal_flip(crop)
        out[k] = crop.permute(1, 2, 0)
    return out


def nvjpeg_missing(device: torch.device) -> str | None:
    """Why this torchvision cannot decode on `device` (None: it can), from decoding a tiny JPEG there."""
    from torchvision.io import encode_jpeg

    tiny = encode_jpeg(torch.zeros((3, 8, 8), dtype=torch.uint8))
    try:
        decode_jpeg([tiny], device=device)
    except (RuntimeError, NotImplementedError) as e:
        return _reason(e)
    return None


def shard_of_rank(producers: int, rank: int, world: int, producer_id: int) -> tuple[int, int]:
    """(index, count) of the folder's shard one producer reads, so the run's producers share one pass."""
    if producers >= world:
        return producer_id // 1000, producers
    return rank, world  # a producer per rank: rank r reads every world-th file from the r-th


class FilesSeen:
    """How often each file reached the step, checked per producer worker: every file once per pass."""

    def __init__(self, owners: dict[int, tuple[int, int]], said=lambda i: None) -> None:
        self.owners = owners  # file index -> (producer shard, worker): the order it is sent in
        self.said = said  # called once for each file a producer skipped
        self.count: collections.Counter = collections.Counter()
        self.skipped: set[int] = set()  # files the producers skip (not JPEGs): no pass brings them
        self.host_decoded: set[str] = set()  # files the device's decoder refused, decoded on the host instead

    def header(self, header) -> None:
        """Note the files a producer says it skipped (its native header's `skipped_files`)."""
        if header is not None:
            for i in header.extras.get("skipped_files", ()):
                if int(i) not in self.skipped:
                    self.skipped.add(int(i))
                    self.said(int(i))

    def add(self, indices: np.ndarray) -> None:
        self.count.update(indices.tolist())

    def on_host(self, name: str) -> None:
        self.host_decoded.add(name)

    def figures(self) -> dict:
        """Files of this rank's shards, those skipped as not JPEGs, delivered, distinct, and whether each of the
        rest came once per pass of the worker that sends it."""
        groups: dict[tuple[int, int], list[int]] = collections.defaultdict(list)
        for i, owner in self.owners.items():
            if i not in self.skipped:
                groups[owner].append(self.count[i])
        even = all(max(c) - min(c) <= 1 for c in groups.values()) and set(self.count) <= set(self.owners)
        return {
            "mine": len(self.owners),
            "skipped": len(self.skipped),
            "delivered": sum(self.count.values()),
            "distinct": len(self.count),
            "once_per_pass": even,
            "decoded_on_host": sorted(self.host_decoded),
        }


@register
class GpuDecode(PythonQueue):
    """python-queue's receiving and accounting, with a decoding thread in place of its pinned-memory prefetcher."""

    declaration = PATH
    depth: ClassVar[int] = 2  # decoded batches ready ahead of the step

    thread: threading.Thread | None = None

    def open(self, ctx) -> None:
        self.ctx = ctx
        cfg = self.cfg
        self.files, _, _ = list_images(cfg.data, None)
        if ctx.device.type == "cuda":
            why = nvjpeg_missing(ctx.device)
            if why:
                raise InputError(f"cannot decode JPEGs on {ctx.device}: this torchvision has no nvJPEG there ({why})")
            self.decoded_on = f"gpu {ctx.device.index} (nvJPEG)"
        else:
            self.decoded_on = "cpu"
        endpoint = ctx.endpoint(cfg, self.name)
        self.consumer = PullConsumer(
            endpoint, True, cfg.hwm, POLL_S, cfg.max_msg_size, cfg.allow_remote, cfg.curve_keys
        )
        self.seen = FilesSeen(self._owners(), self._skipped)
        self.ready: queue.Queue = queue.Queue(maxsize=self.depth)
        self.queue_sizes: list[int] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.side = SideCopy(ctx.device)  # the decode's side stream
        self.start([endpoint])
        self.thread = threading.Thread(target=self._feed, name="gpu-decode", daemon=True)
        self.thread.start()

    def _skipped(self, i: int) -> None:
        print(f"  warning: rank {self.ctx.rank}: skipping {self.cfg.data}/{self.files[i]}: not a JPEG", flush=True)

    def _owners(self) -> dict[int, tuple[int, int]]:
        """Each file this rank's producers read -> (its producer's shard, the worker that sends it)."""
        cfg, ctx = self.cfg, self.ctx
        owners = {}
        for pid in rank_producer_ids(cfg.producers, ctx.rank, ctx.world):
            index, count = shard_of_rank(cfg.producers, ctx.rank, ctx.world, pid)
            for pos, i in enumerate(range(index, len(self.files), count)):
                owners[i] = (index, pos % cfg.producer_workers)
        return owners

    def start(self, endpoints: list[str]) -> None:
        """This rank's share of the run's producers, each reading its shard of the folder undecoded."""
        cfg, ctx = self.cfg, self.ctx
        self.producer_ids = rank_producer_ids(cfg.producers, ctx.rank, ctx.world)
        if cfg.endpoint:
            print(f"  waiting for external producers to connect to {', '.join(endpoints)}", flush=True)
            return
        from runner.producer_group import ProducerGroup, run_producer_command

        read = self.read_config()
        cmds, stats = [], []
        for pid in self.producer_ids:
            stats.append(f"{ctx.tmpdir}/producer-{pid}.json")
            index, count = shard_of_rank(cfg.producers, ctx.rank, ctx.world, pid)
            cmds.append([*run_producer_command(read, endpoints[0], pid, stats[-1]), "--shard", f"{index}/{count}"])
        self.group = ProducerGroup(cmds, endpoints[0], stats).start()

    def _feed(self) -> None:
        """The thread: receive each batch, decode and augment it on the device, queue it for the step."""
        cfg, device = self.cfg, self.ctx.device
        rng = random.Random(f"gpu-decode/{self.ctx.rank}")
        try:
            for arrays in pull(self.consumer, cfg.recv_timeout, self.stop.is_set, headers=self.seen.header):
                items, labels, indices = self._checked(arrays)
                with self.side.on_stream():  # handed to the step like a copy (feeders/device_copy.py)
                    names = [f"{cfg.data}/{self.files[i]}" for i in indices]
                    images = augment(decode_batch(items, device, names, self.seen.on_host), cfg.image_size, rng)
                    host = torch.from_numpy(labels.astype(np.int64))
                    labels_t = to_device([host.pin_memory() if device.type == "cuda" else host], device)[0]
                decoded = self.side.mark([images, labels_t])
                while not self.stop.is_set():
                    try:
                        self.ready.put((decoded, indices), timeout=POLL_S)
                        break
                    except queue.Full:
                        continue
        except BaseException as e:  # handed to the step, which raises it
            self.error = e
            self.ready.put(None)

    def _checked(self, arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(files' bytes, labels, file indices) of a batch from a read producer, or InputError saying what came."""
        ok = len(arrays) == 3 and strings.is_strings(arrays[0]) and len(arrays[0]) == self.cfg.batch
        if not ok or arrays[1].shape != (self.cfg.batch,) or arrays[2].shape != (self.cfg.batch,):
            got = ", ".join(f"{a.dtype}{list(a.shape)}" for a in arrays)
            raise InputError(f"expected {self.cfg.batch} JPEG files, labels and file indices per batch; got {got}")
        bad = [int(i) for i in arrays[2] if not 0 <= i < len(self.files)]
        if bad:
            raise InputError(f"file index {bad[0]} is not one of the {len(self.files)} files in {self.cfg.data}")
        return arrays[0], arrays[1], arrays[2]

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.queue_sizes.append(self.ready.qsize())
        while True:
            try:
                got = self.ready.get(timeout=POLL_S)
                break
            except queue.Empty:
                self.check()
        if got is None:
            e = self.error
            if isinstance(e, ReceiveTimeout):
                raise InputError(str(e)) from None
            raise e
        decoded, indices = got
        images, labels = self.side.hand_over(decoded)  # the step's stream waits for the decode
        self.seen.add(indices)
        return images, labels_of(labels)

    def sampled_stages(self) -> list:
        decoder = {"kind": "torchvision decode_jpeg (batched)", "device": self.decoded_on}
        return [SampledQueue(self.queue_sizes, self.depth), DescribedStage("decoder", decoder)]

    def read_config(self):
        """The run's flags with read producers: this path's, whatever --producer-kind the others use."""
        return replace(self.cfg, producer_kind="read")

    def describe(self) -> dict:
        return {**super().describe(), "batch_maker": batch_maker_of(self.read_config())}

    def result_fields(self) -> dict:
        fields = super().result_fields()
        return {**fields, "files": self.seen.figures()} if fields else fields

    def close(self) -> None:
        if self.thread is not None:
            self.stop.set()
            self.thread.join(timeout=10)
        super().close()  # the producers, then the socket
