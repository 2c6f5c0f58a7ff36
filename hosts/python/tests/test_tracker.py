"""The tracker through the integrator API, against a built component (skipped without one).

    CLB_GUEST=target/.../clb_guest.wasm python -m unittest discover -s hosts/python/tests
"""

import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from clb_reconciler import Component, Tracker, replay  # noqa: E402

GUEST = os.environ.get("CLB_GUEST", "")

CONFIG = {
    "backend-pool-type": "podIP",
    "load-balancer-sku": "standardV2",
    "multiple-standard-load-balancers": [],
    "write-budgets": None,
}
UID = "6a1f0c8e-2b3d-4e5f-8a9b-0c1d2e3f4a01"
SERVICE = {
    "uid": UID, "namespace": "shop", "name": "web", "service-type": "LoadBalancer",
    "external-traffic-policy": "Local", "session-affinity": None, "load-balancer-ip": None,
    "load-balancer-class": None, "ip-families": [],
    "ports": [{"name": "http", "protocol": "TCP", "port": 80, "target-port": {"tag": "number", "val": 8080}, "node-port": None}],
    "annotations": [], "finalizers": [], "deleting": False, "ingress-ips": [], "labels": [],
}
SLICE = {
    "namespace": "shop", "name": "web-abc12", "owner-service-uid": UID, "address-type": "IPv4",
    "endpoints": [{"addresses": ["10.244.1.10"], "node-name": "aks-node-1", "ready": True}],
    "deleting": False,
}
#: Start-up (lists complete, NRP and ARM read) with one Service and its endpoints, up to the
#: first write of its creation: the flow of the golden trace `a-first-service-with-endpoints-…`.
#: Each entry is a call and its arguments after ``self``, in WIT order.
FLOW = [
    ("tracker.observe", {"now-ms": 1000, "batch": [{"tag": "lists-complete"}]}),
    ("tracker.observe", {"now-ms": 1000, "batch": [
        {"tag": "node-upserted", "val": {"name": "aks-node-1", "internal-ips": ["10.224.0.4"]}},
        {"tag": "service-upserted", "val": SERVICE},
        {"tag": "slice-upserted", "val": SLICE},
    ]}),
    ("tracker.complete", {"now-ms": 1100, "results": [[0, {"tag": "nrp-snapshot", "val": {"services": [], "locations": []}}]],
                          "arm-remaining-writes": None}),
    ("tracker.complete", {"now-ms": 1200, "results": [[1, {"tag": "arm-inventory", "val": {
        "public-ips": [], "load-balancers": [], "nat-gateways": []}}]], "arm-remaining-writes": None}),
    ("tracker.complete", {"now-ms": 1300, "results": [[2, {"tag": "ok"}]], "arm-remaining-writes": None}),
]
#: The call after the stats: the answer to the public IP the creation asked for.
NEXT = ("tracker.complete", {"now-ms": 1500, "results": [[3, {"tag": "public-ip-address", "val": "20.1.2.3"}]],
                             "arm-remaining-writes": None})
STATES = ["not-started", "creation-in-progress", "created", "deletion-pending", "deletion-in-progress", "update-in-progress"]
METHODS = {"tracker.observe": "observe", "tracker.complete": "complete", "tracker.tick": "tick", "tracker.stats": "stats"}


class Recording:
    """Calls a tracker through the API and writes each call as a trace line (docs/traces.md),
    so that the replay of what the API did can be checked."""

    def __init__(self, logic: Component) -> None:
        self.logic = logic
        header = '{"format":"clb-trace","version":1,"host":"test","component":{"package":"%s","sha256":"%s"},"source":"test"}'
        self.lines = [header % (logic.package, logic.sha256)]
        self.tracker = Tracker.create(logic, CONFIG)
        self.line("tracker.create", {"config": CONFIG}, {"tag": "ok", "val": 0})

    def line(self, call, args, result):
        fn = self.logic.function(call)
        method = fn.method_of is not None
        args = {"self": 0, **args} if method else args
        text = ",".join(f'"{name}":{self.logic.encode(call, v, param=name)}' for name, v in args.items())
        result = self.logic.encode(call, result)
        self.lines.append(f'{{"seq":{len(self.lines) - 1},"call":"{call}","args":{{{text}}},"result":{result}}}')

    def call(self, call, args):
        result = getattr(self.tracker, METHODS[call])(*args.values())
        self.line(call, args, result)
        return result

    def feed(self):
        for call, args in FLOW:
            self.call(call, args)
        return self


@unittest.skipUnless(GUEST and os.path.isfile(GUEST), "set CLB_GUEST to a built clb_guest.wasm")
class Stats(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.logic = Component.load(GUEST)

    def test_stats_shows_a_service_being_created_as_pending_inbound_among_all_twelve_states_and_the_three_budgets(self):
        tracker = Recording(self.logic).feed().tracker
        stats = tracker.stats(1400)
        self.assertIs(stats["service-gateway-enabled"], True)
        self.assertEqual(len(stats["pending"]), 12)
        counts = {(p["state"], p["service-type"]): p["count"] for p in stats["pending"]}
        self.assertEqual(sorted(counts), sorted((s, t) for s in STATES for t in ("inbound", "outbound")))
        self.assertEqual({k: n for k, n in counts.items() if n}, {("creation-in-progress", "inbound"): 1}, stats["pending"])
        began = {(p["state"], p["service-type"]): p["oldest-began-ms"] for p in stats["pending"]}
        self.assertEqual(began[("creation-in-progress", "inbound")], 1000)
        self.assertEqual(stats["k8s-services"], 1)
        self.assertEqual([b["bucket"] for b in stats["budgets"]], ["update-address-locations", "update-services", "arm-writes"])
        self.assertTrue(all(isinstance(b["tokens"], int) and b["per-minute"] > 0 for b in stats["budgets"]), stats["budgets"])

    def test_stats_reads_only_twice_the_same_answer_and_the_next_step_as_without_it(self):
        asked, unasked = Recording(self.logic).feed(), Recording(self.logic).feed()
        first = asked.tracker.stats(1400)
        self.assertEqual(asked.tracker.stats(1400), first)
        after = asked.call(*NEXT)
        self.assertEqual(after, unasked.call(*NEXT))
        self.assertTrue(after["commands"], "the next step does something, so that a change would show")
        self.assertEqual(asked.tracker.export_state(), unasked.tracker.export_state())

    def test_a_trace_with_stats_calls_replays_identically_and_a_changed_stats_result_diverges(self):
        recording = Recording(self.logic).feed()
        recording.call("tracker.stats", {"now-ms": 1400})
        recording.call("tracker.stats", {"now-ms": 1400})
        recording.call(*NEXT)
        stats_seq = len(FLOW) + 1
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "stats.jsonl")
            with open(path, "w", encoding="utf-8") as f:
                f.write("\n".join(recording.lines) + "\n")
            report = replay.replay_file(path, self.logic, {}, True)
            self.assertEqual((report.calls, report.divergences), (len(recording.lines) - 1, []))
            line = recording.lines[stats_seq + 1]
            self.assertIn('"call":"tracker.stats"', line)
            recording.lines[stats_seq + 1] = line.replace('"k8s-services":1,', '"k8s-services":2,')
            with open(path, "w", encoding="utf-8") as f:
                f.write("\n".join(recording.lines) + "\n")
            report = replay.replay_file(path, self.logic, {}, True)
            self.assertEqual([(d.seq, d.call) for d in report.divergences], [(stats_seq, "tracker.stats")])


if __name__ == "__main__":
    unittest.main()
