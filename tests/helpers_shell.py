"""The one IPython shell of the test process.

IPython keeps a process-wide singleton: ``start_ipython()`` fails once a plain
``InteractiveShell`` exists, and ``InteractiveShell.instance()`` returns whichever shell came
first. Every test module gets its shell here, so module order does not matter; ``lm_shell`` is
that shell with lmnb's extension and an engine, for the modules that run ``%%lm`` cells.
"""

from __future__ import annotations

from contextlib import contextmanager


def process_shell():
    """The process's ``InteractiveShell``, starting IPython's test shell if none exists yet."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.testing import globalipapp

    if InteractiveShell.initialized():
        return InteractiveShell.instance()
    globalipapp.start_ipython()
    return globalipapp.get_ipython()


@contextmanager
def lm_shell(model_dir):
    """The process shell with the ``lmnb_kernel`` extension loaded and the kernel session's engine
    on checkpoint ``model_dir``; on exit the session is closed, the extension unloaded and lmnb's
    default backend put back as it was."""
    from lmnb_kernel.session import EngineConfig, get_session

    import lmnb

    shell = process_shell()
    default_backend = lmnb.api._default_backend
    shell.extension_manager.load_extension("lmnb_kernel")
    session = get_session()
    session.load(EngineConfig(model=str(model_dir)))
    yield shell
    session.close()
    shell.extension_manager.unload_extension("lmnb_kernel")
    lmnb.api._default_backend = default_backend  # (unloading keeps a backend a cell set: not the next test's)
