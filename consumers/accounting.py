"""Exact per-producer accounting from the native header's sequence numbers.

ZMQ keeps order on each connection, so for every producer the sequence
numbers must arrive in order: a jump is loss, a repeat a duplicate, and a
fresh 0 after a stream a producer that was restarted. The first number seen
from a producer is where this consumer joined its stream (`joined_at`), not
loss: the batches before it went to an earlier consumer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NATIVE_ROW = ("producer", "received", "lost", "duplicated", "restarts")  # the native receive core's per-producer row


def native_rows(rows) -> list[dict]:
    """The per-producer rows the native receive core counts (the op's and the receiver's), as the report's dicts."""
    return [dict(zip(NATIVE_ROW, map(int, row), strict=True)) for row in rows]


@dataclass
class ProducerCount:
    """What one producer id has delivered so far."""

    received: int = 0
    lost: int = 0
    duplicated: int = 0
    restarts: int = 0
    next_seq: int = 0
    joined_at: int = -1  # the first seq seen from this producer; -1 before any
    last_sent: int = -1  # the producer's own count of batches sent, from its telemetry
    extras: dict = field(default_factory=dict)


class SeqTracker:
    """Counts received, lost, duplicated and restarted streams per producer."""

    def __init__(self) -> None:
        self.producers: dict[int, ProducerCount] = {}

    def add(self, producer_id: int, seq: int, extras: dict | None = None) -> None:
        c = self.producers.setdefault(producer_id, ProducerCount())
        c.received += 1
        if c.joined_at < 0:
            c.joined_at = seq
        elif seq == c.next_seq:
            pass
        elif seq > c.next_seq:
            c.lost += seq - c.next_seq
        elif seq == 0:
            c.restarts += 1
        else:
            c.duplicated += 1
            return
        c.next_seq = seq + 1
        if extras:
            c.extras = extras
            c.last_sent = int(extras.get("sent", c.last_sent))

    def table(self) -> list[dict]:
        """One row per producer, for reports."""
        return [
            {
                "producer": pid,
                "received": c.received,
                "lost": c.lost,
                "duplicated": c.duplicated,
                "restarts": c.restarts,
                "joined_at": c.joined_at,
            }
            for pid, c in sorted(self.producers.items())
        ]


class StreamTracker:
    """Batches that carry (stream, seq) through an engine's pipeline (tf.data service, Ray Data).

    A stream is one worker's pass over the source, named by a random id drawn
    when the pass starts and numbered here in order of first arrival; seq is the
    batch's index in the source. `shared=False`: each stream runs the whole
    source (the tf.data service's `off` mode), so each is counted as a
    producer is (`SeqTracker`). `shared=True`: the streams split one source
    between them (dynamic sharding, Ray Data's blocks), so every seq must arrive
    once overall; each stream is increasing, and a seq below every stream's
    latest that has not arrived never will (`missing`). A stream whose worker
    is gone (`ended`) no longer holds that frontier back: what it had taken
    and not delivered counts as missing once the others pass it.
    """

    def __init__(self, shared: bool) -> None:
        self.shared = shared
        self.ids: dict[int, int] = {}
        self.streams = SeqTracker()
        self.seen: set[int] = set()
        self.duplicated = 0
        self.latest: dict[int, int] = {}
        self.arrivals = 0  # batches received, all streams together
        self.last_at: dict[int, int] = {}  # stream -> `arrivals` at its latest batch

    @property
    def producers(self) -> dict[int, ProducerCount]:
        return self.streams.producers

    def add(self, stream: int, seq: int) -> None:
        sid = self.ids.setdefault(stream, len(self.ids))
        self.arrivals += 1
        self.last_at[sid] = self.arrivals
        if not self.shared:
            self.streams.add(sid, seq)
            return
        c = self.streams.producers.setdefault(sid, ProducerCount())
        c.received += 1
        if c.joined_at < 0:
            c.joined_at = seq
        if seq in self.seen:
            self.duplicated += 1
            c.duplicated += 1
        else:
            self.seen.add(seq)
        self.latest[sid] = seq

    def table(self) -> list[dict]:
        """One row per stream (as `SeqTracker.table`; with `shared`, loss is counted overall in `overall`)."""
        return self.streams.table()

    def ended(self, workers_gone: int, arrivals_then: int) -> list[int]:
        """The streams of `workers_gone` workers seen gone when `arrivals_then` batches had arrived: of the
        streams silent through the later half of the batches since then, the `workers_gone` silent longest. A
        live worker's pass goes on delivering; a dead one's may still hand over, just after, what the client
        had taken from it before it died."""
        quiet_since = arrivals_then + (self.arrivals - arrivals_then) // 2
        silent = sorted((at, sid) for sid, at in self.last_at.items() if at <= quiet_since)
        return sorted(sid for _, sid in silent[: max(workers_gone, 0)])

    def overall(self, ended: list[int] | tuple = ()) -> dict | None:
        """With `shared`: batches received, distinct seqs, those that came twice, and those that never will
        (below the latest seq of every stream but the `ended` ones)."""
        if not self.shared or not self.latest:
            return None
        live = [seq for sid, seq in self.latest.items() if sid not in ended] or self.latest.values()
        frontier = min(live)
        below = sum(1 for s in self.seen if s <= frontier)
        return {
            "received": sum(c.received for c in self.producers.values()),
            "distinct": len(self.seen),
            "duplicated": self.duplicated,
            "missing": frontier + 1 - below,
        }
