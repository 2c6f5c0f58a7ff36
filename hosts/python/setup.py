"""Copies the schema into the package at build time.

The schema's one home is ``hosts/schema/clb-reconciler.json`` (``clb-host schema`` writes it; the
test suite checks it). A build from this directory copies it into the built package as
``clb_reconciler/schema.json``; an sdist carries that copy, so a wheel built from the sdist has it
too. Nothing is written into the source tree.
"""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKOUT_SCHEMA = os.path.join(HERE, "..", "schema", "clb-reconciler.json")
PACKAGED_SCHEMA = os.path.join(HERE, "clb_reconciler", "schema.json")  # only inside an sdist


def schema_source() -> str:
    override = os.environ.get("CLB_SCHEMA")
    for candidate in (override, CHECKOUT_SCHEMA, PACKAGED_SCHEMA):
        if candidate and os.path.isfile(candidate):
            return candidate
    raise SystemExit(f"clb-reconciler: no schema to package: expected {os.path.normpath(CHECKOUT_SCHEMA)}")


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        target = os.path.join(self.build_lib, "clb_reconciler", "schema.json")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(schema_source(), target)


class Sdist(sdist):
    def make_release_tree(self, base_dir, files) -> None:
        super().make_release_tree(base_dir, files)
        shutil.copyfile(schema_source(), os.path.join(base_dir, "clb_reconciler", "schema.json"))


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
