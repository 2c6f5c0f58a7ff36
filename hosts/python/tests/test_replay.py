"""Replay tests against a built component (skipped without one).

    CLB_GUEST=target/.../clb_guest.wasm [CLB_NEXT_GUEST=.../next_guest.wasm] \\
        python -m unittest discover -s hosts/python/tests
"""

import glob
import io
import json
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from clb_reconciler import replay  # noqa: E402

GUEST = os.environ.get("CLB_GUEST", "")
NEXT_GUEST = os.environ.get("CLB_NEXT_GUEST", "")
TRACES = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "traces", "*.jsonl")))


def run(*argv: str):
    out, err = io.BytesIO(), io.BytesIO()

    class Stream:
        def __init__(self, buf):
            self.buffer = buf

        def write(self, s):
            self.buffer.write(s.encode())

        def flush(self):
            pass

    with redirect_stdout(Stream(out)), redirect_stderr(Stream(err)):
        code = replay.main(list(argv))
    return code, out.getvalue().decode(), err.getvalue().decode()


def dumps(v):
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"))


@unittest.skipUnless(GUEST and os.path.isfile(GUEST) and TRACES, "set CLB_GUEST to a built clb_guest.wasm")
class GoldenTraces(unittest.TestCase):
    def swap_args(self):
        return ["--swap-component", f"next-guest={NEXT_GUEST}"] if NEXT_GUEST else []

    def traces(self):
        return [t for t in TRACES if NEXT_GUEST or "hot-swap" not in t]

    def test_every_golden_trace_is_identical(self):
        code, out, err = run(*self.traces(), "--component", GUEST, *self.swap_args())
        self.assertEqual(code, 0, out + err)
        self.assertTrue(all(line.endswith(", identical") for line in out.splitlines()), out)

    def test_a_changed_result_is_a_divergence_at_its_seq(self):
        src = next(t for t in self.traces() if '"idle":false' in open(t, encoding="utf-8").read())
        lines = open(src, encoding="utf-8").read().splitlines()
        for i, text in enumerate(lines[1:], start=1):
            if '"idle":false' in text:
                lines[i] = text.replace('"idle":false', '"idle":true')
                break
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "changed.jsonl")
            open(path, "w", encoding="utf-8").write("\n".join(lines) + "\n")
            code, out, _ = run(path, "--component", GUEST)
            self.assertEqual(code, 1)
            self.assertIn(f"{path}:{i + 1}: seq {i - 1}: ", out)
            code, out, _ = run(path, "--component", GUEST, "--json", "--all-divergences")
            self.assertEqual(code, 1)
            doc = json.loads(out)
            self.assertEqual(doc["traces"][0]["divergences"][0]["seq"], i - 1)
            self.assertEqual(list(doc), ["traces", "identical", "by-kind"])

    def test_renumbered_ids_are_aligned(self):
        src = self.traces()[0]
        out_lines = []
        for n, text in enumerate(open(src, encoding="utf-8")):
            o = json.loads(text)
            if n and o["call"] in replay.STEP_CALLS:
                if o["call"] == "tracker.complete":
                    o["args"]["results"] = [[str(int(r[0]) + 1000), r[1]] for r in o["args"]["results"]]
                for c in o.get("result", {}).get("commands", []):
                    c["id"] = str(int(c["id"]) + 1000)
            out_lines.append(dumps(o))
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "renumbered.jsonl")
            open(path, "w", encoding="utf-8").write("\n".join(out_lines) + "\n")
            code, out, err = run(path, "--component", GUEST)
            self.assertEqual(code, 0, out + err)

    def test_unreadable_traces_exit_2_with_file_and_line(self):
        lines = open(self.traces()[0], encoding="utf-8").read().splitlines()
        with tempfile.TemporaryDirectory() as d:
            truncated = os.path.join(d, "truncated.jsonl")
            open(truncated, "w", encoding="utf-8").write("\n".join(lines[:3]) + "\n" + lines[3][:40])
            code, out, err = run(truncated, "--component", GUEST)
            self.assertEqual((code, out), (2, ""))
            self.assertIn(f"{truncated}:4: ", err)
            malformed = os.path.join(d, "malformed.jsonl")
            open(malformed, "w", encoding="utf-8").write("\n".join(lines[:2] + ["{nope"] + lines[3:]) + "\n")
            code, out, err = run(malformed, "--component", GUEST)
            self.assertEqual(code, 2)
            self.assertIn(f"{malformed}:3: ", err)
            code, _, err = run(malformed, "--component", os.path.join(d, "missing.wasm"))
            self.assertEqual(code, 2)


if __name__ == "__main__":
    unittest.main()
