"""Where a GPU's time goes for a small encoder (run by bench/gpu_device.sh with DIAG=N):

- inference batches of 64 at many new lengths, the same lengths again, and one length (a cost
  paid per new shape shows as new >> again ~ one), with cuDNN attention allowed and left out;
- a profile of five new-shape batches (the top operators by host and by device time);
- training steps (AutoModelForSequenceClassification, bf16 autocast, fused AdamW): one shape with
  and without reading the loss each step, and new shapes against the same shapes again;
- with N given, bertheads itself: a classify model trained on the first N SST-2 sentences, then
  the 872 dev sentences predicted three times.

    python bench/gpu_diag.py MODEL_DIR [N]      (on the CPU it runs too, as a check of the script)
"""

from __future__ import annotations

import os
import sys
import time

import torch
from transformers import AutoModel, AutoModelForSequenceClassification

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GENERATOR = torch.Generator().manual_seed(0)


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def batch(n: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids, and an attention mask with padding in every row but the first."""
    ids = torch.randint(1000, 29000, (n, length), generator=GENERATOR)
    mask = torch.ones(n, length, dtype=torch.long)
    for i in range(1, n):
        mask[i, max(2, length - (i * 7) % length):] = 0
    return ids.to(DEVICE), mask.to(DEVICE)


def inference(model, lengths: list[int], label: str, n: int = 64) -> None:
    times = []
    for length in lengths:
        ids, mask = batch(n, length)
        sync()
        start = time.perf_counter()
        with torch.inference_mode():
            model(input_ids=ids, attention_mask=mask)
        sync()
        times.append(time.perf_counter() - start)
    print(f"infer {label}: {len(lengths)} batches, mean {1000 * sum(times) / len(times):.1f} ms, "
          f"first {1000 * times[0]:.1f}, max {1000 * max(times):.1f}", flush=True)


def training(model, optimizer, lengths: list[int], read_loss: bool, label: str) -> None:
    sync()
    start = time.perf_counter()
    for length in lengths:
        ids, mask = batch(32, length)
        labels = torch.randint(0, 2, (32,), generator=GENERATOR).to(DEVICE)
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if read_loss:
            float(loss.detach())
    sync()
    seconds = time.perf_counter() - start
    print(f"train {label}: {len(lengths)} steps, {1000 * seconds / len(lengths):.1f} ms/step", flush=True)


def ours(model_dir: str, rows: int) -> None:
    import bertheads

    data = os.environ.get("BERTHEADS_DATA", "../shared/data") + "/sst2/"
    dev = [line.rsplit("\t", 1)[0] for line in open(data + "dev.tsv").read().splitlines()[1:]]
    precision = "bf16" if DEVICE == "cuda" else "fp32"
    settings = bertheads.TrainSettings(epochs=1, batch_size=32, holdout=0, progress=False, precision=precision, device=DEVICE)
    start = time.perf_counter()
    bertheads.train("classify", data + "train.tsv", None, "/tmp/gpu-diag-ours", model=model_dir,
                    settings=settings, limit=rows)
    print(f"ours: train call {time.perf_counter() - start:.2f} s ({rows} rows)", flush=True)
    model = bertheads.load("/tmp/gpu-diag-ours", device=DEVICE, runtime="torch", precision=precision)
    model.predict(dev[:16])
    for attempt in range(3):
        sync()
        start = time.perf_counter()
        model.predict(dev)
        sync()
        print(f"ours: predict {len(dev)} sentences, pass {attempt + 1}: {time.perf_counter() - start:.3f} s",
              flush=True)


def main() -> None:
    model_dir = sys.argv[1]
    print("sdpa backends enabled: flash", torch.backends.cuda.flash_sdp_enabled(),
          "efficient", torch.backends.cuda.mem_efficient_sdp_enabled(),
          "cudnn", torch.backends.cuda.cudnn_sdp_enabled(), flush=True)
    encoder = AutoModel.from_pretrained(model_dir).to(DEVICE, torch.bfloat16).eval()
    inference(encoder, [16], "warm-up")
    inference(encoder, list(range(20, 60)), "new lengths")
    inference(encoder, list(range(20, 60)), "the same lengths again")
    inference(encoder, [64] * 40, "one length")
    if DEVICE == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)
        inference(encoder, list(range(60, 100)), "new lengths, cuDNN attention left out")
        torch.backends.cuda.enable_cudnn_sdp(True)
        inference(encoder, list(range(100, 140)), "new lengths, cuDNN attention allowed again")
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            inference(encoder, list(range(140, 145)), "profiled, new lengths")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12), flush=True)
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=8), flush=True)
    del encoder
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=2).to(DEVICE).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    training(model, optimizer, [16] * 5, True, "warm-up")
    training(model, optimizer, [48] * 60, False, "one length, loss never read")
    training(model, optimizer, [48] * 60, True, "one length, loss read each step")
    training(model, optimizer, list(range(150, 210)), False, "new lengths")
    training(model, optimizer, list(range(150, 210)), False, "the same lengths again")
    if len(sys.argv) > 2:
        ours(model_dir, int(sys.argv[2]))


if __name__ == "__main__":
    main()
