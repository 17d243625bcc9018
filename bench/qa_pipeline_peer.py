"""The pipeline("question-answering") peer, run by bench/qa.py with the Python of
bench/.venv-qa-peer (transformers 4.57: transformers 5 dropped this pipeline).

Reads `{"questions": [{"question", "context"}, ...], "model": DIR, "max_answer_len": N}` from
the JSON file named on the command line; writes `{"seconds", "answers", "transformers",
"torch", "threads"}` to the second file. The model load and one warm-up question are not timed.
"""

from __future__ import annotations

import json
import sys
import time


def main(job_path: str, out_path: str) -> None:
    import torch
    import transformers
    from transformers import pipeline

    transformers.logging.set_verbosity_error()
    job = json.loads(open(job_path, encoding="utf-8").read())
    pipe = pipeline("question-answering", model=job["model"], tokenizer=job["model"], device=-1)
    options = {"max_answer_len": job["max_answer_len"], "doc_stride": job["stride"], "max_seq_len": job["max_length"],
               "max_question_len": job["max_question_length"]}
    questions = job["questions"]
    pipe(question=questions[0]["question"], context=questions[0]["context"], **options)  # warm-up
    start = time.perf_counter()
    got = pipe(question=[q["question"] for q in questions], context=[q["context"] for q in questions], **options)
    seconds = time.perf_counter() - start
    if isinstance(got, dict):
        got = [got]
    answers = [{"answer": g["answer"], "start": int(g["start"]), "end": int(g["end"])} for g in got]
    result = {"seconds": seconds, "answers": answers, "transformers": transformers.__version__,
              "torch": torch.__version__, "threads": torch.get_num_threads()}
    with open(out_path, "w", encoding="utf-8") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
