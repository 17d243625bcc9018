"""Opening a saved model in a mode: the device, the runtime and the precision `--device`,
`--runtime` and `--precision` name, or, for `auto`, the fastest this machine runs whose lower
precision passed the gate (`export/gate.py`), tried in the order `export.modes.candidates` gives.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch

from bertheads.base.errors import UserError
from bertheads.base.machine import DTYPES, resolve_device
from bertheads.base.schema import said
from bertheads.export import gate
from bertheads.export.modes import GRAPH_OF, TOLERANCE, Mode, candidates
from bertheads.export.runtimes import has_graph, open_runner
from bertheads.saved import bundle

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
    records = gate.read_records(directory)
    reference = None
    passed_over = []
    for r, p, why in ladder:
        mode = Mode(r, p, where, why)
        unchecked, record = None, None
        if r != "torch" and runtime in (None, "auto") and not has_graph(directory, GRAPH_OF[(r, p)]):
            passed_over.append(f"{r} {p}: no export (bertheads export {directory} --to onnx"
                               f"{' --quantize int8' if p == 'int8' else ''})")
            continue
        if p in TOLERANCE:
            record = records.get(mode.key)
            if record is None:
                data = gate.gate_data(directory, bundle.read_manifest(directory)["heads"], gate_data)
                if data is None:
                    if asked or (r, p) == ladder[-1][:2]:
                        unchecked = (f"--precision {p}: not checked against fp32 (no dev data recorded with the "
                                     f"model; --gate-data FILE checks it)")
                    else:
                        passed_over.append(f"{r} {p}: not checked against fp32 (no dev data; --gate-data FILE)")
                        continue
                else:
                    if reference is None:
                        reference = bundle.load(directory, where, verify)
                    say(f"checking {r} {p} against fp32 on {', '.join(sorted(set(data.values())))} ...")
                    candidate = open_runner(directory, mode, verify) if r != "torch" else None
                    if candidate is None:  # torch: the same weights, cast to the lower precision
                        candidate = bundle.load(directory, where, verify)
                        candidate.set_inference_dtype(DTYPES.get(p))
                    record = gate.verdict(directory, mode, gate.compare(reference, candidate, data))
                    gate.store(directory, mode.key, record, say)
            if record is not None and not record["passed"]:
                line = f"{r} {p} changes the dev metric by more than {TOLERANCE[p]} points ({gate.summary(record)})"
                if force and precision not in (None, "auto"):
                    log.warning(f"{said('force', True)}: running {line}")
                    mode = Mode(r, p, where, f"{why}; forced past the gate: {gate.summary(record)}")
                elif asked:
                    raise UserError(f"--runtime {r} --precision {p}: refused: {line}; see {directory / gate.GATE}; "
                                    f"{said('force', True)} runs it anyway")
                else:
                    passed_over.append(line)
                    continue
            elif record is not None:
                mode = Mode(r, p, where, f"{why}; passed the gate: {gate.summary(record)}")
        net = open_runner(directory, mode, verify, reference if r == "torch" else None)
        if unchecked:
            say(unchecked)
        if not asked and (len(ladder) > 1 or passed_over):
            checked = ", checked against fp32 on the dev set" if record is not None and record["passed"] else ""
            say(f"auto: {r} {p} on {where}{checked} (-v says why)")
            log.debug(f"auto: {r} {p} on {where} ({mode.why})"
                      + (f"; passed over: {'; '.join(passed_over)}" if passed_over else ""))
        return net, mode
    raise UserError(f"no mode to run {directory} in: {'; '.join(passed_over)}")
