"""The one IPython shell of the test process.

IPython keeps a process-wide singleton: ``start_ipython()`` fails once a plain
``InteractiveShell`` exists, and ``InteractiveShell.instance()`` returns whichever shell came
first. Every test module gets its shell here, so module order does not matter.
"""

from __future__ import annotations


def process_shell():
    """The process's ``InteractiveShell``, starting IPython's test shell if none exists yet."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.testing import globalipapp

    if InteractiveShell.initialized():
        return InteractiveShell.instance()
    globalipapp.start_ipython()
    return globalipapp.get_ipython()
