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
    from lmnb_kernel.kernel import main

    main()
