"""lmnb_engine — in-process inference runtime with RadixAttention (SGLang paper §3–4)."""
