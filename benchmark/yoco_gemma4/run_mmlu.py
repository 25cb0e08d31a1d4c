"""MMLU-style multiple-choice accuracy through a running SGLang server.

    python benchmark/yoco_gemma4/run_mmlu.py --csv DIR_OR_FILE [--url http://127.0.0.1:30000]
        [--tokenizer MODEL_DIR] [--out result.json] [--limit N] [--workers 16]

CSV rows are MMLU's layout: question, A, B, C, D, answer (a header row is skipped if
present); a directory means every *.csv in it, one subject per file. Each question is
asked zero-shot; the answer is the choice letter whose token has the highest logprob at
the first generated position (`token_ids_logprob`), so sampling settings don't matter.
Prints and writes accuracy overall and per subject.

A score means something only with real weights and real MMLU data, neither of which can
be had where this fork is developed: there the runner is proven on a small local CSV
against seeded random weights (test/srt/test_bench_checkpoint.py), which measures the
runner, not the model.
"""

import argparse
import concurrent.futures
import csv
import glob
import json
import os
import urllib.request

LETTERS = ("A", "B", "C", "D")
HEADER = "The following are multiple choice questions (with answers) about {}.\n\n"


def load_rows(path, limit=None):
    files = sorted(glob.glob(os.path.join(path, "*.csv"))) if os.path.isdir(path) else [path]
    if not files:
        raise SystemExit(f"error: no .csv files in {path}")
    rows = []
    for f in files:
        subject = os.path.splitext(os.path.basename(f))[0].replace("_test", "")
        with open(f, newline="") as fh:
            for i, r in enumerate(csv.reader(fh)):
                if len(r) != 6:
                    raise SystemExit(f"error: {f} row {i + 1} has {len(r)} fields; expected question,A,B,C,D,answer")
                if i == 0 and r[5].strip().lower() == "answer":
                    continue
                if r[5].strip() not in LETTERS:
                    raise SystemExit(f"error: {f} row {i + 1}: answer {r[5]!r} is not one of A/B/C/D")
                rows.append({"subject": subject, "question": r[0], "choices": r[1:5], "answer": r[5].strip()})
    return rows[:limit] if limit else rows


def prompt(row):
    body = row["question"] + "\n" + "".join(f"{l}. {c}\n" for l, c in zip(LETTERS, row["choices"]))
    return HEADER.format(row["subject"].replace("_", " ")) + body + "Answer:"


def choice_token_ids(tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    ids = [tok.encode(" " + l, add_special_tokens=False)[-1] for l in LETTERS]
    if len(set(ids)) < 4:
        raise SystemExit(
            f"error: the tokenizer in {tokenizer_dir} maps the choice letters to ids {ids}; "
            "they must be four different tokens to score A/B/C/D"
        )
    return ids


def ask(url, row, ids):
    payload = {
        "text": prompt(row),
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "return_logprob": True,
        "token_ids_logprob": ids,
    }
    req = urllib.request.Request(url + "/generate", json.dumps(payload).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        meta = json.loads(r.read())["meta_info"]
    scores = {t: lp for lp, t, _ in meta["output_token_ids_logprobs"][0]}
    return LETTERS[max(range(4), key=lambda i: scores[ids[i]])]


def evaluate(url, rows, ids, workers=16):
    with concurrent.futures.ThreadPoolExecutor(workers) as ex:
        preds = list(ex.map(lambda r: ask(url, r, ids), rows))
    per = {}
    for row, p in zip(rows, preds):
        s = per.setdefault(row["subject"], [0, 0])
        s[0] += p == row["answer"]
        s[1] += 1
    correct = sum(c for c, _ in per.values())
    return {
        "questions": len(rows),
        "correct": correct,
        "accuracy": correct / len(rows),
        "per_subject": {k: {"correct": c, "questions": n, "accuracy": c / n} for k, (c, n) in sorted(per.items())},
        "predictions": preds,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", required=True)
    ap.add_argument("--url", default="http://127.0.0.1:30000")
    ap.add_argument("--tokenizer", help="model dir or tokenizer to find the A/B/C/D token ids (default: ask the server)")
    ap.add_argument("--out")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--workers", type=int, default=16)
    a = ap.parse_args()
    tokenizer = a.tokenizer
    if tokenizer is None:
        with urllib.request.urlopen(a.url + "/model_info", timeout=30) as r:
            tokenizer = json.loads(r.read())["tokenizer_path"]
    res = evaluate(a.url, load_rows(a.csv, a.limit), choice_token_ids(tokenizer), a.workers)
    print(json.dumps({k: v for k, v in res.items() if k != "predictions"}, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
