"""The ``%%lm`` cell language: prompt text with holes, translated 1:1 into an lmnb program.

The grammar and the mapping onto lmnb are in docs/CELL_LANGUAGE.md. One parse gives two faces:

>>> t = parse('Q: {question}\\nA: {gen answer max_tokens=16 stop="\\n"}')
>>> t.arguments, t.captures
(('question',), ('answer',))
>>> state = t.program().run(**t.bind({"question": "2+2?"}))   # run it (the kernel does this)
>>> print(t.to_python("qa"))                                   # write it (the exporter does this)
@lmnb.function
def qa(s, question):
    s += f"Q: {question}\\nA: "
    s += lmnb.gen("answer", max_tokens=16, stop="\\n")
<BLANKLINE>

Only Python's standard library is used here; lmnb is imported when a program is built.
"""

from lmnb.template.cell import cell_body
from lmnb.template.errors import TemplateError, TemplateRuntimeError, TemplateSyntaxError
from lmnb.template.options import MAX_FORK_BRANCHES, braced_set, branch_choices, fork_count, fork_items
from lmnb.template.parser import parse
from lmnb.template.python_cell import PythonCell, parse_python
from lmnb.template.template import Template

__all__ = [
    "MAX_FORK_BRANCHES",
    "PythonCell",
    "Template",
    "TemplateError",
    "TemplateRuntimeError",
    "TemplateSyntaxError",
    "braced_set",
    "branch_choices",
    "cell_body",
    "fork_count",
    "fork_items",
    "parse",
    "parse_python",
]
