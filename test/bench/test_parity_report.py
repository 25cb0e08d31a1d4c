"""bench.py parity's report, on CPU: on vs off, the other batch mix and cached against
cold counted apart (the mix over prompts with the same prefix-cache hit, cached against
cold over a prompt's hit against its own cold serve), and the run failed on a first
token whose top-5 sets do not overlap, on vs off or in the other mix only."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "yoco_gemma4"))

from parity_check import parity_lines, parity_report  # noqa: E402

TOP = [[-0.1, 7], [-2.0, 8], [-3.0, 9], [-4.0, 10], [-5.0, 11]]
OTHER = [[-0.2, 20], [-2.1, 21], [-3.1, 22], [-4.1, 23], [-5.1, 24]]  # no token in common with TOP


def out(ids, top=TOP, cached=0):
    return {"ids": ids, "top5": top, "cached_tokens": cached}


PROMPTS = [[1] * 10, [2] * 20, [3] * 30, [4] * 40]


def test_each_comparison_is_counted_apart_and_a_disjoint_top5_only_reported_for_the_cache():
    off_a = [out([7, 1]), out([7, 2]), out([7, 3], cached=8), out([7, 4])]
    # The second serve: prompt 1's first token far off (disjoint), prompt 3 not a hit (evicted).
    cached = [out([7, 1], cached=9), out([20, 2], top=OTHER, cached=19), out([7, 3], cached=29), out([7, 4])]
    # Prompt 2 was cold in mix B (a hit in A): left out of the batch-mix comparison.
    off_b = [out([7, 1]), out([7, 9]), out([20, 3], top=OTHER), out([7, 4])]
    on_a = [out([7, 1]), out([7, 2]), out([7, 3], cached=8), out([7, 5])]
    r = parity_report(PROMPTS, off_a, cached, off_b, on_a)
    c = r["comparisons"]
    assert (c["on_vs_off"]["identical"], c["on_vs_off"]["compared"], c["on_vs_off"]["disjoint_top5"]) == (3, 4, 0)
    mix = c["other_batch_mix"]
    assert (mix["identical"], mix["compared"], mix["left_out"], mix["disjoint_top5"]) == (2, 3, 1, 0)
    assert mix["mismatched_prompt_lengths"] == [20]
    hit = c["cached_vs_cold"]  # prompts 0 and 1: cold in A, a hit in the second serve
    assert (hit["identical"], hit["compared"], hit["left_out"], hit["disjoint_top5"]) == (1, 2, 2, 1)
    assert hit["disjoint_top5_prompt_lengths"] == [20]
    assert not r["failed"] and r["fail_reasons"] == []
    assert parity_lines(r)[2] == ("PARITY cached against cold: 1/2 identical (2 left out), first token differs 1, "
                                  "disjoint top-5 1, largest top-5 logprob difference 0.0")


def test_a_disjoint_top5_on_vs_off_or_in_the_other_mix_fails_the_run():
    off_a = [out([7, 1]), out([7, 2]), out([7, 3]), out([7, 4])]
    on_a = [out([7, 1]), out([20, 2], top=OTHER), out([7, 3]), out([7, 4])]
    off_b = [out([7, 1]), out([7, 2]), out([7, 3]), out([20, 4], top=OTHER)]
    r = parity_report(PROMPTS, off_a, [out([7, 1], cached=9)] * 4, off_b, on_a)
    assert r["failed"]
    assert r["fail_reasons"] == ["on_vs_off: 1 first token(s) whose top-5 sets do not overlap",
                                 "other_batch_mix: 1 first token(s) whose top-5 sets do not overlap"]
    assert parity_lines(r)[-2:] == [f"FAIL {x}" for x in r["fail_reasons"]]
    assert r["comparisons"]["on_vs_off"]["disjoint_top5_prompt_lengths"] == [20]
    assert r["comparisons"]["other_batch_mix"]["disjoint_top5_prompt_lengths"] == [40]
