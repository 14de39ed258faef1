"""Chat templates as per-role text markers, the form an SGLang program needs.

A program builds its prompt left to right (``s += user(...)``), so a role must be a *prefix* and a
*suffix* string around the message content (SGLang's ``ChatTemplate.role_prefix_and_suffix``).
``from_jinja`` derives those strings from a model's own Jinja chat template (the one
``tokenizer.apply_chat_template`` renders) by rendering conversations with marker contents and
cutting at the markers, then checks that the markers reproduce the template on test
conversations. Templates that cannot be written as fixed markers fall back to SGLang's registry
(``get_chat_template``) chosen by model name.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Callable, Optional

from lmnb.user_site import warn_at_user

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class ChatTemplate:
    """Per-role markers of a chat format.

    Attributes:
        name: registry name, or ``"model"`` when derived from the model's Jinja template.
        role_prefix_and_suffix: ``role -> (prefix, suffix)`` for the roles the format has.
        bos: text that opens a conversation (the tokenizer's BOS token when the template writes it);
            emitted before the first role of a state whose text is still empty.
        default_system_prompt: system message the template inserts when the first message is not
            a system message (e.g. Qwen2.5's), or None.
        stop_str: strings that end an assistant message; added to every unconstrained ``gen``'s stops.
        image_token: placeholder text for ``image()`` in the prompt.
        llama2_style: Llama-2's form (SGLang's ``ChatTemplateStyle.LLAMA2``): a system message that
            opens the conversation also opens the first user turn (the user prefix comes before
            the system prefix), and the user message after it gets no prefix of its own. SGLang goes
            by position alone (message 1 is merged whatever message 0 was); here message 1 is merged
            only when message 0 was that system message, as Llama-2's own template does.
    """

    name: str
    role_prefix_and_suffix: dict[str, tuple[str, str]]
    bos: str = ""
    default_system_prompt: Optional[str] = None
    stop_str: tuple[str, ...] = ()
    image_token: str = "<image>"
    llama2_style: bool = False

    def get_prefix_and_suffix(self, role: str) -> tuple[str, str]:
        """The ``(prefix, suffix)`` of ``role``.

        Raises:
            ValueError: the role is not one this template has (never silently dropped).
        """
        if role not in self.role_prefix_and_suffix:
            raise ValueError(
                f"role {role!r} is not supported by chat template {self.name!r}; "
                f"it has roles {sorted(self.role_prefix_and_suffix)}"
            )
        return self.role_prefix_and_suffix[role]

    def role_begin(
        self, role: str, n_messages: int, text_empty: bool, previous_role: Optional[str] = None
    ) -> tuple[str, Optional[dict]]:
        """Text to append when ``role`` begins after ``n_messages`` messages (the last of them of
        ``previous_role``), and the implicit system message the template inserts before a first
        non-system message (or None).

        The first message of a state whose text is empty is preceded by ``bos``.

        Raises:
            ValueError: unknown role.
        """
        prefix, _ = self.get_prefix_and_suffix(role)
        if self.llama2_style and role == "system" and n_messages == 0:
            prefix = self.get_prefix_and_suffix("user")[0] + prefix
        elif self.llama2_style and role == "user" and n_messages == 1 and previous_role == "system":
            prefix = ""
        lead, implicit = "", None
        if n_messages == 0:
            if text_empty:
                lead += self.bos
            if role != "system" and self.default_system_prompt is not None:
                sp, ss = self.get_prefix_and_suffix("system")
                lead += sp + self.default_system_prompt + ss
                implicit = {"role": "system", "content": self.default_system_prompt}
        return lead + prefix, implicit

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        """The prompt text of a whole conversation, exactly as a program would build it."""
        text = ""
        for i, m in enumerate(messages):
            begin, _ = self.role_begin(m["role"], i, not text, messages[i - 1]["role"] if i else None)
            text += begin + m["content"] + self.get_prefix_and_suffix(m["role"])[1]
        if add_generation_prompt:
            last = messages[-1]["role"] if messages else None
            text += self.role_begin("assistant", len(messages), not text, last)[0]
        return text


_REGISTRY: dict[str, ChatTemplate] = {}


def register_chat_template(template: ChatTemplate) -> None:
    """Add ``template`` to the registry under ``template.name``."""
    _REGISTRY[template.name] = template


def get_chat_template(name: str) -> ChatTemplate:
    """A registered template by name.

    Raises:
        ValueError: unknown name (the message lists the known ones and offers the closest,
            ``chatlm`` → ``chatml``).
        TypeError: a name that is no string (it failed in the closest-name search).
    """
    if not isinstance(name, str):
        from lmnb_engine.params import shown_number  # torch-free (an int of 5000 digits has no repr)

        raise TypeError(f"a chat template name must be a string, one of {sorted(_REGISTRY)}; got {shown_number(name)} "
                        f"({type(name).__name__})")
    if name not in _REGISTRY:
        from lmnb.ir import did_you_mean  # (lmnb_engine.suggest's, loaded only here)

        raise ValueError(f"unknown chat template {name!r}; known: {sorted(_REGISTRY)}"
                         + did_you_mean([name], ("", _REGISTRY)))
    return _REGISTRY[name]


def get_chat_template_by_model_path(model_path: str) -> ChatTemplate:
    """The registry template for a model name or path; ``default`` when nothing matches.

    SGLang's matchers, in SGLang's order, for the templates registered here, with five
    differences: any Qwen checkpoint but a LLaVA one gets ``qwen`` (base checkpoints ship the same
    template; Qwen-VL's text markers are ``qwen``'s), ``llama3`` counts as ``llama-3``, Gemma needs
    ``-it`` (SGLang's bare ``it`` also matches ``gemma-2b`` under a path such as ``/git/``),
    ``chatml``/``hermes`` get ``chatml``, and a path is matched by the model's own folder, its last
    component (SGLang matches the whole path: a base model in a folder under one named
    ``instruct`` or ``chat``, ``/work/instruct/Mistral-7B-v0.1``, got an instruct model's
    template), or the one above a trainer's ``checkpoint-N`` or a Hugging Face cache's
    ``models--org--name/snapshots/HASH``, which are named for no model.
    """
    parts = [p for p in (model_path or "").lower().replace("\\", "/").split("/") if p]
    while len(parts) > 1 and (re.fullmatch(r"checkpoint-\d+", parts[-1]) or parts[-2] == "snapshots"):
        parts = parts[:-2] if parts[-2] == "snapshots" else parts[:-1]
    return get_chat_template(_template_name(parts[-1] if parts else ""))


def _template_name(p: str) -> str:
    """The registry name SGLang's matchers give ``p`` (a lower-cased model name)."""
    if ("deepseek-v3" in p or "deepseek-r1" in p) and "base" not in p:
        return "deepseek-v3"
    if "dbrx" in p and "instruct" in p:
        return "dbrx-instruct"
    if any(k in p for k in ("vicuna", "llava-v1.5", "llava-next-video-7b")):
        return "vicuna_v1.1"
    if ("llama-2" in p and "chat" in p) or (any(k in p for k in ("mistral", "mixtral", "codellama")) and "instruct" in p):
        return "llama-2-chat"
    if ("llama-3" in p or "llama3" in p) and "instruct" in p:
        return "llama-3-instruct"
    if "tinyllama" in p:
        return "chatml"
    if "qwen" in p and "llava" not in p:
        return "qwen"
    if any(k in p for k in ("llava-v1.6-34b", "llava-v1.6-yi-34b", "llava-next-video-34b", "llava-onevision-qwen2")):
        return "chatml-llava"
    if "yi-1.5" in p and "chat" in p:
        return "yi-1.5"
    if "gemma" in p and "-it" in p:
        return "gemma-it"
    if "c4ai-command-r" in p:
        return "c4ai-command-r"
    if "granite" in p and "instruct" in p:
        return "granite-3-instruct"
    if "gemma-3" in p and "1b" not in p:
        return "gemma-it"
    if "chatml" in p or "hermes" in p:
        return "chatml"
    return "default"


# SGLang's registry (sglang/lang/chat_template.py), role markers and stop strings as there. Left
# out: templates of vision models lmnb runs no images for (qwen2-vl, yi-vl, minicpmv, minicpmo,
# janus-pro). gemma-it differs on purpose: no system role (Gemma's own template refuses one; SGLang
# writes its text bare) and <end_of_turn> as a stop string.
register_chat_template(
    ChatTemplate(  # SGLang's "default": plain role labels
        name="default",
        role_prefix_and_suffix={"system": ("SYSTEM:", "\n"), "user": ("USER:", "\n"), "assistant": ("ASSISTANT:", "\n")},
    )
)
register_chat_template(
    ChatTemplate(  # Anthropic's old completion format (system text goes bare before the first turn)
        name="claude",
        role_prefix_and_suffix={"system": ("", ""), "user": ("\n\nHuman: ", ""), "assistant": ("\n\nAssistant:", "")},
    )
)
_CHATML = {r: (f"<|im_start|>{r}\n", "<|im_end|>\n") for r in ROLES}
register_chat_template(ChatTemplate(name="chatml", role_prefix_and_suffix=_CHATML, stop_str=("<|im_end|>",)))
register_chat_template(
    ChatTemplate(  # LLaVA-NeXT 34B / OneVision: the image on a line of its own
        name="chatml-llava",
        role_prefix_and_suffix=_CHATML,
        default_system_prompt="You are a helpful assistant.",
        stop_str=("<|im_end|>",),
        image_token="<image>\n",
    )
)
register_chat_template(
    ChatTemplate(
        name="qwen",
        role_prefix_and_suffix=_CHATML,
        default_system_prompt="You are a helpful assistant.",
        stop_str=("<|im_end|>",),
    )
)
register_chat_template(
    ChatTemplate(  # FastChat's Vicuna v1.1, also LLaVA-1.5's
        name="vicuna_v1.1",
        role_prefix_and_suffix={"system": ("", " "), "user": ("USER:", " "), "assistant": ("ASSISTANT:", "</s>")},
        default_system_prompt=(
            "A chat between a curious user and an artificial intelligence assistant. "
            "The assistant gives helpful, detailed, and polite answers to the user's questions."
        ),
        image_token=" <image>\n",
    )
)
register_chat_template(
    ChatTemplate(  # Llama-2 chat, also Mistral/Mixtral/CodeLlama instruct: [INST] <<SYS>> ... <</SYS>> ... [/INST]
        name="llama-2-chat",
        role_prefix_and_suffix={
            "system": ("<<SYS>>\n", "\n<</SYS>>\n\n"),
            "user": ("[INST] ", " [/INST]"),
            "assistant": ("", " </s><s>"),
        },
        llama2_style=True,
    )
)
_LLAMA3 = {r: (f"<|start_header_id|>{r}<|end_header_id|>\n\n", "<|eot_id|>") for r in ROLES}
register_chat_template(ChatTemplate(name="llama-3-instruct", role_prefix_and_suffix=_LLAMA3, stop_str=("<|eot_id|>",)))
register_chat_template(
    ChatTemplate(  # LLaVA-NeXT on Llama-3: the image on a line of its own
        name="llama-3-instruct-llava", role_prefix_and_suffix=_LLAMA3, stop_str=("<|eot_id|>",), image_token="<image>\n"
    )
)
register_chat_template(
    ChatTemplate(
        name="llama-4",
        role_prefix_and_suffix={r: (f"<|header_start|>{r}<|header_end|>\n\n", "<|eot|>") for r in ROLES},
        stop_str=("<|eot|>",),
        image_token="<|image|>",
    )
)
register_chat_template(
    ChatTemplate(  # the user suffix opens the assistant turn, so the assistant prefix is empty
        name="yi-1.5",
        role_prefix_and_suffix={
            "system": ("", ""),
            "user": ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"),
            "assistant": ("", "<|im_end|>\n"),
        },
        stop_str=("<|im_end|>",),
    )
)
register_chat_template(
    ChatTemplate(  # Gemma has no system role; its assistant is called "model"
        name="gemma-it",
        role_prefix_and_suffix={
            "user": ("<start_of_turn>user\n", "<end_of_turn>\n"),
            "assistant": ("<start_of_turn>model\n", "<end_of_turn>\n"),
        },
        stop_str=("<end_of_turn>",),
    )
)
register_chat_template(
    ChatTemplate(  # DBRX: turns separated by a newline before each <|im_start|>, none after the last.
        # SGLang's also writes DBRX's default system prompt, a page of Databricks' prose, when a program
        # starts without a system message; here a program gives its own.
        name="dbrx-instruct",
        role_prefix_and_suffix={
            "system": ("<|im_start|>system\n", "<|im_end|>"),
            "user": ("\n<|im_start|>user\n", "<|im_end|>"),
            "assistant": ("\n<|im_start|>assistant\n", "<|im_end|>"),
        },
        stop_str=("<|im_end|>",),
    )
)
register_chat_template(
    ChatTemplate(
        name="c4ai-command-r",
        role_prefix_and_suffix={
            "system": ("<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>", "<|END_OF_TURN_TOKEN|>"),
            "user": ("<|START_OF_TURN_TOKEN|><|USER_TOKEN|>", "<|END_OF_TURN_TOKEN|>"),
            "assistant": ("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>"),
        },
    )
)
register_chat_template(
    ChatTemplate(
        name="granite-3-instruct",
        role_prefix_and_suffix={r: (f"<|start_of_role|>{r}<|end_of_role|>", "<|end_of_text|>") for r in ROLES},
        stop_str=("<|end_of_text|>",),
    )
)
_DEEPSEEK_EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"  # full-width bars, U+2581 for spaces
register_chat_template(
    ChatTemplate(  # DeepSeek-V3/R1: system text bare at the start, its own markers
        name="deepseek-v3",
        role_prefix_and_suffix={
            "system": ("", ""),
            "user": ("<\uff5cUser\uff5c>", ""),
            "assistant": ("<\uff5cAssistant\uff5c>", _DEEPSEEK_EOS),
        },
        stop_str=(_DEEPSEEK_EOS,),
    )
)


# ---------------------------------------------------------------- deriving from a Jinja template

Renderer = Callable[[list[dict], bool], str]


def jinja_renderer(template: str, special_tokens: Optional[dict[str, str]] = None) -> Renderer:
    """A function rendering ``template`` like ``transformers``' ``apply_chat_template(tokenize=False)``:
    sandboxed Jinja with ``trim_blocks``/``lstrip_blocks``, ``loopcontrols``, ``raise_exception``,
    ``strftime_now`` and a ``tojson`` that keeps non-ASCII text; ``special_tokens`` (e.g.
    ``{"bos_token": "<s>"}``) are template variables.

    Raises:
        ValueError: the template does not compile.
    """
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        compiled = env.from_string(template)
    except TemplateError as e:
        raise ValueError(f"the chat template does not compile: {e}") from None
    tokens = dict(special_tokens or {})

    def render(messages: list[dict], add_generation_prompt: bool) -> str:
        return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt, **tokens)

    return render


# Marker contents: no whitespace (templates often apply `| trim`), nothing a template would write.
_MARK = "@LMNB{}@"


def _split(text: str, n: int) -> list[str]:
    """Cut ``text`` at markers 0..n-1, returning the n+1 segments between them."""
    segs = []
    for i in range(n):
        before, sep, text = text.partition(_MARK.format(i))
        if not sep:
            raise ValueError(f"marker {i} missing from the rendered template")
        segs.append(before)
    segs.append(text)
    return segs


def _conv(roles: list[str]) -> list[dict]:
    return [{"role": r, "content": _MARK.format(i)} for i, r in enumerate(roles)]


def _strip_prefix(text: str, prefix: str, what: str) -> str:
    if not text.startswith(prefix):
        raise ValueError(f"cannot separate {what}: {text!r} does not start with {prefix!r}")
    return text[len(prefix):]


def _strip_suffix(text: str, suffix: str, what: str) -> str:
    if suffix and not text.endswith(suffix):
        raise ValueError(f"cannot separate {what}: {text!r} does not end with {suffix!r}")
    return text[: len(text) - len(suffix)] if suffix else text


def derive_chat_template(render: Renderer, bos_token: str = "", with_system: bool = True) -> ChatTemplate:
    """Per-role markers of the template behind ``render``.

    Renders ``[system?, user, assistant, user, assistant]`` with marker contents: the text after
    the last assistant message is the assistant suffix, the text between the second assistant and
    user messages is assistant suffix + user prefix, and so on; the generation prompt (the text
    ``add_generation_prompt`` adds) is the assistant prefix. The result is then checked by
    re-rendering other conversations.

    Raises:
        ValueError: the template cannot be written as fixed per-role markers (the message says
            which part differs).
        jinja2.TemplateError: the template refused the conversation (e.g. no system role).
    """
    head = ["system"] if with_system else []
    roles = head + ["user", "assistant", "user", "assistant"]
    segs = _split(render(_conv(roles), False), len(roles))
    k = len(head)
    asst_suffix = segs[-1]
    user_prefix = _strip_prefix(segs[k + 2], asst_suffix, "the user prefix")
    user_only = _split(render(_conv(roles[:-1]), False), len(roles) - 1)
    user_suffix = user_only[-1]
    gen_prompt = _strip_prefix(render(_conv(roles[:-1]), True), render(_conv(roles[:-1]), False), "the generation prompt")
    asst_prefix = _strip_prefix(segs[k + 3], user_suffix, "the assistant prefix")
    if gen_prompt and gen_prompt != asst_prefix:
        raise ValueError(f"the generation prompt {gen_prompt!r} differs from the assistant prefix {asst_prefix!r}")
    markers = {"user": (user_prefix, user_suffix), "assistant": (asst_prefix, asst_suffix)}
    start = segs[0]
    if with_system:
        sys_suffix = _strip_suffix(segs[1], user_prefix, "the system suffix")
        bos = bos_token if bos_token and start.startswith(bos_token) else ""
        markers["system"] = (start[len(bos):], sys_suffix)
    else:
        start = _strip_suffix(start, user_prefix, "the conversation start")
        bos = bos_token if bos_token and start == bos_token else ""
        if start != bos:
            raise ValueError(f"unexpected text {start!r} before the first user message")

    # What the template writes before a conversation that starts with a user message.
    lone = _strip_suffix(_split(render(_conv(["user"]), False), 1)[0], user_prefix, "the first user message")
    lone = _strip_prefix(lone, bos, "the BOS token")
    default_system = None
    if lone:
        if not with_system:
            raise ValueError(f"unexpected text {lone!r} before the first user message")
        sp, ss = markers["system"]
        default_system = _strip_suffix(_strip_prefix(lone, sp, "the default system message"), ss, "the default system message")

    stop = asst_suffix.strip()
    tmpl = ChatTemplate(
        name="model",
        role_prefix_and_suffix=markers,
        bos=bos,
        default_system_prompt=default_system,
        stop_str=(stop,) if stop else (),
    )
    _check(tmpl, render, with_system)
    return tmpl


def _check(tmpl: ChatTemplate, render: Renderer, with_system: bool) -> None:
    """Raise ValueError unless ``tmpl`` reproduces ``render`` on sample conversations."""
    samples = [["user"], ["user", "assistant"], ["user", "assistant", "user"]]
    if with_system:
        samples += [["system", "user"], ["system", "user", "assistant", "user", "assistant"]]
    for roles in samples:
        for gen in (False, True) if roles[-1] == "user" else (False,):
            msgs = [{"role": r, "content": f"text {i}"} for i, r in enumerate(roles)]
            want, got = render(msgs, gen), tmpl.render(msgs, gen)
            if want != got:
                raise ValueError(f"markers do not reproduce the template for roles {roles}: {got!r} != {want!r}")


def from_jinja(
    template: Optional[str],
    special_tokens: Optional[dict[str, str]] = None,
    model_path: str = "",
) -> ChatTemplate:
    """The ``ChatTemplate`` of a model from its Jinja chat template and special tokens.

    Tries the template with a system role, then without one; if neither can be written as fixed
    markers (or there is no template), warns and returns ``get_chat_template_by_model_path``.
    """
    if not template:
        return get_chat_template_by_model_path(model_path)
    from jinja2 import TemplateError

    tokens = special_tokens or {}
    reasons = []
    try:
        render = jinja_renderer(template, tokens)
        for with_system in (True, False):
            try:
                return derive_chat_template(render, tokens.get("bos_token", ""), with_system)
            except (ValueError, TemplateError) as e:
                reasons.append(str(e))
    except ValueError as e:
        reasons.append(str(e))
    fallback = get_chat_template_by_model_path(model_path)
    warn_at_user(  # (at the user's line: the .run(...) or the backend call that asked for the template)
        f"the chat template of {model_path or 'the model'} cannot be used as per-role markers "
        f"({reasons[-1]}); using the {fallback.name!r} template instead"
    )
    return fallback


