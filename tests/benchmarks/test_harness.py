"""The benchmark harness (``benchmarks.harness``): CPU of the whole process tree, turns, medians, the sample's build."""

import json
import sys
import time

from benchmarks import harness, record

#: A child that burns CPU, and a grandchild it waits for that burns as much: the tree's CPU is both.
BURN = "import time\nstart = time.process_time()\nwhile time.process_time() - start < {seconds}: pass\n"
TREE = BURN + "import subprocess, sys\nsubprocess.run([sys.executable, '-c', {child!r}], check=True)\n"


def test_a_child_command_counts_its_cpu_and_what_it_reaped_not_the_parent():
    done = harness.run_command([sys.executable, "-c", TREE.format(seconds=0.2, child=BURN.format(seconds=0.2))],
                               capture_output=True)
    assert done.returncode == 0, done.stderr
    assert done.cpu_s >= 0.4  # the child's 0.2 and its grandchild's 0.2
    assert done.wall_s >= done.cpu_s * 0.5  # one core at most for each, one after the other
    assert len(done.load_before) == len(done.load_after) == 3


def test_a_block_counts_this_process_and_its_reaped_children_apart():
    with harness.Timer() as timer:
        exec(BURN.format(seconds=0.2))
        harness.run_command([sys.executable, "-c", BURN.format(seconds=0.2)], check=True)
    assert timer.self_s >= 0.2 and timer.children_s >= 0.2
    assert timer.cpu_s == timer.self_s + timer.children_s
    assert timer.wall_s >= 0.2


def test_arms_take_turns_and_report_each_run():
    calls, reports = [], []

    def arm(name):
        def run():
            calls.append(name)
            return len(calls)
        return run

    results = harness.interleaved({"a": arm("a"), "b": arm("b")}, 3,
                                  lambda name, repeat, result: reports.append((name, repeat, result)))
    assert calls == ["a", "b", "a", "b", "a", "b"]
    assert results == {"a": [1, 3, 5], "b": [2, 4, 6]}
    assert reports[:3] == [("a", 0, 1), ("b", 0, 2), ("a", 1, 3)]


def test_medians_and_repeated_passes():
    runs = [{"wall_s": 3.0, "cpu_s": 1.0}, {"wall_s": 1.0, "cpu_s": 5.0}, {"wall_s": 2.0, "cpu_s": 2.0}]
    assert harness.medians(runs, ("wall_s", "cpu_s")) == {"wall_s": 2.0, "cpu_s": 2.0}
    passes = []
    timing = harness.timed(lambda: passes.append(time.perf_counter()) or len(passes), 4)
    assert timing.result == 4 and len(timing.walls) == len(timing.cpus) == 4
    calls = []
    assert harness.cpu_ms_per_item(lambda: calls.append(1), 10, 3) >= 0
    assert len(calls) == 4  # one untimed pass first
    calls.clear()
    cpu, wall = harness.cpu_ms_per_item(lambda: calls.append(1), 10, 3, warmup=False, wall=True)
    assert len(calls) == 3 and cpu >= 0 and wall >= 0


def test_the_sample_is_built_with_its_overrides_and_evaluation_set(tmp_path):
    sample = tmp_path / "sample"
    sample.mkdir()
    (sample / "sample_info.json").write_text(json.dumps(
        {"build_overrides": ["vocab_size=0", "num_clusters=16"], "eval_images": "sample_eval=eval/test"}))
    args = harness.sample_build_args(str(sample), "OUT")
    assert args == ["--input", f"{sample}/candidates/*.parquet", "--output", "OUT", "--preset", "align",
                    "--set", "vocab_size=0", "--set", "num_clusters=16",
                    "--eval_images", f"sample_eval={sample}/eval/test"]
    assert "--eval_images" not in harness.sample_build_args(str(sample), "OUT", eval_images=False)


def test_the_machine_names_its_vector_instruction_sets():
    machine = record.machine()
    assert set(machine["instruction_sets"]) <= set(record.INSTRUCTION_SETS)
    assert machine["cpu_model"] and machine["cpus"] >= 1
