"""What each `bertheads` command does once its flags are parsed: one `cmd_*` function a command."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from bertheads.api import audit, combine, distill, load, train_multi
from bertheads.base.errors import UserError
from bertheads.base.extras import require
from bertheads.base.machine import machine, resolve_device, runtimes, training_precision
from bertheads.base.schema import names, said, vars_for
from bertheads.engines.ray_job import SUMMARY, EngineSettings, ray_predict
from bertheads.export.gate import export_checked, gate_model
from bertheads.export.hf import export_hf
from bertheads.export.modes import RuntimeSettings, candidates
from bertheads.inference.calibrate import recalibrate
from bertheads.inference.extract import ExtractSettings, extract
from bertheads.inference.outputs import claimed_output
from bertheads.inference.select import SelectSettings, select
from bertheads.inference.stream import StreamSettings, predict_stream
from bertheads.saved.bundle import MANIFEST, encoder_location
from bertheads.tasks import inference_options
from bertheads.text.readers import check_input_file
from bertheads.training.audit import AuditSettings
from bertheads.training.config import read_config, single_task
from bertheads.training.distill import CONFIG_GROUPS, read_distill_config
from bertheads.training.flags import (
    given_settings,
    settings_from,
    task_class,
    task_options,
)
from bertheads.training.settings import TrainSettings, recipe_of

log = logging.getLogger("bertheads")
DISTILL_NAMES = {n for group in CONFIG_GROUPS for n in names(group)}



# -- handlers --------------------------------------------------------------------------
def report_saved(model, out: str, heads: bool = False) -> None:
    """`saved DIR` on stderr, then the kept dev metrics as one JSON line on stdout (once, from
    the main process under torchrun)."""
    if os.environ.get("RANK", "0") != "0":
        return
    names = f" (heads: {', '.join(model.heads)})" if heads else ""
    log.info(f"saved {out}{names}")
    path = Path(out) / "metrics.json"
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("dev"):
            print(json.dumps({"dev": saved["dev"], "kept": saved.get("kept")}))


def cmd_train(args) -> int:
    """`train KIND` (flags alone, or a config file with flags over it) and `train --config F`."""
    path, kind = getattr(args, "config", None), args.kind
    if kind is None and path is None:
        raise UserError("train: give a task kind (classify, tag, qa, multi --config F) or --config FILE")
    out = getattr(args, "out", None)
    if out is None:
        raise UserError("train --config: --out DIR is required (the model directory to write)")
    if path is not None:
        config = read_config(path, kind, {"train": getattr(args, "train", None), "dev": getattr(args, "dev", None)})
        if kind is not None and not (config.single and config.tasks[0].kind == kind):
            found = config.tasks[0].kind if config.single else "several tasks"
            raise UserError(f"{path}: holds {found}, not a {kind} task; run it with `bertheads train --config "
                            f"{path}`")
    else:
        if not args.train and task_class(kind).spec_type.needs_rows(given_settings(args, kind)):
            raise UserError("the following arguments are required: --train (or --config)")
        config = single_task(kind, args.train, args.dev, {})
    model = train_multi(config, out, **given_settings(args, config.tasks[0].kind if config.single else None))
    report_saved(model, out, heads=not config.single)
    return 0


def cmd_train_multi(args) -> int:
    config = read_config(args.config)
    if args.sampling:
        config.sampling = args.sampling
    if args.temperature is not None:
        config.temperature = args.temperature
    model = train_multi(config, args.out, **given_settings(args))
    report_saved(model, args.out, heads=True)
    return 0


def cmd_distill(args) -> int:
    """`distill TEACHER --data F --out DIR` (or a config file, flags given over it)."""
    given = {**(read_distill_config(args.config) if getattr(args, "config", None) else {}),
             **{k: v for k, v in vars(args).items() if k in DISTILL_NAMES and v is not None}}
    out = getattr(args, "out", None)
    if out is None:
        raise UserError(f"distill: {said('out')} DIR is required (the student's model directory to write)")
    if not given.get("teacher"):
        raise UserError("distill: give the TEACHER model directory (or 'teacher' in --config)")
    teacher = given.pop("teacher")
    model = distill(teacher, out, **given)
    report_saved(model, out, heads=len(model.heads) > 1)
    return 0


def cmd_audit(args) -> int:
    """`audit KIND`: issues.jsonl and summary.json in --out, a line on stderr of what was found."""
    options = {**given_settings(args, args.kind), **vars_for(AuditSettings, args)}
    result = audit(args.kind, args.train, args.dev, args.out, **options)
    s = result.summary
    noise = ", ".join(f"{k} {v:.1%}" for k, v in s["noise_rate"].items())
    log.info(f"wrote {args.out}: {s['flagged']} of {s['units']} {s['unit']}s flagged"
             + (f" (estimated noise: {noise})" if noise else ""))
    return 0


def cmd_select(args) -> int:
    """`select MODEL --pool F -k N --out F`: the chosen inputs, a line on stderr."""
    with claimed_output(args.out, [args.pool, args.gate_data], [args.model_dir], "select", flag="out"):
        check_input_file(args.pool)
        model = load(args.model_dir, **vars_for(RuntimeSettings, args))
        name = model.head_name(args.head)
        chosen = select(model.net, name, args.pool, SelectSettings(**vars_for(SelectSettings, args)), args.out,
                        args.batch_size)
    log.info(f"wrote {args.out}: {len(chosen.records)} of {chosen.pool} inputs ({chosen.strategy}"
             f"{', a cold start' if chosen.cold_start else ''})")
    return 0


def cmd_evaluate(args) -> int:
    check_input_file(args.data)  # before the model is opened (and a lower precision gated)
    model = load(args.model_dir, **vars_for(RuntimeSettings, args))
    settings = StreamSettings(**vars_for(StreamSettings, args), progress=False)
    metrics = model.evaluate(args.data, head=args.head, settings=settings, **given_options(args, "evaluate"))
    if metrics.get("skipped"):
        log.warning(f"skipped {metrics['skipped']} bad record(s) of {args.data}")
    if args.json:
        print(json.dumps(metrics))
    else:
        for key, value in metrics.items():
            if key == "calibration" and isinstance(value, dict):
                print(calibration_text(value))
            elif isinstance(value, float):
                print(f"{key:>16}  {value:.4f}")
            elif not isinstance(value, dict):
                print(f"{key:>16}  {value}")
            else:
                print(f"{key:>16}  {json.dumps(value)}")
    return 0


def calibration_text(c: dict) -> str:
    """evaluate's lines on the scores: ECE, the risk-coverage table, the target's threshold."""
    if c.get("none"):
        return f"{'calibration':>16}  none: {c['none']}"
    t = c.get("temperature")
    lines = [f"{'calibration':>16}  temperature {'none (raw scores)' if t is None else f'{t:.4f}'}, "
             f"ECE {c.get('ece', float('nan')):.4f} over {c.get('rows', 0)} decisions, accuracy "
             f"{c.get('accuracy', float('nan')):.4f}, mean confidence {c.get('mean_confidence', float('nan')):.4f}"]
    for row in c.get("risk_coverage", []):
        lines.append(f"{'':>16}  answering the {row['coverage']:.0%} most confident: accuracy {row['accuracy']:.4f} "
                     f"(confidence >= {row['threshold']:.4f})")
    for row in c.get("metric_coverage", []):
        value = "none" if row["value"] is None else f"{row['value']:.4f}"
        lines.append(f"{'':>16}  answering the {row['coverage']:.0%} most confident inputs: {row['metric']} "
                     f"{value} (input confidence >= {row['threshold']:.4f})")
    target = c.get("target")
    if target:
        if target.get("threshold") is None:
            lines.append(f"{'target':>16}  accuracy {target['target_accuracy']:.4f}: no threshold reaches it")
        else:
            low, high = target["coverage_interval"]
            lines.append(f"{'target':>16}  accuracy {target['target_accuracy']:.4f}: --min-confidence "
                         f"{target['threshold']:.4f} answers {target['coverage']:.1%} of the inputs (95% interval "
                         f"{low:.1%} to {high:.1%}) at accuracy {target['accuracy']:.4f}")
    return "\n".join(lines)


def cmd_predict(args) -> int:
    engine = EngineSettings(**vars_for(EngineSettings, args))
    if engine.engine == "ray":
        if not args.input or not args.output:
            raise UserError("--engine ray: give the Parquet input (--input FILE, FOLDER or GLOB) and the output "
                            "folder (--output DIR)")
        with claimed_output(args.output, [args.input, args.gate_data], [args.model_dir], "predict",
                            marker=SUMMARY):
            options = given_options(args, "predict")
            summary = ray_predict(args.model_dir, args.input, args.output, [args.head] if args.head else None,
                                  RuntimeSettings(**vars_for(RuntimeSettings, args)), engine,
                                  skip_bad_lines=args.skip_bad_lines, batch_size=args.batch_size, options=options)
        log.info(f"{args.output}: {summary['rows']:,} rows in {summary['parts']} parts, {summary['failures']} "
                 f"skipped, {summary['seconds']:.1f} s ({summary['rows_per_second']:,.0f} rows/s)")
        if options.get("min_confidence") is not None:
            log.info(f"abstained on {summary['abstained']} of {summary['predictions']} prediction(s) "
                     f"(top score below --min-confidence {options['min_confidence']})")
        return 0
    with claimed_output(args.output, [args.input, args.gate_data], [args.model_dir], "predict"):
        check_input_file(getattr(args, "input", None))
        model = load(args.model_dir, **vars_for(RuntimeSettings, args))
        options = given_options(args, "predict")
        settings = StreamSettings(**vars_for(StreamSettings, args))
        settings.progress = settings.progress and bool(args.output)  # (a bar beside predictions on stdout would mix)
        name, task = model.bound(args.head, options)
        report = predict_stream(model.net, name, args.input, args.output, settings, args.format, task=task)
    if report.skipped and os.environ.get("RANK", "0") == "0":
        log.warning(f"skipped {report.skipped} bad record(s) of {args.input or '<stdin>'}")
    say_abstained(report, options)
    return 0


def say_abstained(report, options: dict) -> None:
    """The count of abstentions on stderr, when --min-confidence was given."""
    if options.get("min_confidence") is not None:
        log.info(f"abstained on {report.abstained} of {report.examples} input(s) (top score below "
                 f"--min-confidence {options['min_confidence']})")


def cmd_analyze(args) -> int:
    with claimed_output(args.output, [args.input, args.gate_data], [args.model_dir], "analyze"):
        check_input_file(getattr(args, "input", None))
        model = load(args.model_dir, **vars_for(RuntimeSettings, args))
        settings = StreamSettings(**vars_for(StreamSettings, args))  # (progress: log lines where no bar is drawn)
        options = given_options(args, "analyze")
        report = model.analyze_stream(args.input, args.output, settings=settings, **options)
    if report.skipped:
        log.warning(f"skipped {report.skipped} bad record(s) of {args.input or '<stdin>'}")
    say_abstained(report, options)
    return 0


def cmd_export(args) -> int:
    if args.to == "hf":
        if args.quantize or not args.openvino:
            raise UserError(f"{'--quantize' if args.quantize else '--no-openvino'}: only with --to onnx")
        if not args.out:
            raise UserError("--to hf needs --out DIR")
        info = export_hf(args.model_dir, args.out, args.head)
        log.info(f"saved {args.out} ({info['class']} for head {info['head']}; "
                 f"pipeline({info['pipeline']!r}, model={args.out!r}))")
        if info.get("calibration"):
            log.info(info["calibration"])
        return 0
    if args.head:
        raise UserError("--head: only with --to hf (the ONNX graph holds every head)")
    meta = export_checked(args.model_dir, args.out, args.quantize, args.gate_data, say=log.info,
                          openvino=args.openvino)
    graphs = ", ".join(f"{g['file']} ({g['bytes'] / 1e6:.1f} MB)" for g in meta["graphs"].values())
    log.info(f"saved {args.out or os.path.join(args.model_dir, 'onnx')}: {graphs}")
    return 0


def cmd_calibrate(args) -> int:
    results = recalibrate(args.model_dir, args.data, args.out, args.head, args.batch_size)
    for name, c in results.items():
        if c.get("none"):
            log.info(f"{name}: no temperature ({c['none']})")
        elif "ece_before" in c:
            floor = f"; a calibrated model measures about {c['ece_floor']:.4f} on so few rows" if "ece_floor" in c else ""
            fitted = c.get("fitted") or f"temperature {c['temperature']:.4f}"
            log.info(f"{name}: {fitted}; ECE {c['ece_before']:.4f} -> {c['ece_after']:.4f}, "
                     f"Brier {c['brier_before']:.4f} -> {c['brier_after']:.4f} (cross-fitted halves of {args.data}{floor})")
        else:
            log.info(f"{name}: temperature {c['temperature']}")
    log.info(f"saved {args.out}")
    return 0


def cmd_gate(args) -> int:
    """`gate MODEL`: the verdicts `auto` reads, made here and kept in the model folder."""
    check_input_file(args.gate_data)
    records = gate_model(args.model_dir, args.gate_data, say=log.info, device=args.device, verify=args.verify)
    if records is None:
        log.info(f"gate: this machine runs no lower precision of {args.model_dir} ({machine().flag_text()}; "
                 f"bertheads env says why)")
        records = {}
    if args.json:
        print(json.dumps({key: {k: r[k] for k in ("passed", "why", "inputs_per_s", "fp32_inputs_per_s")}
                          for key, r in records.items()}))
    return 0


def cmd_tune(args) -> int:
    require("tune", "bertheads tune")
    from bertheads.training.tune import (  # optuna loads only for this command
        TuneSettings,
        summary,
        table,
        tune,
    )

    settings = settings_from(args)
    settings.resume = False  # tune's --resume continues the search (its trials start afresh)
    search = TuneSettings(**vars_for(TuneSettings, args))  # (its resume: the --resume flag)
    options = task_options(args, args.kind)
    rows = tune(args.kind, args.train, args.dev, args.out, model=args.model, settings=settings,
                search=search, limit=args.limit, **options)
    print(table(rows))
    print(summary(rows))
    return 0


def cmd_report(args) -> int:
    require("report", "bertheads report")
    from bertheads.inference.report import report  # matplotlib loads only for this command

    page = report(args.model_dir, args.data, args.out, head=args.head, batch_size=args.batch_size, audit=args.audit)
    log.info(f"wrote {page}")
    return 0


def cmd_extract(args) -> int:
    model = args.model
    if model not in (None, "", "default") and (Path(model) / MANIFEST).is_file():
        model = encoder_location(model)  # a saved bertheads model: its (fine-tuned) encoder
    settings = ExtractSettings(**vars_for(ExtractSettings, args))
    meta = extract(model, args.input, args.out, settings, args.input_format)
    cut = f", {meta['truncated']} cut at --max-length {meta['max_length']}" if meta["truncated"] else ""
    log.info(f"wrote {args.out}: {meta['texts']} texts, {meta['tokens']} pieces, dim {meta['dim']}{cut}")
    return 0


def cmd_combine(args) -> int:
    model = combine(args.model_dirs, args.out, args.names)
    log.info(f"saved {args.out} (heads: {', '.join(f'{n} ({k})' for n, k in model.heads.items())})")
    return 0


def cmd_serve(args) -> int:
    require("serve", "bertheads serve")
    from bertheads.serve.app import serve, settings_from_args  # the web stack loads only for this command

    serve(args.model_dir, args.host, args.port, settings_from_args(args), options=given_options(args, "serve"),
          **vars_for(RuntimeSettings, args))
    return 0


def environment_facts() -> dict:
    """What `bertheads env` shows: the machine, the runtimes, and what `auto` picks here."""
    m = machine()
    device = resolve_device("auto")
    precision, why = training_precision("auto", device)
    ladder = candidates("auto", "auto", device)
    return {"machine": m.to_dict(), "line": m.line(), "runtimes": runtimes(),
            "training": {"device": str(device), "precision": precision, "why": why,
                         "recipe": recipe_of(TrainSettings())},
            "inference": {"device": str(device), "tried_in_order": [
                {"runtime": r, "precision": p, "why": w} for r, p, w in ladder],
                "without_export": ladder[-1][:2]}}


def cmd_env(args) -> int:
    facts = environment_facts()
    if args.json:
        print(json.dumps(facts))
        return 0
    m = facts["machine"]
    print(facts["line"])
    print(f"torch CPU kernels: {m['capability']}; CUDA devices: {len(m['cuda'])}; MPS: {'yes' if m['mps'] else 'no'}")
    for name, info in facts["runtimes"].items():
        more = info.get("providers") or ", ".join(f"{d} ({' '.join(c)})" for d, c in info.get("devices", {}).items())
        print(f"runtime {name} {info['version']}" + (f": {', '.join(more) if isinstance(more, list) else more}"
                                                     if more else ""))
    t = facts["training"]
    print(f"train --device auto --precision auto: {t['device']}, {t['precision']} ({t['why']})")
    print("train --epochs, --batch-size, --mode and --holdout auto: " + (
        "by the training data's size (--recipe auto; docs/little-data.md)" if t["recipe"] == "auto" else
        "the kinds' fixed defaults (--recipe fixed, from $BERTHEADS_RECIPE)"))
    print(f"predict --device auto --runtime auto --precision auto, on {facts['inference']['device']}, tries in order "
          f"(a lower precision only once it passed the gate on the model's dev data):")
    for step in facts["inference"]["tried_in_order"]:
        print(f"  {step['runtime']} {step['precision']}: {step['why']}")
    return 0


def present(args, *names: str) -> dict:
    """The named options that were given on the command line."""
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def given_options(args, command: str) -> dict:
    """The kinds' inference options given as flags of `command` (see `Parts.options`)."""
    return present(args, *inference_options(command))


