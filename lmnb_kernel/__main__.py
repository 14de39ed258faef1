"""``python -m lmnb_kernel -f CONNECTION_FILE``: the command line of the ``lmnb`` kernelspec.

``python -m lmnb_kernel run NOTEBOOK`` (any ``lmnb`` subcommand) is the ``lmnb`` command line
instead: started as a kernel, it would ignore the words and wait for a client that never comes.
"""

import sys

from lmnb_kernel.cli import SUBCOMMANDS

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in SUBCOMMANDS:
        from lmnb_kernel.cli import main as cli_main

        sys.exit(cli_main())
    try:
        from lmnb_kernel.kernel import main

        main()
    except KeyboardInterrupt:  # (once started, ipykernel handles it: this is an interrupt while it starts)
        # jupyter_client interrupts a kernel it shuts down (lmnb run on SIGTERM): one that was still
        # starting printed a KeyboardInterrupt traceback into the run's output
        sys.exit(130)
