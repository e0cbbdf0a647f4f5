"""Test only: torchrun honours TORCH_ELASTIC_SHUTDOWN_TIMEOUT on torch 2.8 too, as torch 2.12+ does itself.

tests/training/resilience/test_container_stop.py puts this folder on the PYTHONPATH of the container it runs, with the
variable set to a few seconds: the grace torchrun would give its workers after a signal (a fixed 30 s on 2.8) is
then seconds, and a stop-time save slower than that proves in seconds what a 35 s save proved against 30 s (the
save is not cut, because torchrun is never signalled). Python imports `sitecustomize` at startup; this one
waits for torch's process-context module to be imported and changes the default of its `close` timeout (2.8's
agent calls `close(death_sig)` without one; 2.12+ passes the variable's value itself, so this changes nothing).
"""

import importlib.util
import os
import sys

_TARGET = "torch.distributed.elastic.multiprocessing.api"
_GRACE = os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")


class _AfterImport:
    """A meta-path finder that lets the module load as usual, then shortens its default grace."""

    def find_spec(self, name, path=None, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            close = module.PContext.close
            close.__defaults__ = (*close.__defaults__[:-1], int(_GRACE))
            print(f"[torchrun-grace] {_GRACE} s after a signal", file=sys.stderr, flush=True)

        spec.loader.exec_module = exec_module
        return spec


if _GRACE:
    sys.meta_path.insert(0, _AfterImport())
