"""Batch order: training batches grouped by length (then shuffled as groups) and shared between
processes; inference batches sorted by length and capped in examples and tokens; how many run
side by side on a CPU (`compute.runner.run_heads` runs them)."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

import torch


def length_grouped_batches(
    lengths: Sequence[int], batch_size: int, seed: int, group_factor: int = 50,
    groups: Sequence | None = None,
) -> list[list[int]]:
    """Training batches of similar lengths: shuffle, sort within chunks of
    `batch_size * group_factor` examples, cut into batches, shuffle the batches. With `groups`
    (a group id per example) the examples of one group stay together in one batch (a group of
    more than `batch_size` makes a batch of its own)."""
    rng = random.Random(seed)
    if groups is None:
        units = [[i] for i in range(len(lengths))]
    else:
        members: dict = {}
        for i, g in enumerate(groups):
            members.setdefault(g, []).append(i)
        units = list(members.values())
    rng.shuffle(units)
    chunk = batch_size * group_factor
    batches: list[list[int]] = []
    start = 0
    while start < len(units):
        end, size = start, 0
        while end < len(units) and size < chunk:
            size += len(units[end])
            end += 1
        part = sorted(units[start:end], key=lambda u: -max(lengths[i] for i in u))
        current: list[int] = []
        for unit in part:
            if current and len(current) + len(unit) > batch_size:
                batches.append(current)
                current = []
            current.extend(unit)
        if current:
            batches.append(current)
        start = end
    rng.shuffle(batches)
    return batches


# Inference batches: at most this many examples and this many (padded) tokens. Measured on
# 2 CPU cores with the default checkpoint (bench/RESULTS.md): SST-2 sentences ran fastest at
# 32-64 a batch, SQuAD windows of 384 tokens at about 5 a batch (2048 tokens; 16k tokens was
# 25% slower); larger batches leave the CPU caches.
INFERENCE_BATCH = 64
INFERENCE_TOKENS = 2048


def sorted_batches(lengths: Sequence[int], batch_size: int, max_tokens: int | None = None) -> list[list[int]]:
    """Inference batches in order of length (longest first); `max_tokens` caps padded size."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        width = lengths[current[0]] if current else lengths[i]
        if current and (len(current) >= batch_size or (max_tokens and width * (len(current) + 1) > max_tokens)):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


# At most this many batches in flight on a CPU: each holds its own activations, so memory
# grows with their number; beyond it, each worker gets several threads instead.
MAX_CPU_WORKERS = 8


def cpu_workers(device: torch.device, batches: int) -> tuple[int, int]:
    """How many batches run at once, and with how many torch threads each.

    On a CPU, one batch per torch thread, each single-threaded (up to `MAX_CPU_WORKERS`
    batches; past that, the threads are shared out among them). Short inputs make small
    matrices, and a small matrix product split across cores spends a good part of its time
    waiting; separate batches on separate cores do not (about 9% more sentences per second on
    2 cores, bench/RESULTS.md). The thread count is per thread, so the caller's own setting
    is untouched. `torch.set_num_threads(1)` before a call keeps it serial.
    """
    threads = torch.get_num_threads()
    if device.type != "cpu" or batches < 2 or threads < 2:
        return 1, threads
    workers = min(threads, batches, MAX_CPU_WORKERS)
    return workers, max(1, threads // workers)


def shard(batches: list[list[int]], rank: int, world: int) -> Iterator[list[int]]:
    """The batches one process of `world` takes (all of them when running alone)."""
    usable = len(batches) - len(batches) % world if world > 1 else len(batches)
    yield from batches[rank:usable:world]


