"""What calls cost through the Python host (not installed with the package).

    python hosts/python/bench.py COMPONENT [N]

Prints the median and mean per-call time of ``admit-service`` and of one ``tracker.observe``
carrying one EndpointSlice change on a small tracker (3 nodes, 2 Services, 2 slices, settled),
and the load (compile) time of the component.
"""

import statistics
import sys
import time

from clb_reconciler import Component, Tracker

CONFIG = {"backend-pool-type": "podIP", "load-balancer-sku": "standardV2", "multiple-standard-load-balancers": [], "write-budgets": None}


def service(i: int) -> dict:
    return {
        "uid": f"6a1f0c8e-2b3d-4e5f-8a9b-0c1d2e3f4a0{i}",
        "namespace": "shop",
        "name": f"web{i}",
        "service-type": "LoadBalancer",
        "external-traffic-policy": "Local",
        "session-affinity": None,
        "load-balancer-ip": None,
        "load-balancer-class": None,
        "ip-families": [],
        "ports": [{"name": None, "protocol": "TCP", "port": 80, "target-port": {"tag": "number", "val": 8080}, "node-port": None}],
        "annotations": [],
        "finalizers": [],
        "deleting": False,
        "ingress-ips": [], "labels": [],
    }


def slice_(i: int, ips: list) -> dict:
    return {
        "namespace": "shop",
        "name": f"web{i}-abc",
        "owner-service-uid": service(i)["uid"],
        "address-type": "IPv4",
        "endpoints": [{"addresses": [ip], "node-name": f"node-{k % 3}", "ready": None} for k, ip in enumerate(ips)],
        "deleting": False,
    }


def answer(step: dict) -> list:
    out = []
    for c in step["commands"]:
        tag = c["command"]["tag"]
        if tag == "read-nrp":
            out.append([c["id"], {"tag": "nrp-snapshot", "val": {"services": [], "locations": []}}])
        elif tag == "read-arm":
            out.append([c["id"], {"tag": "arm-inventory", "val": {"public-ips": [], "load-balancers": [], "nat-gateways": []}}])
        elif tag == "put-public-ip":
            out.append([c["id"], {"tag": "public-ip-address", "val": "20.0.0.1"}])
        else:
            out.append([c["id"], {"tag": "ok"}])
    return out


def settle(tracker: Tracker, now: int, step: dict) -> None:
    for _ in range(50):
        if not step["commands"]:
            return
        step = tracker.complete(now, answer(step))


def timed(fn, n: int) -> list:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def report(name: str, samples: list) -> None:
    ms = [s * 1000 for s in samples]
    print(f"{name}: median {statistics.median(ms):.3f} ms, mean {statistics.mean(ms):.3f} ms, n={len(ms)}")


def main() -> None:
    path = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    t = time.perf_counter()
    logic = Component.load(path)
    print(f"load (compile): {(time.perf_counter() - t) * 1000:.0f} ms")
    svc = service(1)
    logic.admit_service(CONFIG, svc)  # instantiate the pure instance
    report("admit-service", timed(lambda: logic.admit_service(CONFIG, svc), n))

    tracker = Tracker.create(logic, CONFIG)
    batch = [{"tag": "node-upserted", "val": {"name": f"node-{k}", "internal-ips": [f"10.224.0.{4 + k}"]}} for k in range(3)]
    batch += [{"tag": "service-upserted", "val": service(i)} for i in (1, 2)]
    batch += [{"tag": "slice-upserted", "val": slice_(i, [f"10.244.{i}.{k}" for k in range(1, 4)])} for i in (1, 2)]
    batch.append({"tag": "lists-complete"})
    now = 0
    settle(tracker, now, tracker.observe(now, batch))
    state = {"k": 0}

    def one_change() -> None:
        state["k"] += 1
        k = state["k"]
        ips = [f"10.244.1.{1 + (k % 50)}", "10.244.1.2", "10.244.1.3"]
        step = tracker.observe(now, [{"tag": "slice-upserted", "val": slice_(1, ips)}])
        state["last"] = step

    samples = []
    for _ in range(n):
        t = time.perf_counter()
        one_change()
        samples.append(time.perf_counter() - t)
        settle(tracker, now, state["last"])  # answer its commands, untimed
    report("tracker.observe (one EndpointSlice change)", samples)
    print("last step:", len(state["last"]["commands"]), "command(s):", [c["command"]["tag"] for c in state["last"]["commands"]])


if __name__ == "__main__":
    main()
