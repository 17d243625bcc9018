"""Child processes for the fault tests without paying for Python's, torch's and transformers'
imports in each (about 6 CPU seconds a child on these machines): one server process imports them
once, then forks a child per command. Each child is a real process of its own: a crash point's
SIGKILL or a test's SIGINT reaches it alone, and its exit status is the one a fresh
`python -m bertheads ...` would have. The server itself runs no torch operation before it forks
(no thread pool to inherit half-made)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")

SERVER = r"""
import json, os, signal, sys, time, traceback
import torch, transformers, safetensors.torch
from transformers import AutoConfig, AutoModel, AutoTokenizer, BertModel
import bertheads, bertheads.api, bertheads.cli.main, bertheads.cli.commands
for name in sys.argv[1:]:  # what the caller's children import besides (mlflow, ...)
    __import__(name)
replies = os.dup(1)
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # the server's own output would mix with the replies

def reply(record):
    os.write(replies, (json.dumps(record) + "\n").encode())

def child(request, rank_env):  # the forked child: the request's command in this process, which then ends
    code = 1
    try:
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if rank_env else os.O_TRUNC)  # ranks share the files
        out = os.open(request["stdout"], flags)
        err = os.open(request["stderr"], flags)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.dup2(os.open(request.get("stdin") or os.devnull, os.O_RDONLY), 0)
        sys.stdin = open(0, closefd=False)
        os.close(replies)
        os.chdir(request["cwd"])
        for name in request["unset"]:
            os.environ.pop(name, None)
        os.environ.update(request["env"])
        os.environ.update(rank_env)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if request.get("script") is not None:
            sys.argv = ["-c", *request["argv"]]
            exec(compile(request["script"], "<script>", "exec"), {"__name__": "__main__"})
            code = 0
        else:
            sys.argv = ["bertheads", *request["argv"]]
            bertheads.cli.main.command()  # ends the process itself
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)

def returncode(status):
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)

def rank_envs(world, port):  # what torchrun's agent sets for each worker of a one-machine run
    base = {"WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world), "ROLE_WORLD_SIZE": str(world),
            "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "TORCHELASTIC_RUN_ID": "forks", "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
            "OMP_NUM_THREADS": "1"}
    return [{**base, "RANK": str(r), "LOCAL_RANK": str(r), "ROLE_RANK": str(r)} for r in range(world)]

for line in sys.stdin:
    request = json.loads(line)
    world = request.get("world")
    envs = rank_envs(world, request["port"]) if world else [{}]
    pids = []
    for rank_env in envs:
        pid = os.fork()
        if pid == 0:
            child(request, rank_env)
        pids.append(pid)
    reply({"pid": pids[0], "pids": pids})
    codes, stop_at = {}, None  # each child's exit status, in the order they ended
    while len(codes) < len(pids):
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            if stop_at is not None and time.monotonic() > stop_at:  # as torchrun: SIGKILL after a grace
                for other in set(pids) - set(codes):
                    os.kill(other, signal.SIGKILL)
            time.sleep(0.02)
            continue
        if pid not in pids:
            continue
        codes[pid] = returncode(status)
        if codes[pid] != 0 and stop_at is None:  # as torchrun's agent: one worker failed, stop the others
            stop_at = time.monotonic() + 10
            for other in set(pids) - set(codes):
                os.kill(other, signal.SIGTERM)
    failed = [code for code in codes.values() if code != 0]
    reply({"returncode": failed[0] if failed else 0, "returncodes": [codes[p] for p in pids]})
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Finished:
    """What `subprocess.run(..., capture_output=True, text=True)` would give."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


class ForkServer:
    """`run(argv)` is `python -m bertheads *argv`, `run_script(code, argv)` is `python -c code *argv`,
    each in a fresh child forked from a server that imported everything once; `start` and
    `finish` split a run for a test that signals the child meanwhile."""

    def __init__(self, work: Path, env: dict[str, str] | None = None, preload: tuple[str, ...] = ()) -> None:
        self.work, self.count = Path(work), 0
        self.work.mkdir(parents=True, exist_ok=True)
        base = {**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                **(env or {})}
        self.base = base
        self.server = subprocess.Popen([sys.executable, "-c", SERVER, *preload], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       env=base, text=True, bufsize=1)
        self.current: tuple[list[str], Path, Path] | None = None

    def start(self, argv: list[str], env: dict[str, str] | None = None, unset: tuple[str, ...] = (),
              script: str | None = None, stdin: str | None = None, cwd: str | Path | None = None,
              world: int | None = None) -> int:
        """Fork a child running `argv`; its process id. With `world`, that many children with
        the environment torchrun gives its workers on one machine (ranks 0 to world - 1, one
        thread each, a free port to meet on), writing to the same output files; when one fails
        the others are killed, as torchrun's agent does."""
        self.count += 1
        out, err = self.work / f"{self.count}.out", self.work / f"{self.count}.err"
        request = {"argv": [str(a) for a in argv], "env": env or {}, "unset": list(unset), "script": script,
                   "stdout": str(out), "stderr": str(err), "stdin": stdin, "cwd": str(cwd or os.getcwd()),
                   "world": world, "port": free_port() if world else None}
        self.server.stdin.write(json.dumps(request) + "\n")
        self.server.stdin.flush()
        self.current = (list(argv), out, err)
        return json.loads(self.read())["pid"]

    def finish(self) -> Finished:
        """Wait for the child `start` forked; what it printed and how it ended."""
        code = json.loads(self.read())["returncode"]
        argv, out, err = self.current
        self.current = None
        return Finished(argv, code, out.read_text(errors="replace"), err.read_text(errors="replace"))

    def run(self, argv: list[str], **options) -> Finished:
        self.start(argv, **options)
        return self.finish()

    def run_script(self, script: str, argv: list[str], **options) -> Finished:
        return self.run(argv, script=script, **options)

    def ranks(self, argv: list[str], world: int = 2, **options) -> Finished:
        """`torchrun --standalone --nproc_per_node WORLD -m bertheads *argv`, the workers forked
        from the server (`start` with `world`); the exit status torchrun gives (the first failed
        worker's)."""
        return self.run(argv, world=world, **options)

    def read(self) -> str:
        line = self.server.stdout.readline()
        if not line:
            raise RuntimeError(f"the fork server ended (exit {self.server.wait()})")
        return line

    def close(self) -> None:
        self.server.stdin.close()
        self.server.wait(timeout=60)
