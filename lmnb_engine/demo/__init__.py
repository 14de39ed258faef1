"""The built-in demo model's recipe: synthetic corpus, tokenizer, training script and eval.

``python -m lmnb_engine.demo.train --out DIR --seed 0`` rebuilds ``lmnb_engine/demo_model/``;
``benches/eval_demo_model.py`` measures it. See ``lmnb_engine/demo_model/README.md``.
"""
