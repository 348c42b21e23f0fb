"""Runnable training scripts written the way a user writes one with ckptkit.

* :mod:`ckptkit.examples.tiny_lm`: a tiny causal transformer LM on a synthetic corpus,
  CPU-friendly, resumable bitwise and drillable (``python -m ckptkit.examples.tiny_lm``).
"""
