"""A local build's progress on the console: the workers' tallies, the launcher's lines, and a real build read.

The 20,000-record builds (in process and on 2 worker processes) read the
command's console as a person would, line by line as it arrives; the
default run's twin builds 600 records with a short interval.
"""

import json
import os
import re
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import repo_root
from pipeline.build import launcher
from pipeline.funnel import progress
from tests import images as made

ROOT = repo_root.ROOT
#: Tiny pictures pass every rule but the shorter side's; NSFW and the vocabulary off.
PASSING = ["--set", "vocab_size=0", "--set", "nsfw_threshold=1.0", "--set", "min_shorter_side=0"]


def write_files(directory, files, rows):
    directory.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        numbers = range(f * rows, (f + 1) * rows)
        pq.write_table(pa.table({
            "url": [f"https://e.x/{i}.jpg" for i in numbers],
            "caption": [f"a small test picture number {i}" for i in numbers],
            "jpg": [made.swatch(i) for i in numbers],
        }), directory / f"part-{f:03d}.parquet")
    return str(directory / "*.parquet")


# -- the pieces --------------------------------------------------------------------------------------------


def test_tallies_add_up_on_the_board(tmp_path, monkeypatch):
    monkeypatch.setenv(progress.PROGRESS_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(progress, "FLUSH_SECONDS", 3600.0)  # only a file's end flushes
    board = progress.ProgressBoard(["a", "b"], print, 5)
    board.directory = str(tmp_path)
    progress.tally("judge", records=64, kept=60)
    progress.tally("judge", records=36, kept=30, file="a", file_records=100)
    progress.tally("judge", records=10, kept=10)  # pending: not yet on disk
    board.read(now=1.0)
    assert board.totals.records == {"judge": 100}
    assert board.totals.kept == {"judge": 90}
    assert board.totals.files == {"judge": {"a": 100}}
    progress.tally("judge", records=0, file="b", file_records=10)
    board.read(now=2.0)
    assert board.totals.records["judge"] == 110 and set(board.totals.files["judge"]) == {"a", "b"}


def test_a_line_being_written_is_read_whole_next_time(tmp_path):
    board = progress.ProgressBoard([], print, 5)
    board.directory = str(tmp_path)
    path = tmp_path / "1.jsonl"
    line = json.dumps({"stage": "write", "records": 7, "kept": 0, "files": []})
    path.write_text(line[:10])
    board.read(now=1.0)
    assert board.totals.records == {}
    path.write_text(line + "\n")
    board.read(now=2.0)
    assert board.totals.records == {"write": 7}


def test_the_first_pass_estimates_its_total_from_the_bytes_of_the_files_that_ended():
    totals = progress.Totals()
    totals.add({"stage": "judge", "records": 30}, now=0.0)
    assert progress.progress_line(totals, {"a": 1000, "b": 3000}, now=0.5) == (
        "pass 1, reading and judging: 0 of 2 files, 30 records")  # no rate from the first line alone
    totals.add({"stage": "judge", "records": 120, "files": [["a", 100]]}, now=10.0)
    line = progress.progress_line(totals, {"a": 1000, "b": 3000}, now=12.0)
    # 100 records in a's 1,000 bytes: ~400 in all; 120 done in 10 s since the first line, 250 to go
    assert line == "pass 1, reading and judging: 1 of 2 files, 150 records of ~400, 12 records/s, ETA 0:21"
    totals.add({"stage": "judge", "records": 250, "files": [["b", 300]]}, now=20.0)
    assert progress.progress_line(totals, {"a": 1000, "b": 3000}, now=25.0) == (
        "pass 1, reading and judging: 2 of 2 files, 400 records of ~400, 18 records/s, done in 0:20")


def test_no_estimate_before_a_file_ended_or_without_sizes():
    totals = progress.Totals()
    totals.add({"stage": "judge", "records": 0}, now=0.0)
    totals.add({"stage": "judge", "records": 50}, now=5.0)
    assert progress.progress_line(totals, {"a": 10, "b": 20}, now=5.0) == (
        "pass 1, reading and judging: 0 of 2 files, 50 records, 10 records/s")
    totals.add({"stage": "judge", "files": [["a", 50]]}, now=5.0)
    assert "~" not in progress.progress_line(totals, {"a": 10, "gs://b/c": None}, now=5.0)


def test_the_second_pass_counts_against_what_the_first_kept():
    totals = progress.Totals()
    totals.add({"stage": "judge", "records": 1000, "kept": 800, "files": [["a", 1000]]}, now=0.0)
    totals.add({"stage": "write", "records": 0}, now=10.0)
    totals.add({"stage": "write", "records": 200}, now=20.0)
    assert progress.progress_line(totals, {"a": 1}, now=30.0) == (
        "pass 2, writing: 200 records of at most 800 kept, 20 records/s, ETA 0:30")


def test_durations_read_as_clock_time():
    assert progress.format_duration(59.6) == "1:00"
    assert progress.format_duration(3725) == "1:02:05"


def test_without_the_variable_a_tally_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(progress.PROGRESS_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    progress.tally("judge", records=5, file="x", file_records=5)
    assert list(tmp_path.iterdir()) == []


def test_the_board_puts_the_environment_back_and_removes_its_directory(monkeypatch):
    monkeypatch.delenv(progress.PROGRESS_DIR_ENV, raising=False)
    with progress.ProgressBoard([], print, 5) as board:
        directory = os.environ[progress.PROGRESS_DIR_ENV]
        assert directory == board.directory and os.path.isdir(directory)
    assert progress.PROGRESS_DIR_ENV not in os.environ and not os.path.exists(directory)
    with progress.ProgressBoard([], print, 0):  # 0: no board at all
        assert progress.PROGRESS_DIR_ENV not in os.environ


# -- a real build ------------------------------------------------------------------------------------------


def progress_lines(text):
    return [line for line in text.splitlines() if line.startswith("pass ")]


def test_a_local_build_shows_both_passes_and_quiet_silences_them(tmp_path, capsys):
    pattern = write_files(tmp_path / "in", files=6, rows=100)
    launcher.run(["--input", pattern, "--output", str(tmp_path / "out"), *PASSING, "--progress_seconds", "0.01"])
    shown = progress_lines(capsys.readouterr().out)
    judging = [line for line in shown if line.startswith("pass 1, reading and judging:")]
    writing = [line for line in shown if line.startswith("pass 2, writing:")]
    assert judging and writing, shown
    assert all(" of 6 files, " in line for line in judging)
    assert all(re.search(r"\b[\d,]+ records?\b", line) for line in shown)  # a rate once a pass has counted 1 s
    assert all(" of at most 600 kept" in line for line in writing)  # every record passed the first pass
    launcher.run(["--input", pattern, "--output", str(tmp_path / "quiet"), *PASSING, "--progress_seconds", "0.01",
                  "--quiet"])
    assert progress_lines(capsys.readouterr().out) == []


def test_a_bad_interval_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pipeline.build", "--input", "x", "--output", str(tmp_path / "o"),
                           "--progress_seconds", "-1"], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2"), timeout=120)
    assert done.returncode == 2
    assert "--progress_seconds" in done.stderr and "Traceback" not in done.stderr


def read_console(command, timeout=900):
    """The command's stdout line by line with the second each line arrived, and its exit code."""
    started = time.monotonic()
    child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2"))
    lines = [(time.monotonic() - started, line.rstrip("\n")) for line in child.stdout]
    child.wait(timeout=timeout)
    return lines, child.returncode, child.stderr.read()


@pytest.mark.integration
@pytest.mark.parametrize("workers", [0, 2])
def test_twenty_thousand_records_show_progress_and_an_eta(tmp_path, workers):
    pattern = write_files(tmp_path / "in", files=20, rows=1000)
    beam = ["--direct_running_mode=multi_processing", f"--direct_num_workers={workers}"] if workers else []
    lines, code, errors = read_console([sys.executable, "-m", "pipeline.build", "--input", pattern, "--output",
                                        str(tmp_path / "out"), *PASSING, "--progress_seconds", "2", *beam])
    assert code == 0, errors[-2000:]
    shown = [(when, line) for when, line in lines if line.startswith("pass ")]
    judging = [line for _, line in shown if line.startswith("pass 1")]
    assert judging and any(" of 20 files, " in line and "records/s, ETA " in line for line in judging), shown
    assert judging[-1].startswith("pass 1, reading and judging: 20 of 20 files, 20,000 records") and (
        "done in " in judging[-1])
    assert any(line.startswith("pass 2, writing:") for _, line in shown), shown
    gaps = [b - a for (a, _), (b, _) in zip(shown, shown[1:])]
    assert all(gap >= 1.5 for gap in gaps), gaps  # at most a line every --progress_seconds (pipe jitter aside)
    assert any("20,000 input records" in line for _, line in lines)
