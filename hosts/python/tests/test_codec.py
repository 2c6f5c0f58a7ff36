"""Unit tests of the codec on a hand-made schema fragment (no component needed).

    python -m unittest discover -s hosts/python/tests
"""

import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from clb_reconciler import codec, replay  # noqa: E402
from clb_reconciler.codec import DecodeError, compile_type, dumps  # noqa: E402

TARGET_PORT = {"variant": [{"name": "number", "type": "s32"}, {"name": "name", "type": "string"}]}
OUTCOME = {
    "variant": [
        {"name": "ok", "type": None},
        {"name": "public-ip-address", "type": "string"},
        {"name": "failed", "type": {"record": [{"name": "status", "type": "u16"}, {"name": "retry-after-ms", "type": {"option": "u64"}}]}},
    ]
}
STATE = {"record": [{"name": "version", "type": "u32"}, {"name": "payload", "type": {"list": "u8"}}]}
STATE_ERROR = {
    "variant": [
        {"name": "unsupported-version", "type": "u32"},
        {"name": "corrupt", "type": "string"},
        {"name": "invalid-config", "type": {"record": [{"name": "field", "type": "string"}]}},
    ]
}


class Canonical(unittest.TestCase):
    def test_text(self):
        self.assertEqual(dumps({"b": 1, "a": ["x", None, True]}), '{"b":1,"a":["x",null,true]}')
        self.assertEqual(dumps("é/\u2028\x01\x1f\n\t\"\\"), '"é/\u2028\\u0001\\u001f\\n\\t\\"\\\\"')

    def test_strict_json(self):
        for bad in ('{"a":1,"a":2}', "NaN", "[Infinity]", "{'a':1}"):
            with self.assertRaises(ValueError):
                codec.loads(bad)


class Values(unittest.TestCase):
    def roundtrip(self, spec, j):
        t = compile_type(spec)
        v = t.from_json(j)
        self.assertEqual(dumps(t.to_json(v)), dumps(j))
        self.assertEqual(dumps(t.to_json(t.lift(t.lower(v)))), dumps(j))
        return t, v

    def test_ints(self):
        t, v = self.roundtrip("u64", "18446744073709551615")
        self.assertEqual(v, 2**64 - 1)
        self.roundtrip("s64", "-9223372036854775808")
        self.roundtrip("u8", 255)
        for spec, bad in [("u64", "01"), ("u64", "+1"), ("u64", "-1"), ("u64", 5), ("u64", "18446744073709551616"),
                          ("u64", " 1"), ("s64", "-0"), ("u8", 256), ("u8", -1), ("u32", 1.0), ("u32", True), ("s32", "1")]:
            with self.assertRaises(DecodeError, msg=f"{spec} {bad!r}"):
                compile_type(spec).from_json(bad)
        with self.assertRaises(DecodeError):
            compile_type("u8").lower(300)
        with self.assertRaises(DecodeError):
            compile_type("u32").lower(True)

    def test_bytes(self):
        t, v = self.roundtrip(STATE, {"version": 2, "payload": "AQID"})
        self.assertEqual(v["payload"], b"\x01\x02\x03")
        self.roundtrip(STATE, {"version": 2, "payload": ""})
        for bad in ("AQI", "AQJ=", "AQ==AQ==", "A-I=", "AQI=\n", 5):
            with self.assertRaises(DecodeError, msg=repr(bad)):
                t.from_json({"version": 2, "payload": bad})

    def test_records(self):
        t = compile_type(STATE)
        with self.assertRaises(DecodeError):
            t.from_json({"version": 2})
        with self.assertRaises(DecodeError):
            t.from_json({"version": 2, "payload": "", "extra": 1})
        # Any order in, WIT order out.
        self.assertEqual(dumps(t.to_json(t.from_json({"payload": "", "version": 1}))), '{"version":1,"payload":""}')

    def test_variants(self):
        t, v = self.roundtrip(OUTCOME, {"tag": "ok"})
        # As wasmtime-py decides: no two cases share a Python class, so untagged.
        self.assertFalse(t.tagged)
        self.assertIsNone(t.lower({"tag": "ok"}))
        two_records = compile_type({"variant": [{"name": "a", "type": STATE}, {"name": "b", "type": STATE}]})
        self.assertTrue(two_records.tagged)
        w = two_records.lower({"tag": "b", "val": {"version": 1, "payload": b""}})
        self.assertEqual(w.tag, "b")
        self.roundtrip(OUTCOME, {"tag": "failed", "val": {"status": 429, "retry-after-ms": "1000"}})
        self.roundtrip(OUTCOME, {"tag": "failed", "val": {"status": 0, "retry-after-ms": None}})
        for bad in ({"tag": "ok", "val": None}, {"tag": "failed"}, {"tag": "nope"}, {"tag": "ok", "x": 1}, "ok"):
            with self.assertRaises(DecodeError, msg=repr(bad)):
                t.from_json(bad)
        # Untagged as wasmtime-py lowers it: the bare payload.
        tp = compile_type(TARGET_PORT)
        self.assertFalse(tp.tagged)
        self.assertEqual(tp.lower({"tag": "number", "val": 8080}), 8080)
        self.assertEqual(tp.lift("http"), {"tag": "name", "val": "http"})
        se = compile_type({"result": {"ok": {"own": "tracker"}, "err": STATE_ERROR}})
        self.assertFalse(se.tagged)
        self.assertEqual(se.lift(7), {"tag": "err", "val": {"tag": "unsupported-version", "val": 7}})

    def test_options_enums_tuples(self):
        self.roundtrip({"option": "string"}, None)
        self.roundtrip({"option": {"enum": ["a", "b"]}}, "b")
        self.roundtrip({"tuple": ["u64", OUTCOME]}, ["5", {"tag": "ok"}])
        self.roundtrip({"result": {"ok": None, "err": "string"}}, {"tag": "ok"})
        with self.assertRaises(DecodeError):
            compile_type({"enum": ["a"]}).from_json("c")
        with self.assertRaises(DecodeError):
            compile_type({"tuple": ["u8", "u8"]}).from_json([1])

    def test_unsupported(self):
        for spec in ("f64", "char", {"option": {"option": "u8"}}, {"flags": ["a"]},
                     {"variant": [{"name": "a", "type": "s32"}, {"name": "b", "type": "bool"}]}):
            with self.assertRaises(codec.SchemaError, msg=dumps(spec)):
                compile_type(spec)

    def test_paths(self):
        t = compile_type({"list": {"record": [{"name": "a-b", "type": {"list": "u64"}}]}})
        with self.assertRaises(DecodeError) as cm:
            t.from_json([{"a-b": []}, {"a-b": ["1", "x"]}])
        self.assertEqual(str(cm.exception).split(":")[0], "[1].a-b[1]")


class Lines(unittest.TestCase):
    def test_bounded_reader(self):
        old = replay.MAX_LINE_BYTES
        replay.MAX_LINE_BYTES = 8
        try:
            with tempfile.NamedTemporaryFile("wb", delete=False) as f:
                f.write(b"12345678\n123456789\n")
            it = replay._read_lines(f.name)
            self.assertEqual(next(it), (1, b"12345678"))
            with self.assertRaises(replay.TraceError) as cm:
                next(it)
            self.assertEqual(cm.exception.line, 2)
            with open(f.name, "wb") as g:
                g.write(b"1234\n5678")  # a last line without its newline: truncated
            it = replay._read_lines(f.name)
            self.assertEqual(next(it), (1, b"1234"))
            with self.assertRaises(replay.TraceError) as cm:
                next(it)
            self.assertEqual(cm.exception.line, 2)
        finally:
            replay.MAX_LINE_BYTES = old
            os.unlink(f.name)

    def test_scan_object(self):
        m = replay._scan_object('{"seq":1, "args":{"a": [1,2]},"result":{"tag":"ok"} }')
        self.assertEqual(m["args"], ({"a": [1, 2]}, '{"a": [1,2]}'))
        self.assertEqual(m["result"][1], '{"tag":"ok"}')
        for bad in ('{"a":1,"a":2}', '{"a":1', '{"a":1} x', '[1]', '{"a":NaN}'):
            with self.assertRaises(ValueError, msg=bad):
                replay._scan_object(bad)

if __name__ == "__main__":
    unittest.main()
