"""Whether fla-core (the `bench` extra, or any install of fla-core >= 0.6) can be used for chunked prefill.

fla is imported only when a kernel of it is called: with fla installed, transformers' Qwen3.5 fails on the CPU, so
nothing may import it on a machine that merely has the package.
"""

import importlib.util


def fla_available() -> bool:
    """Whether fla can be imported (False also when it is hidden, as the tests do with sys.modules['fla'] = None)."""
    try:
        return importlib.util.find_spec("fla") is not None
    except ValueError:  # a module object without a spec
        return False
