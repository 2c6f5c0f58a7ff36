#!/usr/bin/env python3
"""Upstream's DiffTracker beside ours, on one cluster shape, runs alternating.

    harness/upstream-go/side-by-side.py --upstream-git GIT_DIR [--scale N] [--runs R]
    harness/upstream-go/side-by-side.py --upstream CHECKOUT [--scale N] [--runs R]

Upstream's source at 7b31c76c comes from a git directory holding that commit (a clone of
kubernetes-sigs/cloud-provider-azure; it is extracted with `git archive` into the cache) or from a
checkout of it. Its vendor folder makes the Go build offline. The harness's test file is copied
into upstream's difftracker package and built once into a test binary (cached by the file's
hash); the project's `difftracker` bench is built once (`cargo bench --no-run`). Then R runs of
each, alternating Go and Rust, with CLB_BENCH_SCALE=N, and a Markdown table of the medians and
the ratios of medians on stdout; each run's figures go to stderr.
"""

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

COMMIT = "7b31c76ce2ff602cc2dfec988744d8d0534b448c"
PACKAGE = "pkg/provider/servicegateway/difftracker"
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
HARNESS = HERE / "zz_clb_bench_test.go"
# What of upstream's tree the build of its difftracker package reads.
BUILD_INPUTS = ["go.mod", "go.sum", "pkg", "internal", "vendor"]


def cache_dir() -> Path:
    if os.environ.get("CLB_CACHE"):
        return Path(os.environ["CLB_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.environ.get("HOME", "/root"), ".cache")
    return Path(base) / "clb-reconciler"


def upstream_source(args) -> Path:
    if args.upstream:
        return Path(args.upstream).resolve()
    tree = cache_dir() / "upstream" / f"cloud-provider-azure-{COMMIT[:12]}"
    if not (tree / "go.mod").exists():
        print(f"extracting upstream {COMMIT[:12]} from {args.upstream_git} into {tree}", file=sys.stderr)
        tree.mkdir(parents=True, exist_ok=True)
        # Only what the Go build reads: a partial clone may lack large blobs elsewhere.
        command = ["git", "--git-dir", args.upstream_git, "archive", COMMIT, *BUILD_INPUTS]
        archive = subprocess.Popen(command, stdout=subprocess.PIPE)
        untarred = subprocess.run(["tar", "-x", "-C", str(tree)], stdin=archive.stdout)
        if archive.wait() != 0 or untarred.returncode != 0:
            shutil.rmtree(tree)
            sys.exit(f"git archive {COMMIT} failed: does {args.upstream_git} hold that commit?")
    return tree


def go_binary(tree: Path) -> Path:
    digest = hashlib.sha256(HARNESS.read_bytes()).hexdigest()[:16]
    binary = cache_dir() / "bin" / f"clb-upstream-difftracker-{COMMIT[:12]}-{digest}.test"
    if not binary.exists():
        shutil.copy(HARNESS, tree / PACKAGE / HARNESS.name)
        env = dict(os.environ, GOTOOLCHAIN="local", GOFLAGS="-mod=vendor")
        env.setdefault("GOCACHE", str(cache_dir() / "go" / "build"))
        print(f"building {binary} (upstream's package and its tests: minutes cold)", file=sys.stderr)
        binary.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["go", "test", "-c", "-o", str(binary), "."], cwd=tree / PACKAGE, env=env, check=True)
    return binary


def rust_binary() -> Path:
    out = subprocess.run(
        ["cargo", "bench", "-p", "clb-tests", "--bench", "difftracker", "--no-run", "--message-format=json"],
        cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True,
    ).stdout
    for line in out.splitlines():
        message = json.loads(line)
        if message.get("reason") == "compiler-artifact" and message["target"]["name"] == "difftracker" \
                and message.get("executable"):
            return Path(message["executable"])
    sys.exit("cargo built no difftracker bench executable")


def result(output: str, prefix: str) -> dict:
    for line in output.splitlines():
        if line.startswith(prefix + " "):
            return {k: float(v) for k, v in (field.split("=") for field in line.split()[1:])}
    sys.exit(f"no {prefix} line in:\n{output}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--upstream-git", help="a git directory holding upstream's commit " + COMMIT[:12])
    source.add_argument("--upstream", help="a checkout of upstream at that commit")
    parser.add_argument("--scale", type=int, default=1, help="CLB_BENCH_SCALE for both (default 1)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each, alternating (default 3)")
    args = parser.parse_args()

    go, rust = go_binary(upstream_source(args)), rust_binary()
    env = dict(os.environ, CLB_BENCH_SCALE=str(args.scale), CLB_UPSTREAM_BENCH="1")
    env.pop("CLB_BENCH_SHRINK", None)
    runs = {"go": [], "rust": []}
    for run in range(args.runs):
        out = subprocess.run([str(go), "-test.run", "TestCLBUpstreamBench", "-test.count=1", "-test.v"],
                             env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
        runs["go"].append(result(out, "GO_RESULT"))
        print(f"go run {run + 1}: {runs['go'][-1]}", file=sys.stderr)
        out = subprocess.run([str(rust), "--bench"], cwd=ROOT / "tests", env=env, check=True,
                             stdout=subprocess.PIPE, text=True).stdout
        runs["rust"].append(result(out, "RUST_RESULT"))
        print(f"rust run {run + 1}: {runs['rust'][-1]}", file=sys.stderr)

    def median(side, key):
        return statistics.median(r[key] for r in runs[side])

    go_startup = median("go", "startup_nosleep_ms")
    go_change = median("go", "total_us")
    nodes = int(runs["rust"][0]["nodes"])
    print(f"Scale {args.scale}: {nodes:,} nodes, {nodes * 30:,} ready pods, {nodes:,} Services; "
          f"medians of {args.runs} alternating runs.\n")
    print("| measure | upstream Go | ours, native | ours, component | component ÷ Go |")
    print("|---|---:|---:|---:|---:|")
    native, component = median("rust", "startup_native_ms"), median("rust", "startup_component_ms")
    print(f"| start-up (Go less its fixed 50 ms sleep) | {go_startup:,.1f} ms | {native:,.1f} ms | "
          f"{component:,.1f} ms | {component / go_startup:.2f}× |")
    native, component = median("rust", "change_native_us"), median("rust", "change_component_us")
    print(f"| one endpoint change | {go_change:,.1f} µs | {native:,.1f} µs | {component:,.1f} µs | "
          f"{component / go_change:.5f}× |")
    print(f"\nGo's start-up with its sleep: {median('go', 'startup_full_ms'):,.1f} ms; "
          f"its in-memory core: {median('go', 'startup_core_ms'):,.1f} ms.")


if __name__ == "__main__":
    main()
