"""What a Python program started by ``allocd run`` runs first.

``allocd run`` puts this file's folder first on PYTHONPATH and sets
ALLOCD_AUTOSTART=1, so that a script with no ``import allocd`` is tuned as
with ``allocd.enable()``: once the program imports torch, the allocd package
(allocd/_autostart.py) takes over. Nothing is imported here beyond what
Python's start imports anyway: a program that never imports torch runs as
it would without allocd, and this folder leaves sys.path again. The
sitecustomize this one shadows (a distribution's, the job's own) still runs.
"""

import os
import sys


def _chain(here):
    """Runs the sitecustomize that this one hides from Python, as Python
    would have: its errors are reported by Python's start as they would be."""
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
    if spec is None or spec.loader is None or os.path.dirname(spec.origin or "") == here:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _autostart(here):
    """allocd._autostart: of the program's allocd package, else of the one
    this file is part of."""
    import importlib
    import importlib.util

    if importlib.util.find_spec("allocd") is None:
        package = os.path.dirname(here)
        if not os.path.exists(os.path.join(package, "__init__.py")):
            raise ImportError("this Python has no allocd package (pip install it into the "
                              "job's environment: pip install build/release/python)")
        sys.path.append(os.path.dirname(package))
    return importlib.import_module("allocd._autostart")


class _AfterTorch:
    """Runs `then(torch)` once torch has been imported, whoever imports it.

    A finder first on sys.meta_path that answers only for "torch", with the
    spec the other finders give and a loader that runs the module and then
    `then`; it leaves sys.meta_path as soon as torch is being imported."""

    def __init__(self, then):
        self._then = then

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenLoader(spec.loader, self._then)
        return spec


class _ThenLoader:
    """A module's loader, followed by a call once the module has run."""

    def __init__(self, loader, then):
        self._loader = loader
        self._then = then

    def __getattr__(self, name):  # get_data, is_package, resource readers
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        # The module keeps its own loader, as without allocd.
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._then(module)


def _start(torch, here):
    """torch is imported: hand the job to the allocd package. Never fails the
    program's import: what goes wrong is a warning, and the job runs on the
    daemon's memory untuned."""
    import warnings

    try:
        _autostart(here).start(torch)
    except Exception as error:  # noqa: BLE001 (an import of torch must not fail for allocd)
        warnings.warn(f"allocd run: the job is not tuned: {error}", RuntimeWarning,
                      stacklevel=2)


def _main():
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    if os.environ.get("ALLOCD_AUTOSTART") == "1":
        # First, so that a chained sitecustomize that imports torch is seen.
        sys.meta_path.insert(0, _AfterTorch(lambda torch: _start(torch, here)))
    _chain(here)


_main()
