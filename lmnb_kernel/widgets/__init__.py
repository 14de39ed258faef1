"""Live views of ``%%lm`` runs and of the radix tree, with static fallbacks for saved notebooks.

- ``RunView`` (``view.py``): one per cell run — token stream with generated spans and per-token
  tooltips, fork lanes side by side with the join, the prompt's cached vs computed spans with the
  cell's and the session's hit rate, structured output checked against its schema / regex with
  jump-forward savings, select scores as bars; a Stop button. Fed by a small event API
  (``on_fork``/``on_text``/``on_prompt``/``on_delta``/``on_gen_end``/``on_select``/``on_join``/
  ``tick``/``finish``), updated at most 20 times a second from the cell's main thread.
- ``TreeView`` (``tree_view.py``): the radix tree for ``%lm tree`` — token counts, previews, which
  named state / cell each path belongs to, lock refs, pins, LRU age, evictable bytes, evicted nodes
  faded — refreshed in place after each cell.

When a run finishes its output (same display_id) becomes a static bundle: sanitizer-safe
``text/html`` (inline styles, no scripts), ``text/plain``, and ``application/vnd.lmnb.view+json``
with the data (lanes' text, requests, selects, structured checks, cache counts; a gen's per-token
ids and logprobs are in the HTML alone, as its tooltips), so nbconvert HTML, GitHub and a notebook
reopened without a kernel show the result. Output that is captured (``%%capture``) gets no widget.

Why anywidget (not ipywidgets' built-in ``HTML`` widget): a built-in widget resends its whole value
on every change, so a lane of n tokens costs O(n²) bytes and four fork lanes at 20 frames a second
approach jupyter_server's IOPub limits; anywidget's custom messages let the view append only the new
tokens to the right lane (``live.js``, about 100 lines, no build step) and carry the Stop click back.
anywidget ships a prebuilt JupyterLab extension with its pip package and renders in JupyterLab,
Notebook 7, VS Code and Colab; it sits on ipywidgets 8's comm protocol.
"""

from .model import RunModel, Tally
from .tree_view import TreeView, kv_bytes_per_token
from .view import SESSION, VIEW_MIME, RunView, prefix_chars_from

__all__ = ["RunView", "TreeView", "RunModel", "Tally", "SESSION", "VIEW_MIME", "kv_bytes_per_token",
           "prefix_chars_from"]
