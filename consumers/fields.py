"""The result fields several input paths share: each path's declaration lists those its halves make.

A field's schema is the merged value's, as a result file holds it (core/result_fields.py).
"""

from __future__ import annotations

from core.result_fields import ResultField, every_row, per_rank, summed_with_ranks

PRODUCERS = ResultField(
    "producers",
    {
        "type": "array",
        "description": "per producer (torch: and rank): what arrived, went missing or came twice, from sequence "
        "numbers",
        "items": {"type": "object", "required": ["producer", "received", "lost", "duplicated"]},
    },
    every_row,
)
BATCHES_PULLED = ResultField(
    "batches_pulled",
    {"type": "integer"},
    summed_with_ranks,
    also={"batches_pulled_per_rank": {"type": "array", "items": {"type": "integer"}}},
)
DECODED_ON = ResultField(
    "decoded_on",
    {
        "type": "array",
        "description": "torch dali, gpu-decode and --producer-kind dali: where each rank decoded (cpu, or the GPU "
        "and its decoder)",
    },
    per_rank("on"),
)
# What a producer-fed path's halves add: what each producer delivered, the batches taken, where DALI producers decoded.
PRODUCER_FED = (PRODUCERS, BATCHES_PULLED, DECODED_ON)
