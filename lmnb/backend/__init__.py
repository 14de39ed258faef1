"""Language backends: where a program's primitives become model calls (see ``base.BaseBackend``).

``engine`` (in-process lmnb engine), ``runtime_endpoint`` (SGLang's native HTTP protocol),
``openai`` (OpenAI-compatible APIs). Each is imported only when used.
"""
