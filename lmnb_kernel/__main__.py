"""``python -m lmnb_kernel -f CONNECTION_FILE``: the command line of the ``lmnb`` kernelspec."""

from lmnb_kernel.kernel import main

if __name__ == "__main__":
    main()
