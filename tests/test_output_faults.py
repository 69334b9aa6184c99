"""Every ending leaves its results, and a write the disk refuses fails whole.

* a run whose worker dies keeps a final checkpoint and a summary, both labelled
  "failed", and the error says what was kept;
* the event log is appended a whole batch or nothing: a refused write is cut back to the
  last whole line; a partial line a crash left is cut when the log is opened again (a
  resume); the reader skips a damaged line with a warning and reads on;
* a full out disk (a small tmpfs, ``unshare -m``) and a vanished out folder end
  ``hogkit run`` with exit 1 and one line naming the file;
* a damaged checkpoint given to ``--resume`` is exit 1 (the run cannot go on), not usage.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

import hogkit
from hogkit import WorkerFailed, train
from hogkit import workloads
from hogkit.cli import main
from hogkit.errors import DamagedFile, OutputFailed
from hogkit.report import EventLog, read_events
from hogkit.state.checkpoint import read
from helpers.faulty import Faulty

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def hot():
    return workloads.get("mf", preset="hot")


@pytest.mark.process
@pytest.mark.faults
@pytest.mark.timeout(120)
def test_a_failed_run_keeps_a_final_checkpoint_and_a_summary(tmp_path):
    out = str(tmp_path / "run")
    with pytest.raises(WorkerFailed) as info:
        train(Faulty(hot(), rank=1, step=400, fault="sigkill"), workers=2,
              outputs=hogkit.Outputs(out, progress=False, checkpoint_every=None),
              steps=10**7)
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "kept: the parameters at the end" in notes and "--resume" in notes
    arrays, meta = read(os.path.join(out, "checkpoint.npz"))
    assert meta["ended"] == "failed" and meta["consistency"] == "quiesced"
    assert meta["updates"] > 0
    assert all(np.isfinite(a).all() for a in arrays.values())
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    assert summary["ended"]["how"] == "failed"
    assert summary["ended"]["error"].startswith("worker 1 was killed by SIGKILL")
    events = read_events(os.path.join(out, "events.jsonl"))
    assert [e["type"] for e in events if e["type"] in ("failure", "end")] == ["failure", "end"]
    assert events[-1]["ended"] == "failed"


def test_a_refused_write_is_cut_back_to_the_last_whole_line(tmp_path):
    """RLIMIT_FSIZE makes the kernel refuse the bytes past a size (EFBIG), part-way
    through a batch: the file keeps its whole lines only."""
    import resource
    import signal
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    log.write([{"type": "start", "i": 0}])
    size = path.stat().st_size
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 100, old[1]))
    try:
        with pytest.raises(OutputFailed, match="events.jsonl: the disk is full") as info:
            log.write([{"type": "update", "i": i} for i in range(50)])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert info.value.errno == errno.EFBIG
    assert path.stat().st_size == size
    log.write([{"type": "end"}])
    log.close()
    assert [e["type"] for e in read_events(path)] == ["start", "end"]


def test_a_partial_last_line_is_cut_when_the_log_is_opened_again(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"type":"start"}\n{"type":"upd')
    log = EventLog(path)
    assert log.repaired == len(b'{"type":"upd')
    log.write([{"type": "resume"}])
    log.close()
    assert path.read_bytes() == b'{"type":"start"}\n{"type":"resume"}\n'
    assert [e["type"] for e in read_events(path)] == ["start", "resume"]


def test_the_reader_reports_a_damaged_line_and_reads_on(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"type":"start"}\n{"type":"upd{"type":"resume"}\n{"type":"end"}\n')
    with pytest.warns(DamagedFile, match=r"1 damaged line\(s\) skipped \(line 2\)"):
        events = read_events(path)
    assert [e["type"] for e in events] == ["start", "end"]
    path.write_bytes(b'{"type":"start"}\n')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_events(path) == [{"type": "start"}]


@pytest.mark.process
def test_a_damaged_checkpoint_to_resume_is_a_failed_run_not_usage(tmp_path, capsys):
    folder = tmp_path / "old"
    assert main(["run", "--steps", "2000", "--out", str(folder), "--no-progress"]) == 0
    (folder / "checkpoint.npz").write_bytes(b"PK\x03\x04 truncated")
    capsys.readouterr()
    rc = main(["run", "--steps", "100", "--resume", str(folder), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "not a readable hogkit checkpoint" in err and "Traceback" not in err


def _can_mount_tmpfs():
    if not shutil.which("unshare"):
        return False
    r = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
                       capture_output=True, timeout=30)
    return r.returncode == 0


@pytest.mark.process
@pytest.mark.faults
@pytest.mark.timeout(180)
def test_a_full_out_disk_ends_the_run_with_one_line_and_whole_lines(tmp_path):
    if not _can_mount_tmpfs():
        pytest.skip("unshare -m + mount tmpfs not permitted here")
    mnt = tmp_path / "small"
    mnt.mkdir()
    out = mnt / "out"
    script = (f"mount -t tmpfs -o size=3m tmpfs {mnt} && {sys.executable} -m hogkit.cli run "
              f"--workload mf -o preset=hot --seconds 60 --events all --no-progress "
              f"--out {out}; rc=$?; mkdir -p {tmp_path}/kept && cp -a {out}/. "
              f"{tmp_path}/kept/; exit $rc")
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], env=ENV,
                       capture_output=True, text=True, timeout=150)
    assert r.returncode == 1, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if "cannot write" in ln]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "events.jsonl: the disk is full" in lines[0], lines[0]
    assert "MiB free there" in lines[0] and "--out" in lines[0]
    data = (tmp_path / "kept" / "events.jsonl").read_bytes()
    assert data.endswith(b"\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")               # no damaged line at all
        assert read_events(tmp_path / "kept" / "events.jsonl")[0]["type"] == "start"


@pytest.mark.process
@pytest.mark.faults
@pytest.mark.timeout(120)
def test_a_vanished_out_folder_ends_the_run_with_one_line(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "hogkit.cli", "run", "--seconds", "4",
                             "--no-progress", "--out", str(out)], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (out / "events.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    shutil.rmtree(out)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 1, err[-2000:]
    assert "its folder is gone" in err and "Traceback" not in err, err[-2000:]
