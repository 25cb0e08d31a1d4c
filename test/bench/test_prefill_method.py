"""bench.py prefill's method, on CPU: each point's warm-up pass is run and discarded,
at least 5 timed repeats, median / min / spread ((max - min) / median) per point and
mode, a point over 10 % flagged unstable in its record, its line and its SHARE lines,
and the share of the ceiling from the medians and from the mins."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "yoco_gemma4"))

from prefill_bench import (  # noqa: E402
    MIN_REPEATS,
    UNSTABLE_SPREAD,
    ceiling_table,
    point_stats,
    share_lines,
    time_point,
    unstable_line,
)


class FakeClock:
    """A clock that each pass advances by the pass's own duration."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_warm_up_pass_of_the_points_shape_is_run_then_discarded():
    clock = FakeClock()
    durations = iter([9.0, 1.0, 1.2, 0.9, 1.1, 1.0])  # the first pass is cold
    batches, ran = iter(range(100)), []

    def run_pass(batch):
        ran.append(batch)
        clock.now += next(durations)

    warmup, times, starts = time_point(run_pass, lambda: next(batches), 5, clock=clock, wall=lambda: 1.0)
    assert warmup == 9.0
    assert times == pytest.approx([1.0, 1.2, 0.9, 1.1, 1.0])
    assert ran == [0, 1, 2, 3, 4, 5]  # a fresh batch per pass, the warm-up's included
    assert starts == [1.0] * 5


def test_median_min_spread_and_the_flag():
    st = point_stats([1.0, 1.2, 0.9, 1.1, 1.0])
    assert st["median_s"] == 1.0 and st["min_s"] == 0.9 and st["max_s"] == 1.2
    assert st["spread"] == pytest.approx(0.3) and st["unstable"]
    assert UNSTABLE_SPREAD == 0.10
    assert not point_stats([1.0, 1.1, 1.05, 1.0, 1.02])["unstable"]  # spread 0.1 / 1.02: under 10 %
    assert point_stats([1.0, 1.11, 1.0, 1.0, 1.0])["unstable"]  # 11 %
    assert point_stats([2.0] * 5)["spread"] == 0.0


def rec(mode, L, n, times):
    return {"mode": mode, "len": L, "batch": n, **point_stats(times), "times_s": times}


def test_share_of_the_ceiling_by_medians_and_by_mins():
    res = [rec("off", 4096, 1, [0.070, 0.071, 0.072, 0.070, 0.069]),
           rec("on-all", 4096, 1, [0.034, 0.035, 0.034, 0.033, 0.036]),
           rec("ceiling", 4096, 1, [0.029, 0.029, 0.030, 0.029, 0.028])]
    (row,) = ceiling_table(res, [(4096, 1)])
    assert row["on_all_s"] == 0.034 and row["on_all_min_s"] == 0.033
    assert row["share_of_ceiling_on_all"] == pytest.approx(0.029 / 0.034)
    assert row["share_of_ceiling_on_all_min"] == pytest.approx(0.028 / 0.033)
    assert row["spread_ceiling"] == pytest.approx(0.002 / 0.029) and not row["unstable"]
    (line,) = share_lines([row])
    assert line == ("SHARE on-all 4096x1: 2.06x over off (70.0 ms against 34.0 ms), "
                    "85.3 % of the ceiling (29.0 ms against 34.0 ms), 84.8 % by min (28.0 ms against 33.0 ms); "
                    "spread on-all 8.8 %, ceiling 6.9 %, off 4.3 %")


def test_an_unstable_point_is_flagged_in_its_record_line_and_share():
    res = [rec("on-all", 1024, 8, [0.116, 0.069, 0.091, 0.070, 0.071]),  # a cold repeat
           rec("ceiling", 1024, 8, [0.065, 0.064, 0.066, 0.065, 0.064])]
    on = res[0]
    assert on["unstable"] and not res[1]["unstable"]
    assert unstable_line(on) == ("UNSTABLE on-all 1024x8: spread 66.2 % > 10 % "
                                 "(median 71.0 ms, min 69.0 ms, max 116.0 ms)")
    assert unstable_line(res[1]) is None
    (row,) = ceiling_table(res, [(1024, 8)])
    assert row["unstable"] and row["unstable_on_all"] and not row["unstable_ceiling"]
    assert share_lines([row])[0].endswith("UNSTABLE (spread > 10 %)")
    assert json.loads(json.dumps(row))["unstable"] is True


def test_rows_of_older_runs_without_mins_keep_their_share_line():
    res = [{"mode": "on", "len": 64, "batch": 8, "median_s": 0.05},
           {"mode": "ceiling", "len": 64, "batch": 8, "median_s": 0.04}]
    (row,) = ceiling_table(res, [(64, 8)])
    assert "share_of_ceiling_on_min" not in row and not row["unstable"]
    assert share_lines([row]) == ["SHARE on 64x8: no off, 80.0 % of the ceiling (40.0 ms against 50.0 ms)"]


def test_fewer_than_5_repeats_are_refused_for_reported_figures():
    script = os.path.join(ROOT, "benchmark", "yoco_gemma4", "bench.py")
    assert MIN_REPEATS == 5
    p = subprocess.run([sys.executable, script, "prefill", "o.json", "--repeats", "3"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 2 and "at least 5 timed repeats" in p.stderr and "--few-repeats" in p.stderr
    p = subprocess.run([sys.executable, script, "prefill", "--help"], capture_output=True, text=True, timeout=120)
    assert "--few-repeats" in p.stdout and "(at least 5)" in p.stdout
