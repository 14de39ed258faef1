"""lmnb_kernel — the Jupyter side of lmnb: ``%%lm`` cells, the ``lmnb`` kernel, ``lmnb run``.

Everything lives in an IPython extension, so ``%load_ext lmnb_kernel`` gives any IPython kernel the
magics; the ``lmnb`` kernel (``lmnb_kernel.kernel``) is a thin ``IPythonKernel`` that loads it.
"""

__version__ = "0.1.0"


def load_ipython_extension(shell) -> None:
    """Register ``%%lm`` / ``%lm``, the clean error display, the tree refresh hook, the input
    transform that names a ``%%lm`` line below a comment (``lmnb_kernel.transforms``), the hooks that
    keep the running cell's text (for line numbers), make the
    session's backend lmnb's default (so Python cells share the ``%%lm`` cells' engine; also after
    ``lmnb.set_default_backend(None)``),
    define ``lmnb`` in the namespace unless a name ``lmnb`` exists (``%%lm --python`` bodies
    write ``lmnb.gen(...)``; hidden from ``%who``; again after ``%reset``), and, in a Jupyter kernel other than ``lmnb``'s,
    make its session send text with lone surrogates (``lmnb_kernel.surrogates``), as ``lmnb``'s does."""
    import lmnb

    from lmnb_kernel.errors import CellError, show_cell_error
    from lmnb_kernel.lmnb_name import put_lmnb
    from lmnb_kernel.magics import LMMagics
    from lmnb_kernel.session import SessionBackend, get_session
    from lmnb_kernel.transforms import refuse_cell_magic_below_comments

    lmnb.set_default_backend(SessionBackend(get_session()))
    lmnb.api.set_unset_default(lambda: SessionBackend(get_session()))  # (set_default_backend(None) comes back here)

    magics = LMMagics(shell)
    shell.register_magics(magics)
    shell.set_custom_exc((CellError,), show_cell_error)
    shell.events.register("post_run_cell", magics.refresh_tree)
    shell.events.register("pre_run_cell", magics.note_cell)
    shell.events.register("post_run_cell", magics.forget_cell)
    shell._lmnb_magics = magics
    if refuse_cell_magic_below_comments not in shell.input_transformers_cleanup:
        shell.input_transformers_cleanup.append(refuse_cell_magic_below_comments)
    put_lmnb(shell)
    session = getattr(getattr(shell, "kernel", None), "session", None)  # (a terminal IPython has none)
    if session is not None:
        from lmnb_kernel.surrogates import make_session_surrogate_safe

        replaced = make_session_surrogate_safe(session)  # (None in the lmnb kernel: its session is safe for good)
        if replaced is not None:
            shell._lmnb_replaced_pack = replaced


def unload_ipython_extension(shell) -> None:
    """Remove ``%%lm`` / ``%lm``, the hook, the error handler, the input transform, the session's
    backend as lmnb's default (a backend the user set with ``lmnb.set_default_backend`` stays), the
    ``lmnb`` name (unless a cell bound it, e.g. the user's own ``import lmnb``, or may have, e.g. by
    ``%run``: ``lmnb_kernel.lmnb_name``) and the kernel session's surrogate-safe packer (set at load); the
    session (engine, states) stays for a reload."""
    import lmnb

    from lmnb_kernel.lmnb_name import take_lmnb
    from lmnb_kernel.transforms import refuse_cell_magic_below_comments

    replaced = getattr(shell, "_lmnb_replaced_pack", None)
    if replaced is not None:
        del shell._lmnb_replaced_pack
        session = shell.kernel.session
        if getattr(session.pack, "surrogate_safe", False):
            session.pack = replaced

    take_lmnb(shell)
    magics = getattr(shell, "_lmnb_magics", None)
    if magics is not None:
        shell.events.unregister("post_run_cell", magics.refresh_tree)
        shell.events.unregister("pre_run_cell", magics.note_cell)
        shell.events.unregister("post_run_cell", magics.forget_cell)
        shell.set_custom_exc((), None)
        if refuse_cell_magic_below_comments in shell.input_transformers_cleanup:
            shell.input_transformers_cleanup.remove(refuse_cell_magic_below_comments)
        for kind in ("line", "cell"):  # IPython has no unregister_magics; its table is per kind
            shell.magics_manager.magics[kind].pop("lm", None)
        del shell._lmnb_magics
    lmnb.api.set_unset_default(None)
    from lmnb_kernel.session import SessionBackend

    if isinstance(lmnb.api._default_backend, SessionBackend):  # (a backend the user set is theirs to keep)
        lmnb.set_default_backend(None)
