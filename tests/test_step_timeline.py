"""benchmarks.step_timeline's split of a step's time, on a hand-made trace (microseconds)."""


from benchmarks.step_timeline import kernel_lines, kernel_times, marked_phases, running_phases, split_steps, summary


def event(name, start, end, cat="cpu_op"):
    return {"name": name, "cat": cat, "ts": float(start), "dur": float(end - start)}


def kernel(start, end):
    return event("k", start, end, "kernel")


TRACE = [
    event("phase:step", 0, 95), event("phase:accept", 35, 60), event("phase:emit", 85, 110),
    event("phase:step", 100, 190), event("phase:observe", 150, 190),
    kernel(0, 20), kernel(22, 40), kernel(60, 90), kernel(105, 150),
    event("cudaGraphLaunch", 30, 31, "cuda_runtime"),  # not GPU time
    event("phase:commit", 38, 62, "gpu_user_annotation"),  # a phase's span on the GPU: not host work
]


def test_split_steps_charges_long_gaps_to_the_running_phase():
    first, second = split_steps(TRACE)
    # step 0 runs to the next step's start (100): busy 20 + 18 + 30; a 2 us gap; 20 us idle under accept, the 10
    # before the next step under emit
    assert first["wall_us"] == 100 and first["busy_us"] == 68
    assert first["short_gaps_us"] == 2 and first["short_gaps"] == 1
    assert first["long_gaps_us"] == {"accept": 20, "emit": 10}
    # the last step runs to its own end: 5 us short gap at its start, 40 idle under observe
    assert second["wall_us"] == 90 and second["busy_us"] == 45
    assert second["short_gaps_us"] == 5 and second["long_gaps_us"] == {"observe": 40}


def test_a_gap_is_charged_to_each_innermost_phase_it_spans():
    phases = [(0, 10, "a"), (10, 30, "b"), (12, 14, "c")]
    charged = {}
    for name, us in running_phases(phases, [(0, 40)], 5, 35):
        charged[name] = charged.get(name, 0) + us
    assert charged == {"a": 5, "b": 18, "c": 2, "step, unmarked": 5}
    assert running_phases(phases, [(0, 40)], 40, 45) == [("between steps", 5)]


def test_summary_leaves_out_the_first_step():
    lines = summary(split_steps(TRACE))
    assert lines[0].startswith("1 step: 0.09 ms/step wall, 0.04 on the GPU")
    assert "| observe | 0.040 |" in lines


class FakeAcceptance:
    def accept(self, x):
        return ("accepted", x)


class FakeRunner:
    def commit_on_device(self, step, accepted):
        return ("committed", step)


class FakeEngine:
    def __init__(self):
        self.acceptance = FakeAcceptance()
        self.runner = FakeRunner()

    def step(self):
        return self.plan() + self.acceptance.accept(1)

    def plan(self):
        return ("planned",)


def test_marked_phases_wraps_and_restores():
    engine = FakeEngine()
    with marked_phases(engine):
        assert "step" in vars(engine) and "plan" in vars(engine) and "accept" in vars(engine.acceptance)
        assert engine.step() == ("planned", "accepted", 1)
        assert "commit_on_device" in vars(engine.runner) and engine.runner.commit_on_device(2, None) == ("committed", 2)
    assert "commit_on_device" not in vars(engine.runner)
    assert "step" not in vars(engine) and "plan" not in vars(engine) and "accept" not in vars(engine.acceptance)
    assert engine.step() == ("planned", "accepted", 1)


def test_reading_a_trace_needs_no_gpu(tmp_path):
    import gzip
    import json
    import subprocess
    import sys

    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps(TRACE).encode()))
    out = subprocess.run([sys.executable, "-m", "benchmarks.step_timeline", "--read", str(path)], check=True,
                         capture_output=True, text=True).stdout
    assert "| observe | 0.040 |" in out and "untraced" not in out  # a trace saved before the untraced steps
    untraced = {"wall_ms": 0.1, "launches": []}
    path.write_bytes(gzip.compress(json.dumps({"events": TRACE, "untraced": untraced}).encode()))
    out = subprocess.run([sys.executable, "-m", "benchmarks.step_timeline", "--read", str(path)], check=True,
                         capture_output=True, text=True).stdout
    assert "| observe | 0.040 |" in out and "untraced: 0.10 ms/step wall, 0.06 over" in out


def test_untraced_steps_time_each_graph_launch_and_the_step(monkeypatch):
    import torch

    from benchmarks.step_timeline import untraced_lines, untraced_steps

    class Graph:  # a graph whose launch the test counts (replay: torch.cuda.CUDAGraph's, patched in)
        pass

    replays = []
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", lambda graph: replays.append(graph), raising=False)
    verify, commit = Graph(), Graph()

    class Engine:
        def step(self):
            torch.cuda.CUDAGraph.replay(verify)
            torch.cuda.CUDAGraph.replay(commit)
            torch.cuda.CUDAGraph.replay(commit)

    figures = untraced_steps(Engine(), torch.device("cpu"), steps=3)
    assert replays == [verify, commit, commit] * 3, "each launch still replays its graph"
    assert sorted(g["per_step"] for g in figures["launches"]) == [1, 2] and figures["wall_ms"] > 0
    original = torch.cuda.CUDAGraph.replay
    assert original is not None and "timed" not in getattr(original, "__name__", ""), "the patch is undone"
    assert all(g["covered"] is None for g in figures["launches"]), "no CUDA stream to ask off CUDA"
    lines = untraced_lines({"wall_ms": 2.5, "launches": [{"per_step": 1, "host_ms": 0.033}]},
                           [{"busy_us": 9e9}, {"busy_us": 2000.0}])
    assert lines[1] == ("untraced: 2.50 ms/step wall, 0.50 over the traced GPU busy time; graph launches (host): "
                        "1 a step at 0.033 ms")
    lines = untraced_lines({"wall_ms": 2.5, "launches": [{"per_step": 1, "host_ms": 0.515, "covered": 0.75},
                                                         {"per_step": 1, "host_ms": 0.1, "covered": None}]},
                           [{"busy_us": 2000.0}])
    assert lines[1].endswith("1 a step at 0.515 ms (75% returning while the GPU was still on earlier work), 1 a step "
                             "at 0.100 ms")


def test_read_windows_split_the_host_path_after_a_read():
    from benchmarks.step_timeline import read_lines, read_windows

    trace = [
        event("cudaEventSynchronize", 0, 10, "cuda_runtime"),   # the read returns at 10
        kernel(5, 30),                                          # the commit runs on to 30
        event("cudaMemcpyAsync", 40, 41, "cuda_runtime"),       # (other runtime calls are skipped)
        event("cudaGraphLaunch", 50, 60, "cuda_runtime"),       # the next launch at 50: 20 busy, 20 idle
        kernel(57, 90),                                         # its first kernel 7 after the launch
        event("cudaEventSynchronize", 95, 100, "cuda_runtime"),  # a read and a launch while the GPU is busy:
        kernel(98, 130),
        event("cudaGraphLaunch", 110, 111, "cuda_runtime"),     # no idle, no wait for work
        event("cudaEventSynchronize", 140, 141, "cuda_runtime"),  # a read with no launch after it: no window
    ]
    first, second = read_windows(trace)
    assert first == {"host_us": 40, "busy_us": 20, "idle_us": 20, "launch_to_work_us": 7}
    assert second == {"host_us": 10, "busy_us": 10, "idle_us": 0, "launch_to_work_us": 0}
    line = read_lines([first, second])[1]
    assert "mean of 2: 0.025 ms of host work, the GPU busy 0.015 ms" in line and "idle 0.010" in line
    assert read_lines([]) == []


def test_untraced_steps_time_the_host_from_a_read_to_the_next_launch(monkeypatch):
    import torch

    from benchmarks.step_timeline import untraced_lines, untraced_steps
    from specdec.speculation.acceptance import AcceptedOnDevice

    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", lambda graph: None, raising=False)
    accepted = AcceptedOnDevice(torch.tensor([1]), torch.tensor([7]))

    class Engine:
        def step(self):
            torch.cuda.CUDAGraph.replay(object())
            assert accepted.read() == [([0, 1], 7)], "the read still reads"
            sum(range(20000))  # host work between the read and the next launch

    figures = untraced_steps(Engine(), torch.device("cpu"), steps=3)
    assert figures["read_to_launch_ms"] > 0, "two of the three reads are followed by a launch"
    assert AcceptedOnDevice.read.__name__ == "read", "the patch is undone"
    line = untraced_lines({**figures, "wall_ms": 2.5}, [{"busy_us": 2000.0}])[1]
    assert "from an acceptance read's return to the next launch (host): " in line


def test_out_names_a_file_or_a_folder_to_save_into(tmp_path):
    """--out takes the trace's file, or a folder (existing, or a path with no suffix) in which the trace gets the
    committed traces' name."""
    from benchmarks.step_timeline import trace_path

    assert trace_path(tmp_path / "t.json.gz", "random:qwen3.5-9b", "speculative", 128) == tmp_path / "t.json.gz"
    assert trace_path(tmp_path, "random:qwen3.5-9b", "speculative", 128) == (
        tmp_path / "qwen3.5-9b_spec_b128_timeline.json.gz")
    assert trace_path(tmp_path / "new", "random:nemotron-3-nano:26", "plain", 256) == (
        tmp_path / "new" / "nemotron-3-nano_plain_b256_timeline.json.gz")


def test_kernels_are_summed_over_the_steps_after_the_first():
    """TRACE's first step is left out (the profiler may cut its start), so only the kernel at 105-150 counts: 45 us in
    one step; a trace with two kernels of other names in its second step sits beside it under --against."""
    assert kernel_times(TRACE) == ({"k": 0.045}, 1.0)
    other = [e for e in TRACE if e["cat"] != "kernel"] + [
        event("k", 100, 110, "kernel"), event("g", 110, 130, "kernel"), event("g", 0, 50, "kernel")]
    assert kernel_times(other) == ({"k": 0.01, "g": 0.02}, 2.0)
    lines = kernel_lines(TRACE, against=other)
    assert lines[3:6] == ["| all kernels | 0.030 | 0.045 |", "| launches a step | 2 | 1 |", "| k | 0.010 | 0.045 |"]

