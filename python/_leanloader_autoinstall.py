"""Run at every interpreter start by leanloader_install.pth: with
LEANLOADER_INSTALL=1 in the environment, ll.install() is applied as soon as
torch has been imported (its DataLoader module loads in the middle of torch's
own import, too early), so child interpreters (torchrun, a
framework's DDP launcher) build ll.DataLoaders too. Without the variable it
does nothing and imports nothing."""

import os
import sys

_TARGET = "torch"


class _InstallAfterTorchDataLoader:
    """A meta path finder that lets torch load, then installs."""

    def __init__(self):
        self._finding = False

    def find_spec(self, name, path=None, target=None):
        if name != _TARGET or self._finding:
            return None
        import importlib.util

        self._finding = True  # the other finders find torch's module
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._finding = False
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_then_install(module):
            exec_module(module)
            sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
            import leanloader

            leanloader.install()

        loader.exec_module = exec_then_install
        return spec


if os.environ.get("LEANLOADER_INSTALL", "") == "1" and _TARGET not in sys.modules:
    sys.meta_path.insert(0, _InstallAfterTorchDataLoader())
