"""Opening a saved model in a mode: the device, the runtime and the precision `--device`,
`--runtime` and `--precision` name, or, for `auto`, the fastest mode on this machine whose lower
precision passed the gate (`export/gate.py`). The order `export.modes.candidates` gives is only
the order in which modes are tried; the gate times each on its inputs, and the fastest wins.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch

from bertheads.base.errors import UserError
from bertheads.base.machine import resolve_device
from bertheads.base.runtimes import runtime_named
from bertheads.base.schema import said
from bertheads.export import gate
from bertheads.export.modes import TOLERANCE, Mode, candidates
from bertheads.export.runtimes import missing_export, open_runner

log = logging.getLogger("bertheads")


def open_model(directory: str | Path, device: str | torch.device | None = "auto", runtime: str = "auto",
               precision: str = "auto", verify: bool = True, gate_data: str | None = None,
               say: Callable[[str], None] | None = None, force: bool = False):
    """(the runner, its `Mode`) of the model in `directory`. `force`: a precision named (not
    auto) runs even when the gate refused it, with a warning."""
    directory = Path(directory)
    say = say or log.info
    where = resolve_device(device)
    ladder = candidates(runtime or "auto", precision or "auto", where)
    asked = runtime not in (None, "auto") and precision not in (None, "auto")
    checks = gate.Gate(directory, where, verify, gate_data, say)  # verdicts made here go to the user's cache
    usable: list[tuple[Mode, float | None]] = []  # each mode that may run, and its measured inputs/s
    passed_over = []
    unchecked = None  # why the mode asked for runs without a verdict
    for r, p, why in ladder:
        mode = Mode(r, p, where, why)
        last = (r, p) == ladder[-1][:2]  # a missing export of the last is said by the runtime itself
        export_cmd = None if asked or last else missing_export(directory, r, p)
        if export_cmd:
            passed_over.append(f"{r} {p}: no export ({export_cmd})")
            continue
        if p not in TOLERANCE:  # fp32: nothing to check; the reference runtime's speed is the gate's
            usable.append((mode, checks.fp32_rate() if runtime_named(r).reference else None))
            continue
        try:
            record = checks.record(mode)
        except gate.NoEvidence as exc:
            if asked or (not usable and last):
                unchecked = f"not checked against fp32: {exc}"
                usable.append((Mode(r, p, where, f"{why}; {unchecked}"), None))
                break
            say(f"auto: {r} {p} not used: {exc}")
            passed_over.append(f"{r} {p}: not checked against fp32: {exc}")
            continue
        if not record["passed"]:
            if force and precision not in (None, "auto"):  # the user accepts the loss
                log.warning(f"{said('force', True)}: running {r} {p}, which the gate refused: {record['why']}")
                usable.append((Mode(r, p, where, f"{why}; forced past the gate: {record['why']}"),
                               record.get("inputs_per_s")))
                continue
            if asked:
                raise UserError(f"{said('runtime', r)} {said('precision', p)}: refused by the gate: {record['why']}; see "
                                f"{directory / gate.GATE} or the user's cache; {said('force', True)} runs it anyway")
            passed_over.append(f"{r} {p}: refused by the gate ({record['why']})")
            continue
        usable.append((Mode(r, p, where, f"{why}; passed the gate: {gate.summary(record)}"),
                       record.get("inputs_per_s")))
    if not usable:
        raise UserError(f"no mode to run {directory} in: {'; '.join(passed_over)}")
    mode, rate = fastest(usable)
    net = open_runner(directory, mode, verify, checks.reference)
    if unchecked:
        say(f"{said('precision', mode.precision)}: {unchecked}")
    if not asked and (len(ladder) > 1 or passed_over):
        say(choice_line(mode, rate, usable))
        for line in passed_over:
            log.debug(f"auto: passed over {line}")
        log.debug(f"auto: {mode.runtime} {mode.precision}: {mode.why}")
    return net, mode


def fastest(usable: list[tuple[Mode, float | None]]) -> tuple[Mode, float | None]:
    """The fastest mode measured on this machine; the first tried when none was measured."""
    measured = [u for u in usable if u[1]]
    return max(measured, key=lambda u: u[1]) if measured else usable[0]


def choice_line(mode: Mode, rate: float | None, usable: list[tuple[Mode, float | None]]) -> str:
    """`auto`'s one line: the mode it runs, its measured rate and the runners-up."""
    checked = ", checked against fp32" if mode.precision in TOLERANCE and rate else ""
    line = f"auto: {mode.runtime} {mode.precision} on {mode.device}"
    if rate:
        others = sorted((u for u in usable if u[1] and u[0] != mode), key=lambda u: -u[1])
        runners_up = ", ".join(f"{m.runtime} {m.precision} {r:.0f}/s" for m, r in others)
        line += f", {rate:.0f} inputs/s here{checked}" + (f" (then {runners_up})" if runners_up else "")
    return line
