"""Correctness gates: a HumanEval coding eval per server config and a lossless check for speculative decoding."""
