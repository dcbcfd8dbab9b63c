"""Sampling a running Python process and its subprocesses with py-spy.

Two recordings run side by side over the same seconds, both ``--nonblocking`` (the target is
never paused) with ``--subprocesses --threads --full-filenames --format raw``:

* with ``--idle``: every thread at every tick, running or not: *wall time*;
* without it: only threads that are on a CPU (or runnable): *CPU time*.

A DataLoader worker reading a JPEG through Pillow spends its time inside ``ImageFile.load``
either decoding (on CPU) or waiting for the file's bytes (off CPU); a stack alone cannot tell
the two apart, the pair of recordings can. ``--full-filenames`` keeps paths whole so that the
source line of a leaf frame (``np.fromfile(...)``, ``cv2.imdecode(...)``) can be read.

The raw format is one line per distinct stack::

    process 12:"python train.py";process 15:"python train.py";thread (15): MainThread;<module> (/x/train.py:9);... 42
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import List, Tuple

from ..errors import DsconvertError, MissingDependencyError

__all__ = ["Frame", "Stack", "parse_raw", "record", "pyspy_path", "PtraceError", "PTRACE_HINT"]

_PROCESS = re.compile(r'process (\d+):"')
_THREAD = re.compile(r"thread \((0x[0-9a-fA-F]+|\d+)\)(?::\s*(.*))?$")
_FRAME = re.compile(r"^(.*) \((.*?)(?::(\d+))?\)$")


class PtraceError(DsconvertError, PermissionError):
    """py-spy may not read the target's memory (ptrace is restricted)."""


@dataclass(frozen=True)
class Frame:
    func: str
    file: str
    line: int = 0


@dataclass(frozen=True)
class Stack:
    """One distinct stack of one thread, ``count`` times in a recording; frames root first."""

    pid: int
    cmdline: str
    thread_id: int
    thread: str
    frames: Tuple[Frame, ...]
    count: int


def _split_processes(text: str) -> Tuple[List[Tuple[int, str]], str]:
    """Leading ``process N:"cmd";`` entries (a command line may hold ``;`` or quotes)."""
    procs: List[Tuple[int, str]] = []
    pos = 0
    while True:
        m = _PROCESS.match(text, pos)
        if not m:
            return procs, text[pos:]
        # the command line ends at the first '";' that is followed by another entry
        end = pos
        search = m.end()
        while True:
            end = text.find('";', search)
            if end < 0:
                return procs, text[pos:]
            rest = text[end + 2:]
            if rest.startswith(("process ", "thread (")) or _FRAME.match(rest.split(";", 1)[0]):
                break
            search = end + 1
        procs.append((int(m.group(1)), text[m.end():end]))
        pos = end + 2


def parse_raw(text: str) -> List[Stack]:
    """Parse py-spy's ``--format raw`` output; unparsable lines are left out."""
    stacks: List[Stack] = []
    for line in text.splitlines():
        line = line.rstrip()
        head, sep, count = line.rpartition(" ")
        if not sep or not count.isdigit():
            continue
        procs, rest = _split_processes(head)
        parts = rest.split(";") if rest else []
        thread_id, thread = 0, ""
        if parts:
            m = _THREAD.match(parts[0])
            if m:
                raw_id = m.group(1)
                thread_id = int(raw_id, 16) if raw_id.startswith("0x") else int(raw_id)
                thread = (m.group(2) or "").strip()
                parts = parts[1:]
        frames = []
        for part in parts:
            fm = _FRAME.match(part)
            if fm:
                frames.append(Frame(fm.group(1), fm.group(2), int(fm.group(3) or 0)))
            elif part:
                frames.append(Frame(part, ""))
        pid, cmd = procs[-1] if procs else (0, "")
        stacks.append(Stack(pid, cmd, thread_id, thread, tuple(frames), int(count)))
    return stacks


def pyspy_path() -> str:
    """The py-spy executable (beside this Python first: a venv's bin is often not on PATH)."""
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    found = here if os.access(here, os.X_OK) else shutil.which("py-spy")
    if not found:
        raise MissingDependencyError(
            "dsconvert diagnose samples Python stacks with py-spy: run `pip install 'dsconvert[diagnose]'`")
    return found


# what to do when ptrace is refused: the one hint py-spy's and strace's errors both give
PTRACE_HINT = ("py-spy and strace need to read the process's memory: run as root or as the same user with "
               "`sudo sysctl kernel.yama.ptrace_scope=0`; in a container, start it with "
               "`--cap-add SYS_PTRACE` (Docker) or the SYS_PTRACE capability (Kubernetes)")


def _start(exe: str, pid: int, seconds: float, rate: int, idle: bool, out: str) -> subprocess.Popen:
    cmd = [exe, "record", "--pid", str(pid), "--duration", str(max(1, int(round(seconds)))), "--rate", str(rate),
           "--format", "raw", "--output", out, "--subprocesses", "--threads", "--full-filenames", "--nonblocking"]
    if idle:
        cmd.append("--idle")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def record(pid: int, seconds: float = 10.0, rate: int = 100) -> Tuple[List[Stack], List[Stack]]:
    """(wall stacks, CPU stacks) of ``pid`` and its subprocesses over ``seconds``."""
    exe = pyspy_path()
    with tempfile.TemporaryDirectory(prefix="dsconvert-diagnose-") as tmp:
        outs = (os.path.join(tmp, "wall.txt"), os.path.join(tmp, "cpu.txt"))
        procs = [_start(exe, pid, seconds, rate, idle, out) for idle, out in zip((True, False), outs)]
        errors = []
        for proc in procs:
            try:
                _, err = proc.communicate(timeout=seconds + 60)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            if proc.returncode != 0:
                errors.append(err.strip())
        texts = []
        for out in outs:
            try:
                with open(out, encoding="utf-8", errors="replace") as f:
                    texts.append(f.read())
            except FileNotFoundError:
                texts.append("")
    if not texts[0]:
        message = next((e for e in errors if e), "py-spy wrote no samples")
        last = message.splitlines()[-1] if message else message
        if re.search(r"ermission denied|not permitted|ptrace", message):
            raise PtraceError(f"py-spy could not attach to process {pid}: {last}. {PTRACE_HINT}")
        raise DsconvertError(f"py-spy could not sample process {pid}: {last}")
    return parse_raw(texts[0]), parse_raw(texts[1])
