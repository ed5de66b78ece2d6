"""The builtin offline agent: deterministic decomposition and Triton kernel templates, no LLM."""
