"""The client libraries export their C functions and nothing else.

A library that is preloaded (`allocd run`) or loaded RTLD_GLOBAL
(allocd.enable()) comes before every later library in symbol lookup: had it
exported the protobuf, gRPC, Abseil or JSON code it links, its copies would
stand in for other libraries' own in the job's process. And every function
the Python package calls through ctypes must be there.

    ALLOCD_PYTHON_SOURCE=client/python/allocd \
      python3 test_exports.py NAME=PATH...    (NAME: client, interpose, torch)
"""

import os
import re
import subprocess
import sys
import unittest

# What each library may export, and the package modules whose ctypes calls
# it must answer.
CONTRACTS = {
    "client": (r"allocd_\w+", ("_bindings.py",)),
    "interpose": (r"allocd_\w+|cuda\w+", ("_bindings.py", "_advisor.py")),
    "torch": (r"allocd_torch_\w+", ("_engine.py",)),
}
# Called on the interposer's sessions only.
INTERPOSER_ONLY = re.compile(r"allocd_interpose_\w+")
# What PyTorch's allocator calls in the interposer's place.
INTERPOSED = {"cudaMalloc", "cudaFree", "cudaMemGetInfo", "cudaGetDriverEntryPoint"}


def exported(path):
    out = subprocess.run(["nm", "-D", "--defined-only", path], check=True,
                         capture_output=True, text=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def called_by_package(modules):
    names = set()
    for module in modules:
        with open(os.path.join(os.environ["ALLOCD_PYTHON_SOURCE"], module)) as f:
            names |= set(re.findall(r'"(allocd_\w+)"', f.read()))
    return names


class ExportsTest(unittest.TestCase):
    libraries = {}

    def check(self, name, path):
        allowed, modules = CONTRACTS[name]
        symbols = exported(path)
        stray = sorted(s for s in symbols if not re.fullmatch(allowed, s))
        self.assertEqual(stray, [], f"{path} exports more than its C functions")
        needed = called_by_package(modules)
        if name == "client":
            needed = {n for n in needed if not INTERPOSER_ONLY.fullmatch(n)}
        if name == "interpose":
            needed |= INTERPOSED
        self.assertTrue(needed, f"no ctypes calls found in {modules}")
        self.assertEqual(sorted(needed - symbols), [],
                         f"{path} lacks functions the Python package calls")

    def test_each_library_exports_exactly_its_contract(self):
        self.assertIn("client", self.libraries)
        for name, path in self.libraries.items():
            with self.subTest(library=name):
                self.check(name, path)


if __name__ == "__main__":
    for argument in sys.argv[1:]:
        name, _, path = argument.partition("=")
        if name not in CONTRACTS or not path:
            sys.exit(f"usage: {sys.argv[0]} NAME=PATH... (NAME: {', '.join(CONTRACTS)})")
        ExportsTest.libraries[name] = path
    unittest.main(argv=sys.argv[:1])
