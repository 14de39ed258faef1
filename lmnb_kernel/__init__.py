"""lmnb_kernel — the Jupyter side of lmnb: ``%%lm`` cells, the ``lmnb`` kernel, ``lmnb run``.

Everything lives in an IPython extension, so ``%load_ext lmnb_kernel`` gives any IPython kernel the
magics; the ``lmnb`` kernel (``lmnb_kernel.kernel``) is a thin ``IPythonKernel`` that loads it.
"""

__version__ = "0.1.0"


def load_ipython_extension(shell) -> None:
    """Register ``%%lm`` / ``%lm``, the clean error display, the tree refresh hook and the hooks that
    keep the running cell's text (for line numbers), make the
    session's backend lmnb's default (so Python cells share the ``%%lm`` cells' engine), and
    define ``lmnb`` in the namespace unless a name ``lmnb`` exists (``%%lm --python`` bodies
    write ``lmnb.gen(...)``; hidden from ``%who``)."""
    import lmnb

    from lmnb_kernel.errors import CellError, show_cell_error
    from lmnb_kernel.magics import LMMagics, define_lmnb
    from lmnb_kernel.session import SessionBackend, get_session

    lmnb.set_default_backend(SessionBackend(get_session()))

    magics = LMMagics(shell)
    shell.register_magics(magics)
    shell.set_custom_exc((CellError,), show_cell_error)
    shell.events.register("post_run_cell", magics.refresh_tree)
    shell.events.register("pre_run_cell", magics.note_cell)
    shell.events.register("post_run_cell", magics.forget_cell)
    shell._lmnb_magics = magics
    shell._lmnb_pushed = define_lmnb(shell)


def unload_ipython_extension(shell) -> None:
    """Remove ``%%lm`` / ``%lm``, the hook, the error handler, lmnb's default backend and the
    ``lmnb`` name (set at load); the session (engine, states) stays for a reload."""
    import lmnb

    if getattr(shell, "_lmnb_pushed", False):
        del shell._lmnb_pushed
        if shell.user_ns.get("lmnb") is lmnb:
            shell.drop_by_id({"lmnb": lmnb})
    magics = getattr(shell, "_lmnb_magics", None)
    if magics is not None:
        shell.events.unregister("post_run_cell", magics.refresh_tree)
        shell.events.unregister("pre_run_cell", magics.note_cell)
        shell.events.unregister("post_run_cell", magics.forget_cell)
        shell.set_custom_exc((), None)
        for kind in ("line", "cell"):  # IPython has no unregister_magics; its table is per kind
            shell.magics_manager.magics[kind].pop("lm", None)
        del shell._lmnb_magics
    lmnb.set_default_backend(None)
