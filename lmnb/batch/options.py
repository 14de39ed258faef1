"""The command line of an exported script, and the backend its options name.

Job options (``--input``, ``--output``, ``--backend``, ...) come first; each notebook parameter
(papermill's ``parameters`` cell) adds ``--name VALUE``, read like its default's type.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from lmnb.backend.base import BackendAuthError, key_refusal, without_key_fix
from lmnb.backend.openai import KEY_ENV as OPENAI_KEY_ENV  # (its top level: no openai, no torch)
from lmnb.backend.runtime_endpoint import READ_TIMEOUT_S
from lmnb.batch.inputs import FORMATS, InputError, input_format
from lmnb.batch.messages import say
from lmnb.template.cell_options import positive_seconds
from lmnb_engine import API_KEY_ENV, MODEL_ENV, model_or_env  # (the package alone: no torch, no model code)
from lmnb_engine.cli_options import (Once, OnceFlag, SuggestingParser, digits_fix, in_option_syntax, option_integer,
                                     pool_tokens, take_negative_numbers)
from lmnb_engine.params import too_many_digits  # (torch-free)

DEFAULT_THREADS = 16


@dataclass
class Backend:
    """A notebook's ``%lm load`` / ``%lm connect`` line: the backend its later cells ran on, which
    an exported job's backend options default to (``job_parser``). Here, not in ``lmnb.export``,
    since the export imports the job's code, not the other way round."""

    model: Optional[str] = None  # %lm load MODEL
    url: Optional[str] = None  # %lm connect URL
    openai_model: Optional[str] = None  # %lm connect URL --openai MODEL
    completion: bool = False  # ... --completion: a completion model (select needs one)
    continue_final_message: bool = False  # ... --continue-final-message: gens inside a reply
    timeout: Optional[float] = None  # ... --timeout SECONDS


class _JobParser(SuggestingParser):
    """Parses the job's options, then fills in the notebook's backend: ``--openai``, ``--completion``,
    ``--continue-final-message`` and ``--timeout`` default to the notebook's only when ``--backend``
    is not given, since they describe the notebook's server (``--backend engine`` on a job whose
    notebook connected to an OpenAI-compatible server sent the rows to the official OpenAI API);
    ``--completion`` and ``--continue-final-message`` only with the notebook's ``--openai`` model,
    since they say what kind of model and server that is. A misspelt option,
    the notebook parameters' included, is offered its closest (``SuggestingParser``)."""

    notebook_backend: Backend = Backend()

    def error(self, message: str):
        """argparse's refusal, with the way to write a value that starts with "-" where argparse
        took it for an option (``--name -Bob``: "expected one argument")."""
        if message.startswith("argument ") and message.endswith(": expected one argument"):
            option = message[len("argument "):].split(":")[0].split("/")[-1]
            message += f"; a value starting with '-' is written {option}=VALUE (e.g. {option}=-x)"
        super().error(message)

    def parse_known_args(self, args=None, namespace=None):
        ns, rest = super().parse_known_args(args, namespace)
        if hasattr(ns, "backend"):
            notebook = self.notebook_backend
            if ns.backend is None:
                ns.backend = notebook.url or "engine"
                if ns.openai is None:
                    ns.openai = notebook.openai_model
                    ns.completion = notebook.completion if ns.completion is None else ns.completion
                    if ns.continue_final_message is None:
                        ns.continue_final_message = notebook.continue_final_message
                ns.timeout = notebook.timeout if ns.timeout is None else ns.timeout
            ns.completion = bool(ns.completion)
            ns.continue_final_message = bool(ns.continue_final_message)
        return ns, rest


def job_parser(description: str = "", per_row: bool = True, backend: Optional[str] = None,
               openai_model: Optional[str] = None, model: Optional[str] = None, completion: bool = False,
               timeout: Optional[float] = None, continue_final_message: bool = False) -> argparse.ArgumentParser:
    """The job's options; ``backend`` / ``openai_model`` / ``model`` / ``completion`` / ``timeout`` /
    ``continue_final_message`` are the notebook's defaults (its ``%lm load`` / ``%lm connect`` line);
    an explicit ``--backend`` leaves the notebook's ``openai_model``, ``completion``, ``timeout`` and
    ``continue_final_message`` out.
    Without ``per_row`` only the backend options (a script that runs its cells once)."""
    # (SuggestingParser's allow_abbrev off: a parameter's option is the notebook's name, and with a row
    # field named num, no --num option, argparse took --num 5 for --num-threads 5 without a word)
    p = _JobParser(description=_description(description), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.notebook_backend = Backend(model=model, url=backend, openai_model=openai_model, completion=completion,
                                 continue_final_message=continue_final_message, timeout=timeout)
    backend, openai_model, model = (_escaped(x) for x in (backend, openai_model, model))  # (from here: help texts)
    take_negative_numbers(p)  # (a parameter's --lr -1e-3)
    with_backend = " with the default --backend" if backend else ""
    if per_row:
        p.add_argument("--input", action=Once, required=True, type=Path, metavar="ROWS",
                       help="the rows: JSON lines (.jsonl, one object per line) or CSV/TSV with a header "
                            "(CSV values are strings)")
        p.add_argument("--output", action=Once, required=True, type=_results_path, metavar="RESULTS",
                       help="results (.jsonl), one JSON line per row; appended to, so rerunning continues where "
                            "it stopped; folders that do not exist are made")
    p.add_argument("--backend", action=Once, default=None, metavar="engine|URL",
                   help="'engine': a model in this process; a URL: an SGLang or 'lmnb serve' server, or with "
                        "--openai an OpenAI-compatible API root (…/v1) (default: "
                        + (f"{backend}, the notebook's" if backend else "engine") + ")")
    p.add_argument("--openai", action=Once, metavar="MODEL", default=None,
                   help="the backend is an OpenAI-compatible API; use this model name"
                        + (f" (default{with_backend}: {openai_model})" if openai_model else ""))
    p.add_argument("--completion", action=OnceFlag, default=None,
                   help="with --openai: a completion model (prompts go out as text, not chat messages)"
                        + (f" (the default{with_backend} and --openai)" if completion else ""))
    p.add_argument("--continue-final-message", action=OnceFlag, default=None,
                   help="with --openai, a chat model on a vLLM, SGLang or lmnb serve server: a gen after text inside "
                        "an assistant message has the server continue that text (their continue_final_message field)"
                        + (f" (the default{with_backend} and --openai)" if continue_final_message else ""))
    p.add_argument("--api-key", action=Once,
                   help=f"API key sent to the server (default: ${API_KEY_ENV}; with --openai: ${OPENAI_KEY_ENV}); the "
                        "variable keeps the key out of ps and the shell's history")
    p.add_argument("--timeout", action=Once, type=positive_seconds, metavar="SECONDS", default=None,
                   help=f"server backends: seconds to wait for the server's response before the row fails "
                        f"(default{with_backend if timeout is not None else ''}: "
                        f"{timeout if timeout is not None else READ_TIMEOUT_S:g})")
    p.add_argument("--model", action=Once, metavar="PATH", default=None,
                   help="engine backend: HF checkpoint directory or hub id (default: "
                        + (model or f"${MODEL_ENV}, else the built-in demo model") + ")")
    p.add_argument("--device", action=Once, help="engine backend: cuda or cpu")
    p.add_argument("--dtype", action=Once, help="engine backend: float32, bfloat16 or float16")
    p.add_argument("--max-total-tokens", action=Once, type=pool_tokens, metavar="N",
                   help="engine backend: KV cache size in tokens (default: from the free memory)")
    p.add_argument("--chat-template", action=Once, metavar="NAME",
                   help="the format of the programs' chat roles, by its name in SGLang's registry (chatml, llama-3-"
                        "instruct, ...: lmnb.get_chat_template's), for a model with none of its own (a base model) "
                        "or another than its own; the engine, a --backend URL, or --openai with --completion "
                        "(default: the model's own)")
    if not per_row:
        return p
    p.add_argument("--num-threads", action=Once, type=_positive_int, default=DEFAULT_THREADS, metavar="N",
                   help=f"rows run at once (default {DEFAULT_THREADS}); with more than one, what a row "
                   "prints comes out in one piece when the row ends")
    p.add_argument("--limit", action=Once, type=_count, metavar="N", help="use only the first N rows of the input")
    p.add_argument("--id-field", action=Once, metavar="F", help="key rows by this field instead of their position "
                   "(use it if the input may change between runs)")
    p.add_argument("--input-format", action=Once, choices=FORMATS, help="default: from the input file's suffix")
    p.add_argument("--retry-errors", action=OnceFlag,
                   help="run again the rows whose results are errors (their old records are removed); "
                        "rows whose input changed since run again without it")
    p.add_argument("--no-progress", action=OnceFlag, help="no progress bar (on stderr: drawn in place on a terminal; "
                   "into a file or a pipe, a line at most every 30 s and the last with the count)")
    p.epilog = JOB_EXIT_STATUSES
    return p


def _escaped(text: Optional[str]) -> Optional[str]:
    """``text`` (the notebook's, in an option's help) as argparse shows it: it fills ``%(default)s``
    in help texts, so a lone ``%`` (``fmt = '%d items'``, a URL's ``%7e``) ended ``--help`` in a
    TypeError or ValueError traceback."""
    return text.replace("%", "%%") if text else text


def _description(text: str) -> str:
    """The job's description (the notebook's title and text) as argparse shows it: it fills
    ``%(prog)s`` in a description that holds one, and only then (a title's ``100%`` failed)."""
    return _escaped(text) if "%(prog)" in text else text


# The exit statuses of a per-row job (lmnb.batch.runner's EXIT_* constants; runner imports this
# module, so they are spelled out here), for its --help.
JOB_EXIT_STATUSES = """exit status:
  0    every row of the results file is ok
  1    some rows failed or had bad input: their records' "error" says why; fix the
       input and run again (--retry-errors: also the failed rows whose input is the same)
  2    the options, the input, the results file or the backend cannot be used, or the
       notebook's set-up raised (the message says which, and how to fix it)
  130  stopped by Ctrl-C or SIGTERM with rows left: run the same command again to continue
  141  the pipe that the rows print into was closed (| head); the rest run on a rerun"""


def parameter_options(names, per_row: bool = True) -> dict:
    """name → command-line option of each notebook parameter: ``--max-len`` for ``max_len``, or
    ``--param-limit`` for a name whose option the job itself has (``--limit``).

    Raises:
        ValueError: two parameters would have one option (``limit`` and ``param_limit``: argparse
            refused the second as a "conflicting option string" when the job started).
    """
    taken = set(job_parser(per_row=per_row)._option_string_actions)
    out: dict = {}
    for name in names:
        option = "--" + name.replace("_", "-")
        own = option if option in taken else None
        if own:
            option = "--param-" + name.replace("_", "-")
        other = next((n for n, o in out.items() if o == option), None)
        if other is not None:
            renamed, plain = (name, other) if own else (other, name)
            raise ValueError(f"the parameters {renamed} and {plain} would both be the job's option {option} (the job "
                             f"has a {'--' + renamed.replace('_', '-')} of its own, so {renamed} becomes {option}); "
                             "rename one of them in the parameters cell")
        out[name] = option
    return out


def add_parameters(parser: argparse.ArgumentParser, defaults: dict, computed: Sequence[str] = (),
                   per_row: bool = True) -> dict:
    """Add an option per parameter (``parameter_options``) to ``parser``; returns name → dest.
    ``computed``: those of ``defaults`` whose default the parameters cell computes, which has not
    run yet: their option takes any text (read like the default once the cell ran)."""
    if not defaults:
        return {}
    group = parser.add_argument_group("notebook parameters", "defaults from the notebook's parameters cell")
    options = parameter_options(defaults, per_row)
    dests = {}
    for name, default in defaults.items():
        dests[name] = f"param_{name}"
        if name in computed:
            kind, said = str, "computed by the parameters cell when the job runs"
        else:
            kind, said = parameter_type(default), repr(default)
        group.add_argument(options[name], dest=dests[name], default=default, type=kind,
                           action=Once, metavar="VALUE", help=f"(default: {_escaped(said)})")
    return dests


def engine_model(args: argparse.Namespace, default_model: Optional[str] = None) -> Optional[str]:
    """The checkpoint the in-process engine loads: ``--model``, else ``default_model`` (the
    notebook's), else ``$LMNB_MODEL``; None for the built-in demo model, and when the options name
    a server instead of the engine."""
    if args.backend != "engine" or args.openai:
        return None
    return model_or_env(args.model or default_model)


def start_failure(args: argparse.Namespace, default_model: Optional[str], e: BaseException) -> str:
    """The line that says why the backend ``args`` name did not start (``e``), with the job's
    option to give when a server refused it for its API key."""
    text = (f"could not start the backend ({backend_label(args, default_model)}): {type(e).__name__}: "
            f"{without_key_fix(e) if isinstance(e, BackendAuthError) else in_option_syntax(e, vars(args))}")
    return text + (key_advice(args) if isinstance(e, BackendAuthError) else "")


def key_advice(args: argparse.Namespace) -> str:
    """The end of a message of a server's refusal of the job's API key (HTTP 401): the option that
    gives it, or where the key refused came from."""
    why, fix = _key_refusal(args)
    return f"; {why}" + (f": {fix}" if fix else "")


def key_refusal_fix(args: argparse.Namespace) -> tuple[str, str]:
    """For a job's summary of rows the server refused for the API key (HTTP 401): why (the key was
    missing, or which key it refused) and what to do, each a clause."""
    why, fix = _key_refusal(args)
    if fix:
        return why, fix
    if getattr(args, "api_key", None):
        return why, "check it and pass the right one with --api-key KEY"
    return why, f"check it and set the right one in ${_key_env(args)} (or pass --api-key KEY)"


def _key_env(args: argparse.Namespace) -> str:
    """The environment variable a job's API key defaults from: the openai client's with ``--openai``."""
    return OPENAI_KEY_ENV if getattr(args, "openai", None) else API_KEY_ENV


def _key_refusal(args: argparse.Namespace) -> tuple[str, Optional[str]]:
    """``key_refusal`` for the job's key: why the server refused it, and how to give one where none was sent."""
    env = _key_env(args)
    return key_refusal("the --api-key given" if getattr(args, "api_key", None) else None, env,
                       f"pass --api-key KEY or set ${env}")


def backend_label(args: argparse.Namespace, default_model: Optional[str] = None) -> str:
    """The backend the options name, for messages: ``engine``, a URL, or ``--openai MODEL`` and
    where it goes (``--backend engine`` with ``--openai`` is the official OpenAI API, not the engine).
    An engine whose model comes from ``$LMNB_MODEL`` says so: a model that failed to load was
    named in no option, so the message did not say where it came from."""
    if args.openai:
        return f"--openai {args.openai} at " + ("the official OpenAI API" if args.backend == "engine" else args.backend)
    if args.backend == "engine" and not (args.model or default_model) and engine_model(args):
        return f"engine, model {engine_model(args)} from ${MODEL_ENV}; --model names another"
    return args.backend


def make_backend(args: argparse.Namespace, default_model: Optional[str] = None):
    """The lmnb backend the options name: ``lmnb.Engine`` (``--model``, else ``default_model``, else
    ``$LMNB_MODEL``, else the demo model), ``lmnb.OpenAI`` (``--openai``) or ``lmnb.RuntimeEndpoint``.

    Raises:
        ValueError: options that do not fit together; model loading errors pass through.
    """
    import lmnb

    check_backend_options(args)
    url = args.backend
    if url == "engine" and not args.openai:
        kwargs = {k: getattr(args, k) for k in ("device", "dtype", "max_total_tokens") if getattr(args, k) is not None}
        if args.chat_template is not None:
            kwargs["chat_template_name"] = args.chat_template
        backend = lmnb.Engine(engine_model(args, default_model), **kwargs)
        backend.front_end_options = (vars(args), "")  # (a row's error names the job's --max-total-tokens)
        backend.on_guessed_template = _say_no_chat_template
        return backend
    timeout = {"timeout": args.timeout} if args.timeout is not None else {}  # else each backend's default
    if args.openai:
        template = {"chat_template": lmnb.get_chat_template(args.chat_template)} if args.chat_template else {}
        from lmnb.backend.openai import ContinueFinalMessageRefused

        try:
            backend = lmnb.OpenAI(args.openai, base_url=None if url == "engine" else url, api_key=args.api_key,
                                  is_chat_model=False if args.completion else None,
                                  continue_final_message=args.continue_final_message, **timeout, **template)
        except ContinueFinalMessageRefused as e:  # (in the job's words: its option, the notebook's fix)
            fix = (", and have the notebook's gens start their assistant messages ({assistant}{gen x}{/assistant})"
                   if e.official else "")
            raise ValueError(f"--continue-final-message: {e.why}; leave it out{fix}") from None
        backend.key_fix = key_advice(args)  # (a row's HTTP 401 names the job's --api-key, not the Python API)
        if url != "engine":
            _check_served_model(backend, args.openai, url)
        backend.on_guessed_template = _say_guessed_template
        return backend
    backend = lmnb.RuntimeEndpoint(url, api_key=args.api_key, chat_template_name=args.chat_template, **timeout)
    backend.key_fix = key_advice(args)  # (a row's HTTP 401 names the job's --api-key, not the Python API)
    backend.on_guessed_template = _say_no_chat_template
    return backend


def check_backend_options(args: argparse.Namespace) -> None:
    """Refuse backend options that do not fit together (``make_backend`` starts none of them), an
    unknown ``--chat-template`` (with the closest name), an engine ``--device`` or ``--dtype``
    the engine does not take (``lmnb_engine.device_names``), and a cuda ``--device`` on a machine
    that certainly has no CUDA (``lmnb_engine.cuda_presence``: a CPU build of torch, no NVIDIA
    driver; this imports torch, as the engine does), with no backend started: an exported job checks
    them before any notebook cell runs.

    Raises:
        ValueError: what does not fit, and what to give instead.
    """
    url = args.backend
    if args.completion and not args.openai:
        raise ValueError("--completion goes with --openai MODEL")
    if args.continue_final_message and (args.completion or not args.openai):
        raise ValueError("--continue-final-message goes with --openai MODEL, a chat model (not with --completion, "
                         "whose gens go anywhere in the text already)")
    if args.chat_template is not None:
        if args.openai and not args.completion:  # (it would be ignored: the server formats a chat model's messages)
            raise ValueError("--chat-template goes with --openai MODEL only for a completion model (add --completion); "
                             "the server applies a chat model's own template")
        from lmnb.chat_template import get_chat_template

        get_chat_template(args.chat_template)
    if url == "engine" and not args.openai:
        if args.timeout is not None:  # it would be ignored: nothing is waited for over a network
            raise ValueError("--timeout is for a server backend (--backend URL); the in-process engine has none")
        if args.device is not None or args.dtype is not None:
            from lmnb_engine.device_names import check_device, dtype_name  # (no torch; the engine's own rule)

            if args.device is not None and check_device(args.device).startswith("cuda"):
                from lmnb_engine.cuda_presence import missing_cuda, no_cuda_error  # (torch, which the engine imports)

                reason = missing_cuda()
                if reason is not None:
                    raise no_cuda_error(args.device, reason)
            if args.dtype is not None:
                dtype_name(args.dtype)
        return
    if args.model or args.device or args.dtype or args.max_total_tokens is not None:
        raise ValueError("--model/--device/--dtype/--max-total-tokens choose the in-process engine; a server runs "
                         "its own model (use --openai MODEL to name an OpenAI-compatible server's model)")
    if not args.openai and not url.startswith(("http://", "https://")):
        raise ValueError(f"--backend {url!r} is neither 'engine' nor an http(s) URL")


def _say_guessed_template(what: str) -> None:
    """``lmnb.OpenAI.on_guessed_template`` for a job's ``--openai MODEL --completion``: one line on
    stderr with the job's fixes, not a Python warning (its file, line and source)."""
    _say_above_bar(f"lmnb batch: warning: {what}; give its format with --chat-template NAME (e.g. --chat-template "
                   "chatml, a name in SGLang's registry), or give --backend the server's root URL without --openai (an lmnb serve or SGLang server), which uses the "
                   "model's own template, or leave out --completion if it is a chat model")


def _say_no_chat_template(what: str) -> None:
    """``on_guessed_template`` of a job's engine or ``--backend URL`` (a model with no chat template):
    one line on stderr with the job's fix, not a Python warning (lmnb's file and line, and
    ``Engine(chat_template_name=...)``, which a job cannot pass)."""
    _say_above_bar(f"lmnb batch: warning: {what}; give its format with --chat-template NAME (e.g. --chat-template "
                   "chatml, a name in SGLang's registry)")


def _say_above_bar(line: str) -> None:
    """``line`` on the job's stderr at once, from a row's thread, on a line of its own above the
    progress bar (a print went into the bar's line, or, with several threads, waited for the row's
    end among its own output): tqdm's write clears the bar and draws it again below; the real
    stderr is the one ``runner.RowOutput`` keeps rows' prints for."""
    from tqdm import tqdm

    say(line, lambda text: tqdm.write(text, file=getattr(sys.stderr, "target", sys.stderr)))


def _check_served_model(backend, model: str, url: str) -> None:
    """Ask the OpenAI-compatible server at ``url`` for its models (``GET /models``), as ``%lm
    connect`` does, so that a ``--openai`` name it does not serve stops the job before any row runs
    (exit 2) instead of writing an error record for every row, which a rerun with the right name
    could not retry (its settings differ). A server that does not answer, or answers without a
    model list (some proxies), passes: its rows fail as before, and a rerun retries them.

    Raises:
        ValueError: the server's list lacks ``model``.
        BackendAuthError: the server refused the API key (HTTP 401), as every row's call would be
            refused (a 403 may be a key allowed to generate but not to list models: it passes).
    """
    import openai

    try:
        served = [m.id for m in backend.client.with_options(timeout=10, max_retries=0).models.list()]
    except openai.AuthenticationError as e:
        raise BackendAuthError(f"GET {url.rstrip('/')}/models: HTTP {e.status_code} ({e})") from e
    except Exception:
        return
    from lmnb.backend.openai import serves_unlisted

    if model not in served and not serves_unlisted(backend.client, model):
        raise ValueError(f"{url} does not serve model {model!r} (it serves: {', '.join(served) or 'none'}); "
                         "pass one of those to --openai")


def _results_path(text: str) -> Path:
    # The results are JSON lines, read back to resume: `--output res.csv` wrote JSON lines into a
    # file that every CSV reader then misread.
    if not text.strip():  # (' ' was refused with "use e.g. --output ' .jsonl'"; '' was read as the folder '.')
        raise argparse.ArgumentTypeError(f"{text!r}: the results file's name is {'blank' if text else 'empty'}; "
                                         "give one, e.g. --output results.jsonl")
    path = Path(text)
    try:
        fmt = input_format(path)
    except InputError:
        fmt = None
    if fmt != "jsonl":
        # (/dev/null, /dev/stdout on a terminal: "use e.g. --output /dev/null.jsonl" it said)
        if text == "-" or path.exists() and not path.is_file() and not path.is_dir():
            raise argparse.ArgumentTypeError(
                f"{text!r}: the results go to a file, which a rerun reads back to continue a stopped run, not to "
                f"{'stdout' if text == '-' else 'a device or pipe'}; use e.g. --output results.jsonl")
        # (".jsonl" is a hidden file's name, without a suffix: "use e.g. --output .jsonl.jsonl" it said)
        name = "results" + path.name if path.name.startswith(".") else path.name
        example = path / "results.jsonl" if not path.name or path.is_dir() else path.with_name(name).with_suffix(".jsonl")
        raise argparse.ArgumentTypeError(
            f"{text!r}: the results are JSON lines (one record per row, read back to continue a stopped run), "
            f"so the file is named .jsonl; use e.g. --output {example} (convert it to CSV "
            "afterwards if needed, e.g. pandas.read_json(FILE, lines=True).to_csv(...))")
    return path


def _whole_number(text: str) -> int:
    # (argparse names the type function in its message for a ValueError: "invalid _count value")
    value = option_integer(text)  # (ASCII digits: not "1_0" or "１０", which int() reads)
    if value is None:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}{digits_fix(text)}")
    return value


def _positive_int(text: str) -> int:
    value = _whole_number(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _count(text: str) -> int:
    value = _whole_number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


# Defaults whose options read text as their type (parameter_type), and so do the rows' values of a
# row field that is such a parameter; others: a literal, else the text. (A complex or bytes
# option reads its type too, but a row's JSON has neither: a row's text for one stays the text.)
TYPED_DEFAULTS = (bool, int, float, list, tuple, set, dict)


class UnreadableValue(argparse.ArgumentTypeError):
    """Text a parameter's type cannot read (``parameter_type``). Its message is the command line's:
    what is expected, the example in quotes for the shell where it needs them, and the text as
    given; ``saying`` words it for a value that came from elsewhere (an input row's JSON value, for
    which the shell's quotes mean nothing).

    Args:
        expected: what the type takes, with an example ("expected an integer (e.g. 3, ...)").
        text: the text that was read.
        quoted: the example as the shell needs it ("'[1, 2]'"), or None where it needs no quotes.
    """

    def __init__(self, expected: str, text: str, quoted: Optional[str] = None):
        self.expected = expected
        shell = f" (in quotes for the shell: {quoted})" if quoted else ""
        super().__init__(f"{expected}{shell}, got {text!r}")

    def saying(self, shown: str) -> str:
        """The message for a value shown as ``shown`` (e.g. its JSON), without the shell's quotes."""
        return f"{self.expected}, got {shown}"


def parameter_type(default: Any) -> Callable[[str], Any]:
    """How a parameter's command-line text is read, from its default's type: bool: true/false,
    yes/no, 1/0; int: a Python integer literal (``1_000``, ``0x20``); float; complex (``1+2j``, ``3``);
    bytes: a Python bytes literal (``b'abc'``; other text was taken as a str); str; a list, tuple, set
    or dict: a Python literal or JSON of that type (``[1, 2]``, ``{"a": true}``; a list for a tuple
    or a set, as an input row's JSON gives one); None (or another default): a Python literal, else
    the text (papermill reads ``-p`` values as True, False, None, numbers, else text; a tuple
    written without its parentheses, ``1,2``, stays the text, as papermill keeps it). ``lmnb run
    -p`` reads values the same way, so a notebook and its exported job agree. A value whose integer
    is too long for Python to write in decimal (its int-to-string limit, 4300 digits by default)
    is refused: the job records its parameters as JSON and ``lmnb run`` writes them into a cell.

    The returned function raises ``UnreadableValue`` (an ``argparse.ArgumentTypeError``) for bad
    text, saying what is expected."""
    if isinstance(default, bool):
        read = _bool
    elif isinstance(default, int):
        read = _int
    elif isinstance(default, float):
        read = _float
    elif isinstance(default, complex):
        read = _complex
    elif isinstance(default, bytes):
        read = _bytes
    elif isinstance(default, str):
        return str
    elif isinstance(default, (list, tuple, set, dict)):
        read = _literal_of(type(default))
    else:
        read = _literal

    def checked(text: str) -> Any:
        value = read(text)
        try:
            repr(value)  # (a huge hexadecimal integer reads, and then failed with a traceback where written)
        except ValueError:
            raise _too_long(text) from None
        return value

    return checked


def _too_long(text: str) -> UnreadableValue:
    import sys

    return UnreadableValue(f"expected an integer of at most {sys.get_int_max_str_digits()} decimal digits (Python's "
                           "limit for writing an integer as text; PYTHONINTMAXSTRDIGITS raises it)",
                           text if len(text) <= 40 else text[:40] + "…")


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise UnreadableValue("expected true or false", text)


def _int(text: str) -> int:
    """An integer as Python writes one (``12``, ``-3``, ``1_000``, ``0x20``, ``0o17``, ``0b101``;
    ``010`` is 10, as ``int`` reads it)."""
    try:
        return int(text)
    except ValueError:
        try:
            return int(text.strip(), 0)
        except ValueError:
            if too_many_digits(text):
                raise _too_long(text) from None
            raise UnreadableValue("expected an integer (e.g. 3, 1_000 or 0x20)", text) from None


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise UnreadableValue("expected a number (e.g. 0.5, 2 or 1e-3)", text) from None


def _complex(text: str) -> complex:
    try:
        return complex(text)
    except ValueError:  # (complex() takes no spaces around the sign: "1 + 2j" is a literal)
        try:
            value = ast.literal_eval(text)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            value = None
        if isinstance(value, (int, float, complex)) and not isinstance(value, bool):
            return complex(value)
        raise UnreadableValue("expected a complex number (e.g. 1+2j, 0.5 or 3j)", text) from None


def _bytes(text: str) -> bytes:
    try:
        value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        value = None
    if not isinstance(value, bytes):
        raise UnreadableValue("expected a Python bytes literal, e.g. b'abc'", text, quoted='"b\'abc\'"')
    return value


# what each container default takes, and its example (double quotes: the shell's go round it)
_LITERAL_KINDS = {list: ("a list", "[1, 2]"), tuple: ("a tuple or a list", "(1, 2)"),
                  set: ("a set or a list", "{1, 2}"), dict: ("a dict", '{"a": 1}')}


def _literal_of(kind: type) -> Callable[[str], Any]:
    """Reads a Python literal, else JSON, of ``kind`` (list, tuple, set or dict; a list for a tuple
    or a set): other text, or a value of another type, is refused (it ran on as text: ``--tags a,b``
    set tags to the string "a,b")."""
    def read(text: str):
        value = _python_or_json(text)
        if isinstance(value, list) and kind in (tuple, set):
            try:
                value = kind(value)
            except TypeError:  # (an unhashable item for a set)
                value = None
        if not isinstance(value, kind):
            name, example = _LITERAL_KINDS[kind]
            raise UnreadableValue(f"expected {name} as a Python literal or JSON, e.g. {example}", text,
                                  quoted=f"'{example}'")
        return value

    return read


def _python_or_json(text: str) -> Any:
    """``text`` as a Python literal, else as JSON (``true``, ``null``), else None."""
    try:
        return _literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # (json.JSONDecodeError is a ValueError)
        return None


def _literal_eval(text: str) -> Any:
    """``ast.literal_eval(text)``, but JSON's reading where the two differ: a character outside the
    basic plane that JSON escapes as a surrogate pair (``json.dumps(["😀"])`` writes
    ``"\\ud83d\\ude00"``) is one character in JSON and two lone surrogates in Python, which no
    tokenizer encodes."""
    value = ast.literal_eval(text)
    if "\\u" in text and _has_surrogate(value):
        try:
            return json.loads(text)
        except (ValueError, RecursionError):  # (not JSON: the literal's own surrogates)
            pass
    return value


def _has_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return any("\ud800" <= c <= "\udfff" for c in value)
    if isinstance(value, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(_has_surrogate(x) for x in value)
    return False


def _literal(text: str) -> Any:
    """A Python literal (list, dict, number, None, ...); other text is taken as a string, and so is
    a tuple without its parentheses (``1,2``: papermill's ``-p`` keeps it as text)."""
    try:
        value = _literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        if too_many_digits(text):
            raise _too_long(text) from None
        return text
    if isinstance(value, tuple) and not _parenthesized(text):
        return text
    return value


def _parenthesized(text: str) -> bool:
    """Whether ``text``, a tuple's literal, is written inside its parentheses (``(1, 2)``, not
    ``1, 2`` or ``(1), (2)``): inside a list's brackets, it is then a single tuple item."""
    try:
        items = ast.parse(f"[{text}\n]", mode="eval").body.elts
    except (SyntaxError, AttributeError, MemoryError, RecursionError):
        return False
    return len(items) == 1 and isinstance(items[0], ast.Tuple)
